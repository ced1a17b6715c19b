"""Statistics of many tensors on their own device, batched (docs/statistics.md).

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


# Elements hashed per kernel call when the index of a large tensor is built: bounds the
# int64 temporaries to a few hundred MB.
_BUILD_ELEMENTS = 1 << 24


def _element_index(numel, k, device):
    """(bucket uint8 [numel], sign int8 [numel]) of every element (K <= 256): 2 bytes per
    element in the cache, built in pieces of _BUILD_ELEMENTS (a multiple of K)."""
    step = max(1, _BUILD_ELEMENTS // k) * k
    buckets, signs = [], []
    for start in range(0, numel, step):
        rot, neg, blk, o = _block_hash(min(step, numel - start), k, device, start)
        buckets.append(((o + rot[blk]) % k).to(torch.uint8))
        signs.append(1 - 2 * neg.to(torch.int8))
    if not buckets:
        return (torch.zeros(0, dtype=torch.uint8, device=device),
                torch.zeros(0, dtype=torch.int8, device=device))
    if len(buckets) == 1:
        return buckets[0], signs[0]
    return torch.cat(buckets), torch.cat(signs)


class _IndexCache:
    """LRU of per-(kind, numel, K, device) hash tensors, bounded in bytes: a model's
    tensors have the same shapes every step, so the hash is computed once."""

    def __init__(self, max_bytes):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.items = collections.OrderedDict()
        self.lock = threading.Lock()

    def get(self, build, numel, k, device):
        key = (build.__name__, numel, k, str(device))
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
# Elements per batched group and per pass of a larger tensor: bounds the float64
# working set (a few float64 copies of this many elements).
CHUNK_ELEMENTS = 1 << 24
# Per-element accumulations (index_add_, scatter_reduce_) go first to one accumulator per
# piece of PIECE consecutive elements of one tensor, then per tensor: atomics from
# millions of elements into a few accumulators serialize on a GPU; at most PIECE (and
# PIECE / K for the sketch) meet on one address. A power of two.
PIECE = 256

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


def _slot_table(dtype, bins, device):
    """Every element falls in one slot of |x|: slot 0 is 0, slots 1..E-1 are the
    intervals between consecutive edges (the histogram's binade edges and the dtype's
    subnormal and saturation thresholds), slot E is +-Inf, slot E+1 is NaN. One count
    per slot gives every count of the row through a 0/1 matrix.

    Returns (edges float64 [E] for bucketize(|x|, edges, right=True), with +Inf last;
    fold float64 [E, bins + 2]: finite slot -> histogram bin, sat, subnormal)."""
    code, sat, min_normal = limits(dtype)

    def build():
        inf = float("inf")
        edges = {math.ulp(0.0)}  # the smallest positive double: below it only 0
        if bins:
            edges.update(2.0 ** e for e in range(-40, 13, 4))  # 2^-40 .. 2^12
        for v in (min_normal, sat):
            if 0.0 < v < inf:
                edges.add(v)
        edges = sorted(edges) + [inf]
        n = len(edges)
        fold = [[0.0] * (bins + 2) for _ in range(n)]
        for s in range(n):
            lo = 0.0 if s == 0 else edges[s - 1]
            hi = edges[s]
            if bins:
                if s == 0:
                    b = 0
                elif lo < 2.0 ** -40:
                    b = 1
                else:
                    b = min(bins - 1, max(1, 2 + (math.frexp(lo)[1] - 1 + 40) // 4))
                fold[s][b] = 1.0
            if s > 0 and lo >= sat:
                fold[s][bins] = 1.0
            if s > 0 and hi <= min_normal:
                fold[s][bins + 1] = 1.0
        return (_to_device(edges, torch.float64, device),
                _to_device(fold, torch.float64, device))
    return _cached(("slots", code, bins, str(device)), build)


def _slots(x, edges):
    """int64 slot of every element (see _slot_table)."""
    a = torch.nan_to_num(x.abs(), nan=float("inf"), posinf=float("inf"))
    return torch.bucketize(a, edges, right=True) + torch.isnan(x)


def _finish_rows(numel, counts, fold, s1, s2, var, mn, mx, sketch, code, bins, device):
    """[g, F] rows from per-tensor reductions: counts [g, E + 2] (slots), s1/s2/var/mn/mx
    [g], sketch [g, K] or None."""
    f64 = torch.float64
    e = fold.shape[0]
    folded = counts[:, :e].matmul(fold)  # [g, bins + 2]: histogram, sat, subnormal
    n_inf, n_nan = counts[:, e], counts[:, e + 1]
    n_f = numel - n_inf - n_nan
    mean = s1 / n_f  # NaN where nothing is finite (0 / 0)
    vals = torch.stack([mn, mx, mean, torch.sqrt(var / n_f), torch.sqrt(s2),
                        torch.maximum(-mn, mx)], dim=1)
    vals = torch.where((n_f > 0).unsqueeze(1), vals, _const(float("nan"), device))
    parts = [numel.unsqueeze(1), vals,
             torch.stack([n_nan, n_inf, counts[:, 0]], dim=1), folded[:, bins:bins + 2],
             torch.full_like(n_f, float(code)).unsqueeze(1)]
    if sketch is not None:
        # float32 on the wire: round here too, so both paths hand over the same values.
        parts.append(sketch.to(torch.float32).to(f64))
    if bins:
        parts.append(folded[:, :bins])
    return torch.cat(parts, dim=1)


def _partials(x, key, n_keys, edges, slots, bucket, sign, k, device):
    """Per-piece accumulations of float64 `x` (key: piece of every element, < n_keys):
    slot counts [n_keys, slots], (sum, sum of squares) [n_keys, 2], min, max [n_keys],
    sketch [n_keys, K] or None."""
    f64 = torch.float64
    inf = float("inf")
    m = x.numel()
    xf = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    cnt = torch.zeros(n_keys * slots, dtype=f64, device=device).index_add_(
        0, key * slots + _slots(x, edges), _const(1.0, device).expand(m)).view(n_keys, slots)
    s12 = torch.zeros((n_keys, 2), dtype=f64, device=device).index_add_(
        0, key, torch.stack([xf, xf * xf], dim=1))
    mn = torch.full((n_keys,), inf, dtype=f64, device=device).scatter_reduce_(
        0, key, torch.nan_to_num(x, nan=inf, posinf=inf, neginf=inf), "amin")
    mx = torch.full((n_keys,), -inf, dtype=f64, device=device).scatter_reduce_(
        0, key, torch.nan_to_num(x, nan=-inf, posinf=-inf, neginf=-inf), "amax")
    sk = None
    if k:
        sk = torch.zeros(n_keys * k, dtype=f64, device=device).index_add_(
            0, key * k + bucket, xf * sign).view(n_keys, k)
    return cnt, s12, mn, mx, sk


def _sq_dev(x, mean_per_element, key, n_keys, device):
    """Per-piece sum of squared deviations from the mean (non-finite elements add 0)."""
    dev = torch.nan_to_num(x - mean_per_element, nan=0.0, posinf=0.0, neginf=0.0)
    return torch.zeros(n_keys, dtype=torch.float64, device=device).index_add_(0, key, dev * dev)


def _piece_keys(m, device):
    return torch.arange(m, dtype=torch.int64, device=device).bitwise_right_shift_(
        PIECE.bit_length() - 1)


def _large_row(t, dtype, sketch_k, hist_bins, device):
    """[1, F] row of a tensor above CHUNK_ELEMENTS, in passes (two-pass std)."""
    f64 = torch.float64
    n = t.numel()
    k, bins = sketch_k, hist_bins
    edges, fold = _slot_table(dtype, bins, device)
    slots = fold.shape[0] + 2
    flat = t.detach().reshape(-1)
    step = max(1, CHUNK_ELEMENTS // max(k, PIECE)) * max(k, PIECE)  # whole blocks and pieces
    bucket = sign = None
    if k:
        bucket, sign = INDEX_CACHE.get(_element_index, n, k, device)
    totals = []
    for start in range(0, n, step):
        x = flat[start:start + step].to(f64)
        m = x.numel()
        n_keys = (m + PIECE - 1) // PIECE
        cnt, s12, mn, mx, sk = _partials(
            x, _piece_keys(m, device), n_keys, edges, slots,
            bucket[start:start + m] if k else None, sign[start:start + m] if k else None,
            k, device)
        totals.append((cnt.sum(0), s12.sum(0), mn.amin(), mx.amax(),
                       sk.sum(0) if k else None))
    counts = torch.stack([p[0] for p in totals]).sum(0).unsqueeze(0)
    s12 = torch.stack([p[1] for p in totals]).sum(0)
    mn = torch.stack([p[2] for p in totals]).amin().view(1)
    mx = torch.stack([p[3] for p in totals]).amax().view(1)
    sketch = torch.stack([p[4] for p in totals]).sum(0).unsqueeze(0) if k else None
    numel = _const(float(n), device).view(1)
    e = fold.shape[0]
    mean = s12[0] / (numel - counts[:, e] - counts[:, e + 1])
    var = torch.zeros(1, dtype=f64, device=device)
    for start in range(0, n, step):
        x = flat[start:start + step].to(f64)
        m = x.numel()
        var = var + _sq_dev(x, mean, _piece_keys(m, device), (m + PIECE - 1) // PIECE,
                            device).sum()
    return _finish_rows(numel, counts, fold, s12[0:1], s12[1:2], var, mn, mx, sketch,
                        limits(dtype)[0], bins, device)


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


def _group_rows(ts, dtype, sketch_k, hist_bins, device):
    """[g, F] rows of g tensors of one dtype, concatenated: one set of kernels for the
    whole group; per-element accumulations go to pieces of PIECE elements (a piece never
    spans two tensors), then to the tensors."""
    g = len(ts)
    numels = [t.numel() for t in ts]
    if g == 1 and numels[0] > CHUNK_ELEMENTS:
        return _large_row(ts[0], dtype, sketch_k, hist_bins, device)
    f64, i64 = torch.float64, torch.int64
    total = sum(numels)
    k, bins = sketch_k, hist_bins
    edges, fold = _slot_table(dtype, bins, device)
    slots = fold.shape[0] + 2
    # The piece of element i of tensor s is i_global // PIECE + s: unique per (piece,
    # tensor), as tensors are consecutive. Pieces [start_s, start_{s+1}) belong to s (one
    # may be unused: it stays zero).
    shift = PIECE.bit_length() - 1
    starts, offset = [], 0
    for s, n in enumerate(numels):
        starts.append((offset >> shift) + s)
        offset += n
    n_keys = (total >> shift) + g
    pieces_per = [b - a for a, b in zip(starts, starts[1:] + [n_keys])]
    small = _to_device(numels + pieces_per, i64, device)
    counts_t, pieces_t = small[:g], small[g:]
    gi = torch.arange(g, dtype=i64, device=device)
    # output_size: without it repeat_interleave reads the total back from the device
    seg = torch.repeat_interleave(gi, counts_t, output_size=total)
    key_seg = torch.repeat_interleave(gi, pieces_t, output_size=n_keys)
    key = _piece_keys(total, device).add_(seg)
    x = (torch.cat([t.detach().reshape(-1) for t in ts]) if g > 1
         else ts[0].detach().reshape(-1)).to(f64)
    bucket = sign = None
    if k:
        pieces = [INDEX_CACHE.get(_element_index, n, k, device) for n in numels]
        bucket = torch.cat([p[0] for p in pieces]) if g > 1 else pieces[0][0]
        sign = torch.cat([p[1] for p in pieces]) if g > 1 else pieces[0][1]
    cnt, s12, mn, mx, sk = _partials(x, key, n_keys, edges, slots, bucket, sign, k, device)
    inf = float("inf")
    counts = torch.zeros((g, slots), dtype=f64, device=device).index_add_(0, key_seg, cnt)
    s12 = torch.zeros((g, 2), dtype=f64, device=device).index_add_(0, key_seg, s12)
    mn = torch.full((g,), inf, dtype=f64, device=device).scatter_reduce_(0, key_seg, mn, "amin")
    mx = torch.full((g,), -inf, dtype=f64, device=device).scatter_reduce_(0, key_seg, mx, "amax")
    sketch = (torch.zeros((g, k), dtype=f64, device=device).index_add_(0, key_seg, sk)
              if k else None)
    numel = counts_t.to(f64)
    e = fold.shape[0]
    s1, s2 = s12[:, 0], s12[:, 1]
    mean = s1 / (numel - counts[:, e] - counts[:, e + 1])
    var = torch.zeros(g, dtype=f64, device=device).index_add_(
        0, key_seg, _sq_dev(x, mean[seg], key, n_keys, device))
    return _finish_rows(numel, counts, fold, s1, s2, var, mn, mx, sketch, limits(dtype)[0],
                        bins, device)


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
