"""The Triton kernels of lockstep/_triton_stats.py (imported only where triton imports:
module-level @triton.jit functions, so that Triton resolves `tl` and `mix32` as globals).
See _triton_stats.py for what they compute and docs/statistics.md for the definitions."""
import triton
import triton.language as tl


@triton.jit
def mix32(v):  # uint32: docs/statistics.md's mix32, its products mod 2^32 by wrapping
    v = v ^ (v >> 16)
    v = v * 0x045D9F3B
    v = v ^ (v >> 16)
    v = v * 0x045D9F3B
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
def load_wide(ptrs, mask, FMT: tl.constexpr):
    """widen() of the elements at `ptrs`; NaN where `mask` is off (the tile kernel counts
    those lanes as NaN and takes them off the NaN count at the end)."""
    if FMT == 0:
        raw = tl.load(ptrs, mask=mask, other=float("nan"))
    elif FMT == 1:
        raw = tl.load(ptrs, mask=mask, other=0x7FC0)   # a bf16 NaN, loaded as int16
    else:
        raw = tl.load(ptrs, mask=mask, other=0x7F)     # NaN in e4m3fn and in e5m2
    return widen(raw, FMT)


@triton.jit
def lanes(lo0, mh0, mh1, blk, j, K: tl.constexpr, SKETCH: tl.constexpr):
    """(o, p, flip) of sketch blocks lo0 + blk of a tile (lo0: the low 32 bits of the
    tile's first global block index; mh0, mh1: mix32 of its high 32 bits and of that
    plus one, for the blocks past a 2^32 boundary): lane j reads block offset
    o = (j - r(b)) mod K, so lane j is bucket j; p is the block's sign pattern and flip
    its sign bit (docs/statistics.md), in 32-bit arithmetic. Without a sketch, lane j
    reads offset j."""
    if SKETCH:
        lo = lo0 + blk.to(tl.uint32)        # wraps past a 2^32 boundary
        h1 = mix32(lo ^ 0x1B873593 ^ tl.where(lo < lo0, mh1, mh0))
        r = ((h1.to(tl.uint64) * K) >> 32).to(tl.int32)
        h2 = mix32(h1 ^ 0x6A09E667)
        p = (h2 >> 24).to(tl.int32)
        flip = ((h2 >> 23) & 1).to(tl.int32)
        o = j - r
        o = tl.where(o < 0, o + K, o)
    else:
        o = j + blk * 0
        p = blk * 0
        flip = blk * 0
    return o, p, flip


@triton.jit
def load_block(ptr, rem, lo0, mh0, mh1, blk, j, K: tl.constexpr, KL: tl.constexpr,
               SKETCH: tl.constexpr, FMT: tl.constexpr):
    """The elements of sketch blocks `blk` ([NB, 1]) of a tile, lane j holding bucket j,
    NaN past the tile's `rem` elements and in the padding lanes; with (o, p, flip)."""
    o, p, flip = lanes(lo0, mh0, mh1, blk, j, K, SKETCH)
    idx = blk * KL + o
    x = load_wide(ptr + idx, (j < KL) & (idx < rem), FMT)
    return x, o, p, flip


@triton.jit
def accumulate(x, o, p, flip, pat, c, SAT, MINN, vmin, vmax, lo, hi, w4, s1, s2, sk,
               KP: tl.constexpr, SKETCH: tl.constexpr):
    """One block of elements into the per-slot accumulators (see tile_kernel)."""
    ex = (x.to(tl.int32, bitcast=True) >> 23) & 0xFF
    fin = ex != 255
    xs = tl.where(fin, x, 0.0)
    ax = tl.abs(xs)
    vmin = tl.minimum(vmin, tl.where(fin, x, float("inf")))
    vmax = tl.maximum(vmax, tl.where(fin, x, float("-inf")))
    # the log2 bin of |x| from its exponent bits (0: zero; 1: subnormal or tiny), one
    # 4-bit field of lo (bins 0..7) or hi (8..15)
    hb = tl.minimum(tl.maximum(((ex - 87) >> 2) + 2, 1), 15)
    hb = tl.where(ax == 0.0, 0, hb)
    one = 1 << ((hb & 7) << 2)
    lo += tl.where(fin & (hb < 8), one, 0)
    hi += tl.where(fin & (hb >= 8), one, 0)
    w4 += tl.where(fin, 0, tl.where(x != x, 1, 1 << 8)) \
        + tl.where(ax >= SAT, 1 << 16, 0) + tl.where((ax < MINN) & (ax != 0.0), 1 << 24, 0)
    x64 = xs.to(tl.float64)
    d = tl.where(fin, x64 - c, 0.0)
    s1 += d
    s2 += d * d
    if SKETCH:
        if KP <= 32:
            word = tl.load(pat + p * 8)                   # [NB, 1]: bits 0..31
            bit = (word >> o) & 1
        else:
            word = tl.load(pat + p * 8 + (o >> 5))        # [NB, KP]
            bit = (word >> (o & 31)) & 1
        neg = (bit ^ flip) != 0
        sk += tl.where(neg, -x64, x64)
    return vmin, vmax, lo, hi, w4, s1, s2, sk


@triton.jit
def bytesum(w):
    """The sum of the four 8-bit fields of int32 words."""
    v = (w & 0x00FF00FF) + ((w >> 8) & 0x00FF00FF)
    return (v & 0xFFFF) + ((v >> 16) & 0xFFFF)


@triton.jit
def field_total(w, f: tl.constexpr):
    """The sum over a block of 8-bit field f of int32 words."""
    return tl.sum(tl.sum((w >> (8 * f)) & 0xFF, axis=1), axis=0)


@triton.jit
def tile_kernel(base, tab, tiles, part, pat, SAT, MINN,
                K: tl.constexpr, KL: tl.constexpr, KP: tl.constexpr, NB: tl.constexpr,
                ITERS: tl.constexpr, PW: tl.constexpr, SKETCH: tl.constexpr,
                FMT: tl.constexpr):
    """One tile: ITERS (a multiple of 4, at most 255) iterations of NB sketch blocks (one
    per row) of KL lanes.
    Every statistic accumulates per slot (row, lane) in registers across the iterations,
    with no reduction across the block until the tile's end (a reduction per iteration
    costs barriers and shared-memory round trips that a memory-bound pass cannot pay):
    min and max; the counts in 8-bit fields of int32 words (the bins in four words;
    NaN, Inf, saturated, subnormal in a fifth), exact since a slot sees at most ITERS
    (<= 255) elements; and, in float64, the sums of d = x - c and d^2
    around a shift c per slot (the slot's first element, or the first block's mean where
    that is not finite: sums of deviations, not of values, so the variance keeps its
    digits when the mean is large against the spread), and the sketch's signed sums."""
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
    if SKETCH:  # the tile's first global block index, split for 32-bit hashing
        first_block = start // K
        lo0 = (tl.zeros([1, 1], tl.int64) + (first_block & 0xFFFFFFFF)).to(tl.uint32)
        hi0 = (tl.zeros([1, 1], tl.int64) + (first_block >> 32)).to(tl.uint32)
        mh0 = mix32(hi0)
        mh1 = mix32(hi0 + 1)
    else:
        lo0 = tl.zeros([1, 1], tl.uint32)
        mh0 = lo0
        mh1 = lo0
    # the shift: each slot's first element (finite), else the first block's mean
    x, o, p, flip = load_block(ptr, rem, lo0, mh0, mh1, bl, j, K, KL, SKETCH, FMT)
    fin = (x == x) & (tl.abs(x) != float("inf"))
    mean0 = tl.sum(tl.sum(tl.where(fin, x, 0.0).to(tl.float64), axis=1), axis=0) / \
        tl.maximum(tl.sum(tl.sum(fin.to(tl.float64), axis=1), axis=0), 1.0)
    c = tl.where(fin, x.to(tl.float64), mean0.to(tl.float32).to(tl.float64))
    vmin = tl.full([NB, KP], float("inf"), tl.float32)
    vmax = tl.full([NB, KP], float("-inf"), tl.float32)
    b0 = tl.zeros([NB, KP], tl.int32)       # bins 0, 2, 4, 6 in 8-bit fields
    b1 = tl.zeros([NB, KP], tl.int32)       # bins 1, 3, 5, 7
    b2 = tl.zeros([NB, KP], tl.int32)       # bins 8, 10, 12, 14
    b3 = tl.zeros([NB, KP], tl.int32)       # bins 9, 11, 13, 15
    w4 = tl.zeros([NB, KP], tl.int32)       # NaN, Inf, saturated, subnormal
    s1 = tl.zeros([NB, KP], tl.float64)     # sum of d
    s2 = tl.zeros([NB, KP], tl.float64)     # sum of d^2
    sk = tl.zeros([NB, KP], tl.float64)     # signed sums: lane j is bucket j
    # Four blocks a trip, all loaded before any is used: the loads of one slot are in
    # flight together while the accumulators stay one set per slot (blocks past the
    # tile load as NaN and are taken off below). The bins count in 4-bit fields for 12
    # blocks, then move to the 8-bit ones (one field per bin needs no compare per bin).
    iters = tl.cdiv(tl.cdiv(rem, BLOCK), 4) * 4
    for t0 in range(0, iters, 12):
        lo = tl.zeros([NB, KP], tl.int32)   # bins 0..7 in 4-bit fields
        hi = tl.zeros([NB, KP], tl.int32)   # bins 8..15
        for it in range(t0, tl.minimum(t0 + 12, iters), 4):
            xa, oa, pa, fa = load_block(ptr, rem, lo0, mh0, mh1, it * NB + bl, j, K, KL,
                                        SKETCH, FMT)
            xb, ob, pb, fb = load_block(ptr, rem, lo0, mh0, mh1, (it + 1) * NB + bl, j, K,
                                        KL, SKETCH, FMT)
            xc, oc, pc, fc = load_block(ptr, rem, lo0, mh0, mh1, (it + 2) * NB + bl, j, K,
                                        KL, SKETCH, FMT)
            xd, od, pd, fd = load_block(ptr, rem, lo0, mh0, mh1, (it + 3) * NB + bl, j, K,
                                        KL, SKETCH, FMT)
            vmin, vmax, lo, hi, w4, s1, s2, sk = accumulate(
                xa, oa, pa, fa, pat, c, SAT, MINN, vmin, vmax, lo, hi, w4, s1, s2, sk, KP,
                SKETCH)
            vmin, vmax, lo, hi, w4, s1, s2, sk = accumulate(
                xb, ob, pb, fb, pat, c, SAT, MINN, vmin, vmax, lo, hi, w4, s1, s2, sk, KP,
                SKETCH)
            vmin, vmax, lo, hi, w4, s1, s2, sk = accumulate(
                xc, oc, pc, fc, pat, c, SAT, MINN, vmin, vmax, lo, hi, w4, s1, s2, sk, KP,
                SKETCH)
            vmin, vmax, lo, hi, w4, s1, s2, sk = accumulate(
                xd, od, pd, fd, pat, c, SAT, MINN, vmin, vmax, lo, hi, w4, s1, s2, sk, KP,
                SKETCH)
        b0 += lo & 0x0F0F0F0F
        b1 += (lo >> 4) & 0x0F0F0F0F
        b2 += hi & 0x0F0F0F0F
        b3 += (hi >> 4) & 0x0F0F0F0F
    # the tile's totals: one reduction per statistic
    tcls = tl.zeros([32], tl.int32)
    for f in tl.static_range(4):
        tcls = tl.where(c32 == 2 * f, field_total(b0, f), tcls)
        tcls = tl.where(c32 == 2 * f + 1, field_total(b1, f), tcls)
        tcls = tl.where(c32 == 8 + 2 * f, field_total(b2, f), tcls)
        tcls = tl.where(c32 == 9 + 2 * f, field_total(b3, f), tcls)
    masked = iters * (NB * KP) - rem        # lanes loaded as NaN that are no element
    tcls = tl.where(c32 == 16, field_total(w4, 0) - masked, tcls)
    tcls = tl.where(c32 == 17, field_total(w4, 1), tcls)
    tsat = field_total(w4, 2)
    tsub = field_total(w4, 3)
    # per slot: n_i finite elements, mean m_i = c_i + s1_i / n_i, M2_i = s2_i - s1_i^2 / n_i;
    # merged over the slots (Chan): M2 = sum M2_i + sum n_i (m_i - mean)^2
    ni = (bytesum(b0) + bytesum(b1) + bytesum(b2) + bytesum(b3)).to(tl.float64)
    has = ni > 0
    nd = tl.maximum(ni, 1.0)
    si = tl.where(has, c * ni + s1, 0.0)    # the slot's sum of x
    tn = tl.sum(tl.sum(ni, axis=1), axis=0)
    ts = tl.sum(tl.sum(si, axis=1), axis=0)
    mean = ts / tl.maximum(tn, 1.0)
    dm = tl.where(has, si / nd - mean, 0.0)
    m2i = tl.where(has, tl.maximum(s2 - s1 * s1 / nd, 0.0), 0.0)
    tm2 = tl.sum(tl.sum(m2i + ni * dm * dm, axis=1), axis=0)
    # sum of x^2 = sum (c + d)^2, per slot
    tq = tl.sum(tl.sum(tl.where(has, s2 + 2.0 * c * s1 + ni * c * c, 0.0), axis=1), axis=0)
    tmn = tl.min(tl.min(vmin, axis=1), axis=0)
    tmx = tl.max(tl.max(vmax, axis=1), axis=0)
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
        tl.store(row + 40 + tl.arange(0, KP), tl.sum(sk, axis=0))


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
