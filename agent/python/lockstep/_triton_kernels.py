"""The Triton kernels of lockstep/_triton_stats.py (imported only where triton imports:
module-level @triton.jit functions, so that Triton resolves `tl` and `mix32` as globals).
See _triton_stats.py for what they compute and docs/statistics.md for the definitions."""
import triton
import triton.language as tl


@triton.jit
def mix32(v):  # int64 in [0, 2^32): docs/statistics.md's mix32, products < 2^63
    v = v ^ (v >> 16)
    v = v * 0x045D9F3B
    v = v - ((v >> 32) << 32)
    v = v ^ (v >> 16)
    v = v * 0x045D9F3B
    v = v - ((v >> 32) << 32)
    return v ^ (v >> 16)


@triton.jit
def widen(raw, FMT: tl.constexpr):
    """float32 values of loaded elements, exact. FMT 0: fp32 or fp16 (a plain conversion);
    1: bf16 read as int16, 2: fp8 e4m3fn and 3: fp8 e5m2 read as uint8, decoded from
    their bits (NaN, Inf and subnormals included). Decoding bf16 and fp8 by hand keeps
    the kernel off the fp8 conversion instructions (absent before sm_89) and gives the
    same values in Triton's interpreter, whose bf16/fp8 conversion loses subnormals and
    reads fp8 NaN/Inf codes as numbers (docs/statistics.md, "Under Triton's interpreter")."""
    if FMT == 0:
        x = raw.to(tl.float32)
    elif FMT == 1:
        x = (raw.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    elif FMT == 2:  # e4m3fn: bias 7, 3 mantissa bits, no Inf, NaN = S.1111.111
        u = raw.to(tl.int32) & 0xFF
        e = (u >> 3) & 0xF
        m = u & 0x7
        mag = tl.where(e > 0, (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True),
                       m.to(tl.float32) * 0.001953125)  # subnormal: m * 2^-9
        mag = tl.where((u & 0x7F) == 0x7F, float("nan"), mag)
        x = tl.where(u >= 128, -mag, mag)
    else:  # e5m2: bias 15, 2 mantissa bits, exponent 31 = Inf (m = 0) or NaN
        u = raw.to(tl.int32) & 0xFF
        e = (u >> 2) & 0x1F
        m = u & 0x3
        mag = tl.where(e > 0, (((e + 112) << 23) | (m << 21)).to(tl.float32, bitcast=True),
                       m.to(tl.float32) * 0.0000152587890625)  # subnormal: m * 2^-16
        mag = tl.where(e == 31, tl.where(m == 0, float("inf"), float("nan")), mag)
        x = tl.where(u >= 128, -mag, mag)
    return x


@triton.jit
def tile_kernel(base, tab, tiles, part, pat, SAT, MINN,
                K: tl.constexpr, KL: tl.constexpr, KP: tl.constexpr, NB: tl.constexpr,
                ITERS: tl.constexpr, PW: tl.constexpr, SKETCH: tl.constexpr,
                USE_HIST: tl.constexpr, FMT: tl.constexpr):
    pid = tl.program_id(0)
    g = tl.load(tiles + pid)                # tensor of this tile (int64)
    off = tl.load(tab + g * 4)              # its element offset from `base`
    n = tl.load(tab + g * 4 + 1)            # its numel
    first = tl.load(tab + g * 4 + 2)        # its first tile
    BLOCK = NB * KL                         # constexpr: elements per iteration
    TILE = BLOCK * ITERS                    # constexpr: elements per tile
    start = (pid - first) * TILE            # int64: tensors over 2^31 elements
    rem = tl.minimum(n - start, TILE).to(tl.int32)
    ptr = base + off + start                # elements past it: int32 offsets
    j = tl.arange(0, KP)[None, :]           # lane = bucket
    bl = tl.arange(0, NB)[:, None]          # block within the iteration
    c32 = tl.arange(0, 32)
    tn = tl.zeros([], tl.float64)           # finite count, sum, M2, sum of squares
    ts = tl.zeros([], tl.float64)
    tm2 = tl.zeros([], tl.float64)
    tq = tl.zeros([], tl.float64)
    tmn = tl.full([], float("inf"), tl.float32)
    tmx = tl.full([], float("-inf"), tl.float32)
    tsat = tl.zeros([], tl.int32)
    tsub = tl.zeros([], tl.int32)
    tcls = tl.zeros([32], tl.int32)
    tsk = tl.zeros([KP], tl.float64)
    for it in range(0, tl.cdiv(rem, BLOCK)):
        blk = it * NB + bl                  # [NB, 1] int32
        if SKETCH:
            b = start // K + blk            # global block index, int64
            lo = b - ((b >> 32) << 32)
            h1 = mix32(lo ^ 0x1B873593 ^ mix32(b >> 32))
            r = ((h1 * K) >> 32).to(tl.int32)
            h2 = mix32(h1 ^ 0x6A09E667)
            p = (h2 >> 24).to(tl.int32)
            flip = ((h2 >> 23) & 1).to(tl.int32)
            o = j - r
            o = tl.where(o < 0, o + K, o)   # lane j holds block offset (j - r) mod K
        else:
            o = j + bl * 0
        idx = blk * KL + o
        valid = (j < KL) & (idx < rem)
        x = widen(tl.load(ptr + idx, mask=valid, other=0), FMT)
        isnan = x != x
        ax = tl.abs(x)
        isinf = ax == float("inf")
        fin = valid & (x == x) & (ax != float("inf"))
        x0 = tl.where(fin, x, 0.0)
        # classes: log2 bin of |x| from the exponent bits, NaN, Inf; 31 = not an element
        e = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        hb = tl.minimum(tl.maximum(2 + ((e + 40) >> 2), 1), 15)
        hb = tl.where(x == 0.0, 0, hb)
        cls = tl.where(isnan, 16, tl.where(isinf, 17, hb))
        cls = tl.where(valid, cls, 31)
        if USE_HIST:
            h = tl.histogram(tl.reshape(cls, [NB * KP], can_reorder=True), 32)
        else:
            h = tl.zeros([32], tl.int32)
            for c in tl.static_range(18):
                cnt = tl.sum(tl.sum((cls == c).to(tl.int32), axis=1), axis=0)
                h = tl.where(c32 == c, cnt, h)
        tcls += h
        nb = tl.sum(tl.where(c32 < 16, h, 0), axis=0).to(tl.float64)
        tsat += tl.sum(tl.sum((fin & (ax >= SAT)).to(tl.int32), axis=1), axis=0)
        tsub += tl.sum(tl.sum((fin & (x != 0.0) & (ax < MINN)).to(tl.int32), axis=1),
                       axis=0)
        mn = tl.min(tl.min(tl.where(fin, x, float("inf")), axis=1), axis=0)
        mx = tl.max(tl.max(tl.where(fin, x, float("-inf")), axis=1), axis=0)
        tmn = tl.minimum(tmn, mn)
        tmx = tl.maximum(tmx, mx)
        # moments, after scaling the block by a power of two s (exact) so that
        # |x s| < 2: float32 sums of rows of K lanes, float64 across rows, unscaled
        bmax = tl.maximum(-mn, mx)
        bmax = tl.where(bmax > 0.0, bmax, 1.0)
        eb = ((bmax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        kk = tl.minimum(tl.maximum(eb + 1, -126), 126)
        s = ((127 - kk) << 23).to(tl.float32, bitcast=True)        # 2^-kk, normal
        inv = ((1023 + kk).to(tl.int64) << 52).to(tl.float64, bitcast=True)  # 2^kk
        xs = x0 * s
        sx = tl.sum(tl.sum(xs, axis=1).to(tl.float64), axis=0) * inv
        m32 = (sx / tl.maximum(nb, 1.0)).to(tl.float32)  # a first mean, in float32
        d = tl.where(fin, xs - m32 * s, 0.0)
        d1 = tl.sum(tl.sum(d, axis=1).to(tl.float64), axis=0) * inv
        d2 = tl.sum(tl.sum(d * d, axis=1).to(tl.float64), axis=0) * (inv * inv)
        qb = tl.sum(tl.sum(xs * xs, axis=1).to(tl.float64), axis=0) * (inv * inv)
        # corrected two-pass: the block's sum and mean from m32 and the small deviations
        # (a float32 row sum of large values is off by ~1e-7 of them; d's sums are not)
        sb = m32.to(tl.float64) * nb + d1
        mb = sb / tl.maximum(nb, 1.0)
        m2b = tl.maximum(d2 - d1 * d1 / tl.maximum(nb, 1.0), 0.0)
        # Chan: merge the block's (n, sum, M2) into the tile's
        delta = mb - ts / tl.maximum(tn, 1.0)
        w = tl.where((tn > 0) & (nb > 0), tn * nb / tl.maximum(tn + nb, 1.0), 0.0)
        tm2 = tm2 + m2b + delta * delta * w
        ts = ts + sb
        tn = tn + nb
        tq = tq + qb
        if SKETCH:
            if KP <= 32:
                word = tl.load(pat + p * 8)                   # [NB, 1]: bits 0..31
                bit = (word >> o) & 1
            else:
                word = tl.load(pat + p * 8 + (o >> 5))        # [NB, KP]
                bit = (word >> (o & 31)) & 1
            neg = (bit ^ flip) != 0
            tsk += tl.sum(tl.where(neg, -xs, xs), axis=0).to(tl.float64) * inv
    row = part + pid.to(tl.int64) * PW
    tl.store(row + 0, ts)
    tl.store(row + 1, tm2)
    tl.store(row + 2, tq)
    tl.store(row + 3, tmn.to(tl.float64))
    tl.store(row + 4, tmx.to(tl.float64))
    tl.store(row + 5, tsat.to(tl.float64))
    tl.store(row + 6, tsub.to(tl.float64))
    tl.store(row + 7, tn)
    tl.store(row + 8 + c32, tcls.to(tl.float64))
    if SKETCH:
        tl.store(row + 40 + tl.arange(0, KP), tsk)

@triton.jit
def finish_kernel(part, tab, out, CODE,
                  K: tl.constexpr, KP: tl.constexpr, BINS: tl.constexpr,
                  PW: tl.constexpr, W: tl.constexpr, TC: tl.constexpr,
                  SKETCH: tl.constexpr):
    g = tl.program_id(0)
    n = tl.load(tab + g * 4 + 1)
    first = tl.load(tab + g * 4 + 2)
    nt = tl.load(tab + g * 4 + 3).to(tl.int32)
    c32 = tl.arange(0, 32)
    ck = tl.arange(0, KP)
    tr = tl.arange(0, TC)
    big_n = tl.zeros([], tl.float64)
    s = tl.zeros([], tl.float64)
    q = tl.zeros([], tl.float64)
    sat = tl.zeros([], tl.float64)
    sub = tl.zeros([], tl.float64)
    mn = tl.full([], float("inf"), tl.float64)
    mx = tl.full([], float("-inf"), tl.float64)
    cls = tl.zeros([32], tl.float64)
    sk = tl.zeros([KP], tl.float64)
    for c in range(0, nt, TC):
        m = (c + tr) < nt
        rows = part + (first + c + tr).to(tl.int64) * PW
        s += tl.sum(tl.load(rows + 0, mask=m, other=0.0), axis=0)
        q += tl.sum(tl.load(rows + 2, mask=m, other=0.0), axis=0)
        mn = tl.minimum(mn, tl.min(tl.load(rows + 3, mask=m, other=float("inf")), axis=0))
        mx = tl.maximum(mx, tl.max(tl.load(rows + 4, mask=m, other=float("-inf")),
                                   axis=0))
        sat += tl.sum(tl.load(rows + 5, mask=m, other=0.0), axis=0)
        sub += tl.sum(tl.load(rows + 6, mask=m, other=0.0), axis=0)
        big_n += tl.sum(tl.load(rows + 7, mask=m, other=0.0), axis=0)
        cls += tl.sum(tl.load(rows[:, None] + 8 + c32[None, :], mask=m[:, None],
                              other=0.0), axis=0)
        if SKETCH:
            sk += tl.sum(tl.load(rows[:, None] + 40 + ck[None, :], mask=m[:, None],
                                 other=0.0), axis=0)
    has = big_n > 0
    mean = s / tl.maximum(big_n, 1.0)
    m2 = tl.zeros([], tl.float64)
    for c in range(0, nt, TC):  # Chan: the tiles' M2 and their means' spread
        m = (c + tr) < nt
        rows = part + (first + c + tr).to(tl.int64) * PW
        n_t = tl.load(rows + 7, mask=m, other=0.0)
        s_t = tl.load(rows + 0, mask=m, other=0.0)
        dm = s_t / tl.maximum(n_t, 1.0) - mean
        m2 += tl.sum(tl.load(rows + 1, mask=m, other=0.0)
                     + tl.where(n_t > 0, n_t * dm * dm, 0.0), axis=0)
    nan = float("nan")
    o = out + g.to(tl.int64) * W
    tl.store(o + 0, n.to(tl.float64))
    tl.store(o + 1, tl.where(has, mn, nan))
    tl.store(o + 2, tl.where(has, mx, nan))
    tl.store(o + 3, tl.where(has, mean, nan))
    tl.store(o + 4, tl.where(has, tl.sqrt(tl.maximum(m2, 0.0) / tl.maximum(big_n, 1.0)),
                             nan))
    tl.store(o + 5, tl.where(has, tl.sqrt(q), nan))
    tl.store(o + 6, tl.where(has, tl.maximum(-mn, mx), nan))
    tl.store(o + 7, tl.sum(tl.where(c32 == 16, cls, 0.0), axis=0))
    tl.store(o + 8, tl.sum(tl.where(c32 == 17, cls, 0.0), axis=0))
    tl.store(o + 9, tl.sum(tl.where(c32 == 0, cls, 0.0), axis=0))
    tl.store(o + 10, sat)
    tl.store(o + 11, sub)
    # (CODE is a Python float: compiled, an fp32 scalar; in Triton's interpreter a plain
    # float, which has no .to(); the sum is an fp64 scalar in both, exact for a code)
    tl.store(o + 12, tl.zeros([], tl.float64) + CODE)
    if SKETCH:  # float32 on the wire: rounded here, as the torch path does
        tl.store(o + 13 + ck, sk.to(tl.float32).to(tl.float64), mask=ck < K)
    if BINS:
        tl.store(o + 13 + K + c32, cls, mask=c32 < 16)
