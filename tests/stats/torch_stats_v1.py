"""FROZEN COPY, for tests/stats/torch_stats_bench.py only: lockstep/_torch_stats.py as it
was before the fallback rewrite (commit dda0ff3, histc + index_add_). Not shipped, not
maintained; the package has one implementation.

Statistics of many tensors on their own device, batched (docs/statistics.md).

``device_stats(tensors, sketch_k, hist_bins)`` returns one float64 row per tensor, on
the tensors' device, computed with a fixed number of batched torch ops per (dtype,
chunk) group: no host sync, no ``.item()``, no per-tensor ``.cpu()``. The caller copies
the whole [N, F] result to the host once per step (non_blocking) and hands each row to
the C++ agent. The definitions are those of the C++ host kernel
(``lockstep::ComputeHostStats``): same NaN/Inf exclusion, same limit dtype and
thresholds, same count-sketch hash (bit for bit: every int64 product stays < 2^63),
same histogram bins. Works with torch 1.13 (Debian, CPU) and torch 2.x (CUDA); version
differences are handled by feature checks, not pins.

Row layout: ``FIELDS`` (scalar columns, offsets in ``COL``), then ``sketch[0..K)`` from
column ``len(FIELDS)``, then ``hist[0..bins)``.
"""

import collections
import math
import threading
import warnings

import torch

# torch 1.13 flags scatter_reduce_ as beta on first use; the amin/amax reductions used
# here are stable in every version since.
warnings.filterwarnings("ignore", message="scatter_reduce\\(\\) is in beta")

FIELDS = ("numel", "min", "max", "mean", "std", "l2", "absmax", "nan", "inf", "zero",
          "sat", "subnormal", "limit_dtype")
COL = {name: i for i, name in enumerate(FIELDS)}
SKETCH_COL = len(FIELDS)
DEFAULT_SKETCH_K = 32
MAX_SKETCH_K = 256
HIST_BINS = 16

# DType codes (schema/lockstep.fbs).
DTYPE_CODE = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3, torch.float64: 4,
              torch.int8: 5, torch.uint8: 6, torch.int16: 7, torch.int32: 8, torch.int64: 9,
              torch.bool: 10}
_F8E4M3 = getattr(torch, "float8_e4m3fn", None)
_F8E5M2 = getattr(torch, "float8_e5m2", None)
if _F8E4M3 is not None:
    DTYPE_CODE[_F8E4M3] = 11
if _F8E5M2 is not None:
    DTYPE_CODE[_F8E5M2] = 12

_F16_LIMITS = (2, 65504.0, 2.0 ** -14)
_LIMITS = {  # code of limit_dtype, max finite (sat if |x| >=), min normal
    torch.float16: _F16_LIMITS,
    torch.bfloat16: (3, float.fromhex("0x1.FEp127"), 2.0 ** -126),
    torch.float32: _F16_LIMITS,
    torch.float64: _F16_LIMITS,
}
if _F8E4M3 is not None:
    _LIMITS[_F8E4M3] = (11, 448.0, 2.0 ** -6)
if _F8E5M2 is not None:
    _LIMITS[_F8E5M2] = (12, 57344.0, 2.0 ** -14)
_NO_LIMITS = (0, float("inf"), 0.0)  # integers, bool: no saturation/subnormal counts


def row_width(sketch_k, hist_bins):
    return len(FIELDS) + sketch_k + hist_bins


def limits(dtype):
    """(limit_dtype code, saturation threshold, min normal) for a tensor dtype."""
    return _LIMITS.get(dtype, _NO_LIMITS)


# ---- the count-sketch hash (sketch_hash.h), in int64 torch ops ----------------------
_M32 = 0xFFFFFFFF
_MIX = 0x045D9F3B
SIGN_SEED = 0x2545F491
ROT_SEED = 0x1B873593
PAT_SEED = 0x6A09E667
NUM_PATTERNS = 256
PATTERN_BITS = 256


def mix32(v):
    """Mix32 of an int64 tensor holding values in [0, 2^32)."""
    v = ((v ^ (v >> 16)) * _MIX) & _M32
    v = ((v ^ (v >> 16)) * _MIX) & _M32
    return v ^ (v >> 16)


def hash_index(i, seed):
    return mix32((i & _M32) ^ seed ^ mix32(i >> 32))


_pattern_cache = {}
_cache_lock = threading.Lock()


def _patterns(device):
    """[256, 256] bool: bit o of sign pattern p."""
    with _cache_lock:
        t = _pattern_cache.get(device)
    if t is None:
        idx = torch.arange(NUM_PATTERNS * PATTERN_BITS, dtype=torch.int64, device=device)
        t = (hash_index(idx, SIGN_SEED) >> 31).bool().view(NUM_PATTERNS, PATTERN_BITS)
        with _cache_lock:
            _pattern_cache[device] = t
    return t


def _block_hash(numel, k, device, start=0):
    """Per-block rotation r(b) of all blocks, and the sign bit of elements
    [start, start + numel) (start a multiple of k)."""
    nblocks = (numel + k - 1) // k
    b = torch.arange(start // k, start // k + nblocks, dtype=torch.int64, device=device)
    h1 = hash_index(b, ROT_SEED)
    rot = (h1 * k) >> 32
    h2 = mix32(h1 ^ PAT_SEED)
    pat = h2 >> 24
    flip = ((h2 >> 23) & 1).bool()
    i = torch.arange(numel, dtype=torch.int64, device=device)
    blk = torch.div(i, k, rounding_mode="floor")
    o = i - blk * k
    neg = _patterns(device)[pat[blk], o] ^ flip[blk]
    return rot, neg, blk, o


def sketch_index(numel, k, device):
    """(bucket int64 [numel], negative bool [numel]) for the flat indices 0..numel-1."""
    rot, neg, blk, o = _block_hash(numel, k, device)
    return (o + rot[blk]) % k, neg


# Elements hashed per kernel call when the hash of a large tensor is built: bounds the
# int64 temporaries to a few hundred MB.
_BUILD_ELEMENTS = 1 << 24


def _unit(k):
    """Row length U of the working layout: a multiple of 16 (the float32 partial sums)
    and of K (whole sketch blocks), at least PIECE."""
    base = 16 * k // math.gcd(k, 16) if k else 16
    return base * max(1, -(-PIECE // base))


def _padded(numel, k):
    u = _unit(k)
    return -(-numel // u) * u


def _hash_range(start, length, k, device):
    """(sign int8 [length], rotation int64 [length / K]) of the elements
    [start, start + length) of a tensor (start and length multiples of K)."""
    signs, rots = [], []
    step = max(1, _BUILD_ELEMENTS // k) * k
    for s in range(start, start + length, step):
        rot, neg, _, _ = _block_hash(min(step, start + length - s), k, device, s)
        signs.append(1 - 2 * neg.to(torch.int8))
        rots.append(rot)
    if not signs:
        return (torch.zeros(0, dtype=torch.int8, device=device),
                torch.zeros(0, dtype=torch.int64, device=device))
    if len(signs) == 1:
        return signs[0], rots[0]
    return torch.cat(signs), torch.cat(rots)


def _tensor_hash(numel, k, device):
    """The hash of every element of a tensor of `numel` elements, padded to the layout."""
    return _hash_range(0, _padded(numel, k), k, device)


def _hash_slice(numel, k, device, start, length):
    """(sign, rotation) of elements [start, start + length) of a tensor of `numel`
    elements, from the cache when the whole tensor's hash fits in it."""
    padded = _padded(numel, k)
    if padded + padded // k * 8 <= INDEX_CACHE.max_bytes:
        sign, rot = INDEX_CACHE.get(_tensor_hash, numel, k, device)
        return sign[start:start + length], rot[start // k:(start + length) // k]
    return _hash_range(start, length, k, device)


class _IndexCache:
    """LRU of per-(kind, numel, K, device) hash tensors, bounded in bytes: a model's
    tensors have the same shapes every step, so the hash is computed once."""

    def __init__(self, max_bytes):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.items = collections.OrderedDict()
        self.lock = threading.Lock()

    def get(self, build, numel, k, device):
        key = (build.__name__, numel, k, _unit(k), str(device))
        with self.lock:
            hit = self.items.get(key)
            if hit is not None:
                self.items.move_to_end(key)
                return hit[0]
        entry = build(numel, k, device)
        size = sum(t.numel() * t.element_size() for t in entry)
        if size <= self.max_bytes:
            with self.lock:
                self.items[key] = (entry, size)
                self.bytes += size
                while self.bytes > self.max_bytes and self.items:
                    _, (_, old) = self.items.popitem(last=False)
                    self.bytes -= old
        return entry


INDEX_CACHE = _IndexCache(256 << 20)
# Elements per batched group and per pass of a larger tensor: bounds the working set
# (at most ~20 bytes per element at once: the work-dtype copy, a zeroed copy, a scaled
# copy, the float64 signed values of the sketch). One group per flush of the device
# pipeline (256 MB of float32) keeps the per-group launches (~150) few.
CHUNK_ELEMENTS = 1 << 26
# The working layout: every tensor starts a new row of U = _unit(K) >= PIECE elements
# (rows padded with NaN, which is counted and then taken off the NaN count). Per-row
# figures come from plain dim-1 reductions (no atomics); rows go to their tensor with
# one small index_add_ / scatter_reduce_.
PIECE = 256
# Sums: float32 partial sums of 16 consecutive elements (after an exact power-of-2
# scaling per row, so that nothing overflows or underflows), added in float64.
_PARTIAL = 16
# Sketch: blocks are first added into float64 accumulators per (tensor, piece of
# 8 K^2 elements, rotation), about 8 blocks each (few atomics meet on one address),
# then per tensor, then the rotations are folded.
_SKETCH_BLOCKS_PER_ACC = 8
# How the slot counts are made (_count_slots): "histc", or "onehot" (the deterministic
# fallback, in blocks of _ONEHOT_ELEMENTS bools; the tests force it on the CPU too).
_COUNTS = "histc"
_ONEHOT_ELEMENTS = 1 << 26

_small_cache = {}


def _cached(key, build):
    """Small constant tensors (0-d constants, slot tables, fold/lane indices) per device,
    built once: no fill kernel or copy per call."""
    t = _small_cache.get(key)
    if t is None:
        if len(_small_cache) > 4096:
            _small_cache.clear()
        t = build()
        _small_cache[key] = t
    return t


def _const(value, device, dtype=torch.float64):
    return _cached(("c", value, dtype, str(device)),
                   lambda: torch.full((), value, dtype=dtype, device=device))


def _to_device(values, dtype, device):
    """A small host list on `device` without a host sync: pinned, non_blocking (a plain
    torch.tensor(..., device=cuda) copies from pageable memory and synchronizes)."""
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return t
    try:
        t = t.pin_memory()
    except Exception:  # pylint: disable=broad-except  (no pinned memory for this backend)
        pass
    return t.to(device, non_blocking=True)


def _prev(v, work):
    """The largest value of the work dtype below v (v > 0, exact in that dtype)."""
    if work == torch.float64:
        return math.nextafter(v, 0.0) if hasattr(math, "nextafter") else float(
            torch.nextafter(torch.tensor(v, dtype=torch.float64),
                            torch.tensor(0.0, dtype=torch.float64)))
    return float(torch.nextafter(torch.tensor(v, dtype=work), torch.tensor(0.0, dtype=work)))


def _slot_table(dtype, work, bins, device):
    """Every element falls in one slot of |x| (torch.bucketize, right=False: slot i
    holds (edges[i-1], edges[i]]): slot 0 is 0, then the intervals between the
    histogram's binade edges and the limit dtype's subnormal and saturation thresholds
    t (edge: the largest work-dtype value below t, so that |x| >= t is above it), then
    finite values above the last threshold, +-Inf, and last (above every edge) NaN. One
    count per slot gives every count of the row through a 0/1 matrix.

    Returns (edges [E] in the work dtype, fold float64 [E + 1, bins + 5]: slot ->
    histogram bin, sat, subnormal, zero, nan, inf)."""
    code, sat, min_normal = limits(dtype)

    def build():
        inf = float("inf")
        finfo = torch.finfo(work)
        ts = set()
        if bins:
            ts.update(2.0 ** e for e in range(-40, 13, 4))  # 2^-40 .. 2^12
        for v in (min_normal, sat):
            if 0.0 < v < inf:
                ts.add(v)
        edges = [0.0] + [_prev(t, work) for t in sorted(ts)] + [float(finfo.max), inf]
        reps = edges + [math.nan]  # the largest |x| of each slot: it has the slot's class
        fold = []
        for v in reps:
            row = [0.0] * (bins + 5)
            if math.isnan(v):
                row[bins + 3] = 1.0
            elif math.isinf(v):
                row[bins + 4] = 1.0
            else:
                if bins:
                    if v == 0:
                        b = 0
                    elif v < 2.0 ** -40:
                        b = 1
                    else:
                        b = min(bins - 1, max(1, 2 + (math.frexp(v)[1] - 1 + 40) // 4))
                    row[b] = 1.0
                if v >= sat:
                    row[bins] = 1.0
                if 0 < v < min_normal:
                    row[bins + 1] = 1.0
                if v == 0:
                    row[bins + 2] = 1.0
            fold.append(row)
        return (_to_device(edges, work, device), _to_device(fold, torch.float64, device))
    return _cached(("slots", code, str(work), bins, str(device)), build)


def _work_dtype(dtype):
    """float32 for every float type it holds exactly, float64 otherwise."""
    if dtype in (torch.float16, torch.bfloat16, torch.float32) or dtype in (_F8E4M3, _F8E5M2):
        return torch.float32
    return torch.float64


def _pow2_scale(b, work):
    """Per-row power of two s with |x| * s < 1 for |x| <= b (b [P]; 1 where b is not
    finite, as for a row without finite values), clamped so that s is a normal number
    of the work dtype. None (no scaling) for float64."""
    if work != torch.float32:
        return None
    e = torch.frexp(torch.nan_to_num(b, nan=1.0, posinf=1.0, neginf=1.0))[1]
    return ((127 - e.clamp_(-100, 126)) << 23).view(torch.float32)


def _partial_sums(v, rows, scale, square):
    """float64 [rows]: per row of `v` [rows, U] (already scaled by `scale` [rows]), the
    sum (or the sum of squares) in float32 partials of 16 consecutive elements,
    unscaled."""
    q = v.view(-1, _PARTIAL)
    if square:
        p = torch.linalg.vector_norm(q, dim=1).to(torch.float64)
        p = p * p
    else:
        p = q.sum(1).to(torch.float64)
    p = p.view(rows, v.shape[1] // _PARTIAL).sum(1)
    if scale is None:
        return p
    s = scale.to(torch.float64)
    return p / (s * s) if square else p / s


class _Buffer:
    """The views of one pass, in the working layout: x [P, U] (work dtype, NaN-padded
    rows), rowseg [P] (segment of each row), and the per-segment host lists."""

    def __init__(self, views, dtype, work, u, device):
        g = len(views)
        numels = [v.numel() for v in views]
        pads = [(-n) % u for n in numels]
        rows = [(n + p) // u for n, p in zip(numels, pads)]
        convert = dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
        cat_dtype = work if convert else dtype
        nan_row = _cached(("nanrow", u, str(cat_dtype), str(device)),
                          lambda: torch.full((u,), float("nan"), dtype=cat_dtype, device=device))
        parts = []
        for v, pad in zip(views, pads):
            v = v.reshape(-1)
            parts.append(v.to(work) if convert else v)
            if pad:
                parts.append(nan_row[:pad])
        if not parts:
            x = torch.zeros(0, dtype=work, device=device)
        else:
            x = torch.cat(parts) if len(parts) > 1 else parts[0]
        if x.dtype != work:
            x = x.to(work)
        self.p = sum(rows)
        self.x = x.view(self.p, u)
        self.g = g
        self.u = u
        self.numels = numels
        self.pads = pads
        self.rows = rows
        small = _to_device(rows + pads, torch.int64, device)
        self.rows_t = small[:g]
        self.pads_t = small[g:].to(torch.float64)
        gi = torch.arange(g, dtype=torch.int64, device=device)
        # output_size: without it repeat_interleave reads the total back from the device
        self.rowseg = torch.repeat_interleave(gi, self.rows_t, output_size=self.p)


def _pass1(buf, hashes, dtype, work, k, bins, device):
    """Everything but the variance, per segment of `buf`: (minmax [g, 2] float64 (-min,
    max over the finite values; -inf where none), slot counts [g, E + 1], (sum, sum of
    squares) [g, 2], rotation table R [g, K, K] or None), and the per-row |x| bound
    [P] for the variance pass."""
    f64 = torch.float64
    inf = float("inf")
    g, p, x, rowseg = buf.g, buf.p, buf.x, buf.rowseg
    edges, fold = _slot_table(dtype, work, bins, device)
    s = fold.shape[0]
    # min / max of the finite values per row, then per segment
    lo = torch.nan_to_num(x, nan=inf, posinf=inf, neginf=inf).amin(1)
    hi = torch.nan_to_num(x, nan=-inf, posinf=-inf, neginf=-inf).amax(1)
    minmax = _segment_max(torch.stack([-lo, hi], dim=1), buf, work, device).to(f64)
    bound = torch.maximum(-lo, hi)  # -inf where a row has no finite value
    # counts: one bucketing of |x|, counted per (segment, slot)
    slot = torch.bucketize(x.abs(), edges, out_int32=True)
    counts = _count_slots(slot, buf, s, device)
    del slot
    counts[:, s - 1] -= buf.pads_t  # the padding is NaN
    xz = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    scale = _pow2_scale(bound, work)
    xs = xz * scale.unsqueeze(1) if scale is not None else xz
    # the sum in float64 (the mean to float64 precision), squares in scaled float32
    s12 = torch.zeros((g, 2), dtype=f64, device=device).index_add_(
        0, rowseg, torch.stack([xz.sum(1, dtype=f64),
                                _partial_sums(xs, p, scale, True)], dim=1))
    del xs
    table = None
    if k:
        table = _sketch_table(buf, xz, hashes, k, device)
    return minmax, counts, s12, table, bound


def _segment_max(rows_v, buf, work, device):
    """[g, c]: per segment, the max of its rows of rows_v [P, c] (-inf for none)."""
    p, c = rows_v.shape
    return torch.full((buf.g, c), -float("inf"), dtype=work, device=device).scatter_reduce_(
        0, buf.rowseg.unsqueeze(1).expand(p, c), rows_v, "amax")


def _count_slots(slot, buf, s, device):
    """float64 [g, s]: per segment, how many elements fall in each slot (slot int32
    [P, U]). torch.histc of segment * s + slot (float64, exact integers), or where
    histc is not deterministic (CUDA in torch's deterministic mode) or not known to
    exist: per row, the sum of a one-hot comparison (exact, deterministic, no atomics,
    slower), in blocks of rows that bound the bool temporary; then per segment."""
    f64 = torch.float64
    g, p, u = buf.g, buf.p, buf.u
    if _COUNTS == "histc" and device.type in ("cpu", "cuda") and not (
            device.type == "cuda" and torch.are_deterministic_algorithms_enabled()):
        key = torch.add(slot, (buf.rowseg * s).to(f64).unsqueeze(1)).view(-1)
        per = max(1, 4096 // s)
        out = []
        for a in range(0, g, per):
            b = min(g, a + per)
            out.append(torch.histc(key, bins=(b - a) * s, min=a * s - 0.5, max=b * s - 0.5))
        return (out[0] if len(out) == 1 else torch.cat(out)).view(g, s)
    lanes = _cached(("lanes", s, str(device)),
                    lambda: torch.arange(s, dtype=torch.int32, device=device))
    step = max(1, _ONEHOT_ELEMENTS // (u * s))
    per_row = []
    for a in range(0, p, step):
        hit = slot[a:a + step].unsqueeze(2) == lanes  # [rows, U, s] bool
        per_row.append(hit.sum(1, dtype=torch.int32))
    per_row = (per_row[0] if len(per_row) == 1 else torch.cat(per_row)) if per_row else \
        torch.zeros((0, s), dtype=torch.int32, device=device)
    return torch.zeros((g, s), dtype=f64, device=device).index_add_(
        0, buf.rowseg, per_row.to(f64))


def _fold_index(k, device):
    """[K, K] int64: G[r, j] = (j - r) mod K."""
    def build():
        r = torch.arange(k, dtype=torch.int64).unsqueeze(1)
        j = torch.arange(k, dtype=torch.int64).unsqueeze(0)
        return _to_device(((j - r) % k).tolist(), torch.int64, device)
    return _cached(("fold", k, str(device)), build)


def _sketch_table(buf, xz, hashes, k, device):
    """float64 [g, K, K]: R[s, r, o] = sum over the blocks of segment s with rotation r
    of sign * x at offset o (non-finite values are 0). Blocks go first to accumulators
    per (segment, piece of a few 8 K^2 elements, rotation), then to the segment."""
    f64 = torch.float64
    g, p, u = buf.g, buf.p, buf.u
    per_row = u // k
    ch = max(1, _SKETCH_BLOCKS_PER_ACC * k * k // u)  # rows per accumulator piece
    n_pieces = [-(-r // ch) for r in buf.rows]
    row_start, piece_start, r0, c0 = [], [], 0, 0
    for r, c in zip(buf.rows, n_pieces):
        row_start.append(r0)
        piece_start.append(c0)
        r0 += r
        c0 += c
    n_acc = c0
    small = _to_device(row_start + piece_start + n_pieces, torch.int64, device)
    g_row_start, g_piece_start, g_pieces = small[:g], small[g:2 * g], small[2 * g:]
    gi = torch.arange(g, dtype=torch.int64, device=device)
    piece_seg = torch.repeat_interleave(gi, g_pieces, output_size=n_acc)
    local = torch.arange(p, dtype=torch.int64, device=device) - g_row_start[buf.rowseg]
    row_piece = torch.div(local, ch, rounding_mode="floor") + g_piece_start[buf.rowseg]
    sign = hashes[0][0] if g == 1 else torch.cat([h[0] for h in hashes])
    rot = hashes[0][1] if g == 1 else torch.cat([h[1] for h in hashes])
    block_key = (row_piece.unsqueeze(1) * k + rot.view(p, per_row)).view(-1)
    # one kernel: the product (exact: a sign) is stored as float64
    signed = torch.mul(xz.view(-1), sign,
                       out=torch.empty(xz.numel(), dtype=f64, device=device))
    acc = torch.zeros((n_acc * k, k), dtype=f64, device=device).index_add_(
        0, block_key, signed.view(-1, k))
    return torch.zeros((g, k * k), dtype=f64, device=device).index_add_(
        0, piece_seg, acc.view(n_acc, k * k)).view(g, k, k)


def _fold_sketch(table, k, device):
    g = table.shape[0]
    return torch.gather(table, 2, _fold_index(k, device).unsqueeze(0).expand(g, k, k)).sum(1)


def _pass2(buf, bound, mean, work, device):
    """float64 [g, 2]: sums over the finite values of d = x - m and of d^2, with m the
    mean rounded to the work dtype (float32 partials of scaled deviations, float64
    beyond). The sum of d corrects both the mean and the variance (corrected two-pass
    algorithm): the deviations are small, so their sums are accurate relative to std."""
    f64 = torch.float64
    g, p, x, rowseg = buf.g, buf.p, buf.x, buf.rowseg
    m = mean.to(work)[rowseg]  # NaN where a segment has no finite value
    scale = _pow2_scale(torch.maximum(bound, m.abs()), work)
    if scale is None:
        dev = x - m.unsqueeze(1)
    else:  # x * s - m * s: the products are exact (powers of two), one rounding
        dev = torch.addcmul((-m * scale).unsqueeze(1), x, scale.unsqueeze(1))
    dev = torch.nan_to_num(dev, nan=0.0, posinf=0.0, neginf=0.0)
    return torch.zeros((g, 2), dtype=f64, device=device).index_add_(
        0, rowseg, torch.stack([_partial_sums(dev, p, scale, False),
                                _partial_sums(dev, p, scale, True)], dim=1))


def _finish_rows(numel, counts, fold, s1, s2, dev, minmax, sketch, code, bins, device):
    """[g, F] rows from per-segment reductions (dev: sums of d = x - m and d^2, m the
    mean rounded to the work dtype)."""
    f64 = torch.float64
    folded = counts.matmul(fold)  # [g, bins + 5]
    n_nan, n_inf = folded[:, bins + 3], folded[:, bins + 4]
    n_f = numel - n_inf - n_nan
    d1, d2 = dev[:, 0], dev[:, 1]
    mean = s1 / n_f
    # sum (x - mean)^2 = sum d^2 - (sum d)^2 / n_f
    var = torch.clamp(d2 - d1 * d1 / n_f, min=0.0) / n_f
    mn, mx = -minmax[:, 0], minmax[:, 1]
    vals = torch.stack([mn, mx, mean, torch.sqrt(var), torch.sqrt(s2),
                        torch.maximum(-mn, mx)], dim=1)
    vals = torch.where((n_f > 0).unsqueeze(1), vals, _const(float("nan"), device))
    parts = [numel.unsqueeze(1), vals,
             torch.stack([n_nan, n_inf, folded[:, bins + 2], folded[:, bins],
                          folded[:, bins + 1]], dim=1),
             torch.full_like(n_f, float(code)).unsqueeze(1)]
    if sketch is not None:
        # float32 on the wire: round here too, so both paths hand over the same values.
        parts.append(sketch.to(torch.float32).to(f64))
    if bins:
        parts.append(folded[:, :bins])
    return torch.cat(parts, dim=1)


def _mean(s1, counts, fold, numel, bins):
    folded = counts.matmul(fold)
    n_f = numel - folded[:, bins + 3] - folded[:, bins + 4]
    return s1 / n_f  # NaN where nothing is finite (0 / 0)


def _group_rows(ts, dtype, sketch_k, hist_bins, device):
    """[g, F] rows of g tensors of one dtype: one set of kernels for the whole group,
    or, for a tensor above CHUNK_ELEMENTS alone, the same in passes of about that many
    elements (two passes: the variance needs the mean)."""
    f64 = torch.float64
    k, bins = sketch_k, hist_bins
    work = _work_dtype(dtype)
    u = _unit(k)
    edges, fold = _slot_table(dtype, work, bins, device)
    numels = [t.numel() for t in ts]
    numel = _to_device([float(n) for n in numels], f64, device)
    code = limits(dtype)[0]
    flats = [t.detach().reshape(-1) for t in ts]
    if len(ts) == 1 and numels[0] > CHUNK_ELEMENTS:
        n = numels[0]
        # whole rows and whole sketch pieces per pass, so that the pieces are those of
        # a single pass
        piece = u * max(1, _SKETCH_BLOCKS_PER_ACC * k * k // u) if k else u
        step = max(1, CHUNK_ELEMENTS // piece) * piece
        slices = [(a, min(n, a + step)) for a in range(0, n, step)]
    else:
        slices = None
    if slices is None:
        hashes = [_hash_slice(n, k, device, 0, _padded(n, k)) for n in numels] if k else None
        buf = _Buffer(flats, dtype, work, u, device)
        minmax, counts, s12, table, bound = _pass1(buf, hashes, dtype, work, k, bins, device)
        mean = _mean(s12[:, 0], counts, fold, numel, bins)
        dev = _pass2(buf, bound, mean, work, device)
    else:
        flat = flats[0]
        n = numels[0]
        parts, bounds = [], []
        for a, b in slices:
            buf = _Buffer([flat[a:b]], dtype, work, u, device)
            hashes = [_hash_slice(n, k, device, a, _padded(b - a, k))] if k else None
            res = _pass1(buf, hashes, dtype, work, k, bins, device)
            parts.append(res[:4])
            bounds.append(res[4])
        minmax = torch.stack([r[0] for r in parts]).amax(0)
        counts = torch.stack([r[1] for r in parts]).sum(0)
        s12 = torch.stack([r[2] for r in parts]).sum(0)
        table = torch.stack([r[3] for r in parts]).sum(0) if k else None
        mean = _mean(s12[:, 0], counts, fold, numel, bins)
        dev = torch.zeros((1, 2), dtype=f64, device=device)
        for (a, b), bound in zip(slices, bounds):
            buf = _Buffer([flat[a:b]], dtype, work, u, device)
            dev = dev + _pass2(buf, bound, mean, work, device)
    sketch = _fold_sketch(table, k, device) if k else None
    return _finish_rows(numel, counts, fold, s12[:, 0], s12[:, 1], dev, minmax, sketch, code,
                        bins, device)


def _groups(tensors):
    """Indices of tensors grouped by dtype, then cut so a group stays under the chunk
    size (a tensor larger than the chunk is a group of its own)."""
    by_dtype = collections.OrderedDict()
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for dtype, idx in by_dtype.items():
        cur, cur_n = [], 0
        for i in idx:
            n = tensors[i].numel()
            if cur and cur_n + n > CHUNK_ELEMENTS:
                yield dtype, cur
                cur, cur_n = [], 0
            cur.append(i)
            cur_n += n
        if cur:
            yield dtype, cur


def device_stats(tensors, sketch_k=DEFAULT_SKETCH_K, hist_bins=HIST_BINS):
    """float64 [N, F] statistics of `tensors` (all on one device), on that device.

    No host sync: every kernel is launched asynchronously, small host-side index lists
    travel through pinned memory. Raises ValueError for a bad sketch_k / hist_bins or
    tensors on several devices (the caller, lockstep's recorder, catches and counts it)."""
    if not 0 <= sketch_k <= MAX_SKETCH_K:
        raise ValueError("sketch_k is %d; use 0 (off) to %d." % (sketch_k, MAX_SKETCH_K))
    if hist_bins not in (0, HIST_BINS):
        raise ValueError("hist_bins is %d; use 0 (off) or %d." % (hist_bins, HIST_BINS))
    width = row_width(sketch_k, hist_bins)
    if not tensors:
        return torch.empty((0, width), dtype=torch.float64)
    device = tensors[0].device
    for t in tensors:
        if t.device != device:
            raise ValueError("device_stats got tensors on %s and %s; call it once per device."
                             % (device, t.device))
    with torch.no_grad():
        n = len(tensors)
        order, rows = [], []
        for dtype, idx in _groups(tensors):
            ts = [tensors[i] for i in idx]
            if dtype.is_complex:
                ts = [t.abs() for t in ts]
                dtype = ts[0].dtype
            rows.append(_group_rows(ts, dtype, sketch_k, hist_bins, device))
            order.extend(idx)
        out = rows[0] if len(rows) == 1 else torch.cat(rows)
        if order != list(range(n)):  # dtype groups put the rows out of order
            inverse = [0] * n
            for pos, i in enumerate(order):
                inverse[i] = pos
            out = out.index_select(0, _to_device(inverse, torch.int64, device))
        return out
