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


def _segment_index(numel, k, device):
    """For the batched path: (bucket int64, sign float64) per element."""
    bucket, neg = sketch_index(numel, k, device)
    return bucket, 1.0 - 2.0 * neg.to(torch.float64)


# Blocks hashed per kernel call when the block index of a large tensor is built: bounds
# the int64 temporaries to a few hundred MB.
_BUILD_ELEMENTS = 1 << 24


def _block_index(numel, k, device):
    """For the single-tensor path: (rotation int64 [nblocks], sign int8 [numel])."""
    step = max(1, _BUILD_ELEMENTS // k) * k
    rots, signs = [], []
    for start in range(0, numel, step):
        rot, neg, _, _ = _block_hash(min(step, numel - start), k, device, start)
        rots.append(rot)
        signs.append(1 - 2 * neg.to(torch.int8))
    if len(rots) == 1:
        return rots[0], signs[0]
    return torch.cat(rots), torch.cat(signs)


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
# Elements per batched group and per pass of the single-tensor path: bounds the float64
# working set (a few float64 copies of this many elements).
CHUNK_ELEMENTS = 1 << 24
# Tensors up to this many elements are batched with others of their dtype (one set of
# kernels for many small tensors, summed per segment with index_add_); larger ones are
# reduced on their own with plain reductions: atomics from millions of elements into a
# few accumulators serialize on the GPU.
SMALL_ELEMENTS = 1 << 16
# The histogram of a large tensor is counted into this many partial histograms (lanes),
# so that its atomic adds do not all hit the same 17 counters.
_HIST_LANES = 128
_HIST_LANES_FROM = 1 << 15

_small_cache = {}


def _cached(key, build):
    """Small constant tensors (0-d constants, fold/lane indices) per device, built once:
    no fill kernel per call."""
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


def _fold(k, device):
    """[K, K] int64: column (j - r) mod K of rotation row r holds sketch bucket j."""
    def build():
        r = torch.arange(k, dtype=torch.int64, device=device).view(k, 1)
        j = torch.arange(k, dtype=torch.int64, device=device).view(1, k)
        return (j - r) % k
    return _cached(("fold", k, str(device)), build)


def _lane_offsets(slots, device):
    return _cached(("lanes", slots, str(device)), lambda: torch.arange(
        _HIST_LANES, dtype=torch.int64, device=device).view(1, _HIST_LANES) * slots)


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


def _hist_bins_of(x, finite, nonzero, bins, device):
    """int64 bin of every element; `bins` (one past the last) for NaN/Inf."""
    i64 = torch.int64
    e = ((x.view(i64) >> 52) & 0x7FF) - 1023  # floor(log2|x|) for normal x
    b = torch.clamp(2 + ((e + 40) >> 2), 1, bins - 1)
    b = torch.where(nonzero, b, _const(0, device, i64))
    return torch.where(finite, b, _const(bins, device, i64))


def _single_row(t, dtype, sketch_k, hist_bins, device):
    """[1, F] row of one tensor with plain reductions (no segments, no contended
    atomics), in passes of at most CHUNK_ELEMENTS elements."""
    f64 = torch.float64
    n = t.numel()
    code, sat, min_normal = limits(dtype)
    k, bins = sketch_k, hist_bins
    if n == 0:
        row = torch.zeros((1, row_width(k, bins)), dtype=f64, device=device)
        row[0, COL["min"]:COL["absmax"] + 1] = float("nan")
        row[0, COL["limit_dtype"]] = float(code)
        return row
    flat = t.detach().reshape(-1)
    step = n if n <= CHUNK_ELEMENTS else max(1, CHUNK_ELEMENTS // max(k, 1)) * max(k, 1)
    zero = _const(0.0, device)
    inf, ninf = _const(float("inf"), device), _const(float("-inf"), device)
    if k:
        rot, sign = INDEX_CACHE.get(_block_index, n, k, device)
        table = torch.zeros((k, k), dtype=f64, device=device)
    if bins:
        slots = bins + 1
        hist = torch.zeros(_HIST_LANES * slots, dtype=f64, device=device)
    sums, mins, maxs, kept = [], [], [], None
    for start in range(0, n, step):
        x = flat[start:start + step].to(f64)
        m = x.numel()
        finite = torch.isfinite(x)
        xf = torch.where(finite, x, zero)
        ax = xf.abs()
        nonzero = ax > 0
        sums.append(torch.stack([
            finite.sum(dtype=f64), torch.isnan(x).sum(dtype=f64), nonzero.sum(dtype=f64),
            (ax >= sat).sum(dtype=f64), (nonzero & (ax < min_normal)).sum(dtype=f64),
            xf.sum(), torch.dot(xf, xf)]))
        mins.append(torch.where(finite, x, inf).min())
        maxs.append(torch.where(finite, x, ninf).max())
        if k:
            nb = (m + k - 1) // k
            xs = xf * sign[start:start + m]
            if nb * k != m:
                xs = torch.nn.functional.pad(xs, (0, nb * k - m))
            b0 = start // k
            table.index_add_(0, rot[b0:b0 + nb], xs.view(nb, k))
        if bins:
            b = _hist_bins_of(x, finite, nonzero, bins, device)
            if m >= _HIST_LANES_FROM:
                pad = (-m) % _HIST_LANES
                if pad:
                    b = torch.nn.functional.pad(b, (0, pad), value=bins)
                b = (b.view(-1, _HIST_LANES) + _lane_offsets(slots, device)).reshape(-1)
            hist.index_add_(0, b, _const(1.0, device).expand(b.numel()))
        if step >= n:
            kept = (x, finite)
    tot = sums[0] if len(sums) == 1 else torch.stack(sums).sum(0)
    n_f, n_nan, n_nz, n_sat, n_sub, s1, s2 = tot.unbind(0)
    mean = s1 / n_f  # NaN when nothing is finite (0 / 0)
    if kept is not None:
        x, finite = kept
        dev = torch.where(finite, x - mean, zero)
        var = torch.dot(dev, dev)
    else:  # second pass over the chunks (two-pass std, as the definition says)
        var = zero
        for start in range(0, n, step):
            x = flat[start:start + step].to(f64)
            dev = torch.where(torch.isfinite(x), x - mean, zero)
            var = var + torch.dot(dev, dev)
    mn = mins[0] if len(mins) == 1 else torch.stack(mins).min()
    mx = maxs[0] if len(maxs) == 1 else torch.stack(maxs).max()
    vals = torch.stack([mn, mx, mean, torch.sqrt(var / n_f), torch.sqrt(s2),
                        torch.maximum(-mn, mx)])
    vals = torch.where(n_f > 0, vals, _const(float("nan"), device))
    numel = _const(float(n), device)
    parts = [numel.view(1), vals, torch.stack([n_nan, numel - n_f - n_nan, n_f - n_nz, n_sat,
                                               n_sub, _const(float(code), device)])]
    if k:
        sk = table.gather(1, _fold(k, device)).sum(0)
        # float32 on the wire: round here too, so both paths hand over the same values.
        parts.append(sk.to(torch.float32).to(f64))
    if bins:
        parts.append(hist.view(_HIST_LANES, slots).sum(0)[:bins])
    return torch.cat(parts).view(1, -1)


def _groups(tensors):
    """Indices of tensors grouped by dtype, then cut so a group stays under the chunk
    size; a tensor larger than SMALL_ELEMENTS is a group of its own."""
    by_dtype = collections.OrderedDict()
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for dtype, idx in by_dtype.items():
        cur, cur_n = [], 0
        for i in idx:
            n = tensors[i].numel()
            if n > SMALL_ELEMENTS:
                yield dtype, [i]
                continue
            if cur and cur_n + n > CHUNK_ELEMENTS:
                yield dtype, cur
                cur, cur_n = [], 0
            cur.append(i)
            cur_n += n
        if cur:
            yield dtype, cur


def _group_rows(ts, dtype, sketch_k, hist_bins, device):
    """[g, F] rows of several small tensors: concatenated, summed per segment."""
    g = len(ts)
    if g == 1:
        return _single_row(ts[0], dtype, sketch_k, hist_bins, device)
    numels = [t.numel() for t in ts]
    total = sum(numels)
    f64 = torch.float64
    code, sat, min_normal = limits(dtype)
    counts = _to_device(numels, torch.int64, device)
    # output_size: without it repeat_interleave reads the total back from the device
    seg = torch.repeat_interleave(torch.arange(g, device=device), counts, output_size=total)
    flat = [t.detach().reshape(-1) for t in ts]
    x = torch.cat(flat).to(f64)
    zero = _const(0.0, device)
    finite = torch.isfinite(x)
    isnan = torch.isnan(x)
    xf = torch.where(finite, x, zero)
    ax = xf.abs()
    nonzero = ax > 0
    cols = torch.stack([
        finite.to(f64),
        isnan.to(f64),
        (finite & ~nonzero).to(f64),
        (ax >= sat).to(f64),
        (nonzero & (ax < min_normal)).to(f64),
        xf,
        xf * xf,
    ], dim=1)
    sums = torch.zeros((g, cols.shape[1]), dtype=f64, device=device).index_add_(0, seg, cols)
    n_f, n_nan, n_zero, n_sat, n_sub, s1, s2 = sums.unbind(1)
    nan_t = _const(float("nan"), device)
    has = n_f > 0
    mean = torch.where(has, s1 / n_f.clamp(min=1), nan_t)
    dev = torch.where(finite, x - mean[seg], zero)
    var = torch.zeros(g, dtype=f64, device=device).index_add_(0, seg, dev * dev)
    std = torch.where(has, torch.sqrt(var / n_f.clamp(min=1)), nan_t)
    inf = float("inf")
    mn = torch.full((g,), inf, dtype=f64, device=device).scatter_reduce_(
        0, seg, torch.where(finite, x, _const(inf, device)), "amin")
    mx = torch.full((g,), -inf, dtype=f64, device=device).scatter_reduce_(
        0, seg, torch.where(finite, x, _const(-inf, device)), "amax")
    mn = torch.where(has, mn, nan_t)
    mx = torch.where(has, mx, nan_t)
    l2 = torch.where(has, torch.sqrt(s2), nan_t)
    absmax = torch.maximum(-mn, mx)
    numel_col = counts.to(f64)
    n_inf = numel_col - n_f - n_nan
    code_col = torch.full((g,), float(code), dtype=f64, device=device)
    parts = [torch.stack([numel_col, mn, mx, mean, std, l2, absmax, n_nan, n_inf, n_zero,
                          n_sat, n_sub, code_col], dim=1)]
    if sketch_k > 0:
        pieces = [INDEX_CACHE.get(_segment_index, n, sketch_k, device) for n in numels]
        bucket = torch.cat([p[0] for p in pieces])
        sign = torch.cat([p[1] for p in pieces])
        sk = torch.zeros(g * sketch_k, dtype=f64, device=device).index_add_(
            0, seg * sketch_k + bucket, xf * sign)
        # float32 on the wire: round here too, so both paths hand over the same values.
        parts.append(sk.view(g, sketch_k).to(torch.float32).to(f64))
    if hist_bins > 0:
        b = _hist_bins_of(x, finite, nonzero, hist_bins, device)
        idx = torch.where(b < hist_bins, seg * hist_bins + b, _const(g * hist_bins, device,
                                                                     torch.int64))
        h = torch.zeros(g * hist_bins + 1, dtype=f64, device=device).index_add_(
            0, idx, _const(1.0, device).expand(idx.numel()))
        parts.append(h[:-1].view(g, hist_bins))
    return torch.cat(parts, dim=1)


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
