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


def sketch_index(numel, k, device):
    """(bucket int64 [numel], negative bool [numel]) for the flat indices 0..numel-1."""
    nblocks = (numel + k - 1) // k
    b = torch.arange(nblocks, dtype=torch.int64, device=device)
    h1 = hash_index(b, ROT_SEED)
    rot = (h1 * k) >> 32
    h2 = mix32(h1 ^ PAT_SEED)
    pat = h2 >> 24
    flip = ((h2 >> 23) & 1).bool()
    i = torch.arange(numel, dtype=torch.int64, device=device)
    blk = torch.div(i, k, rounding_mode="floor")
    o = i - blk * k
    bucket = (o + rot[blk]) % k
    neg = _patterns(device)[pat[blk], o] ^ flip[blk]
    return bucket, neg


class _IndexCache:
    """LRU of per-(numel, K, device) (bucket, sign) tensors, bounded in bytes: a model's
    tensors have the same shapes every step, so the hash is computed once."""

    def __init__(self, max_bytes):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.items = collections.OrderedDict()
        self.lock = threading.Lock()

    def get(self, numel, k, device):
        key = (numel, k, str(device))
        with self.lock:
            hit = self.items.get(key)
            if hit is not None:
                self.items.move_to_end(key)
                return hit
        bucket, neg = sketch_index(numel, k, device)
        sign = 1.0 - 2.0 * neg.to(torch.float64)
        entry = (bucket, sign)
        size = numel * 16
        if size <= self.max_bytes:
            with self.lock:
                self.items[key] = entry
                self.bytes += size
                while self.bytes > self.max_bytes and self.items:
                    _, (ob, _) = self.items.popitem(last=False)
                    self.bytes -= ob.numel() * 16
        return entry


INDEX_CACHE = _IndexCache(256 << 20)
# Elements per batched group: bounds the float64 working set (~10 copies of 8 bytes).
CHUNK_ELEMENTS = 1 << 24


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
    g = len(ts)
    numels = [t.numel() for t in ts]
    total = sum(numels)
    f64 = torch.float64
    code, sat, min_normal = limits(dtype)
    counts = torch.tensor(numels, dtype=torch.int64, device=device)
    seg = torch.repeat_interleave(torch.arange(g, device=device), counts)
    flat = [t.detach().reshape(-1) for t in ts]
    x = (torch.cat(flat) if len(flat) > 1 else flat[0]).to(f64)
    finite = torch.isfinite(x)
    isnan = torch.isnan(x)
    xf = torch.where(finite, x, torch.zeros((), dtype=f64, device=device))
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
    nan_t = torch.full((), float("nan"), dtype=f64, device=device)
    has = n_f > 0
    mean = torch.where(has, s1 / n_f.clamp(min=1), nan_t)
    dev = torch.where(finite, x - mean[seg], torch.zeros((), dtype=f64, device=device))
    var = torch.zeros(g, dtype=f64, device=device).index_add_(0, seg, dev * dev)
    std = torch.where(has, torch.sqrt(var / n_f.clamp(min=1)), nan_t)
    inf = float("inf")
    mn = torch.full((g,), inf, dtype=f64, device=device).scatter_reduce_(
        0, seg, torch.where(finite, x, torch.full((), inf, dtype=f64, device=device)), "amin")
    mx = torch.full((g,), -inf, dtype=f64, device=device).scatter_reduce_(
        0, seg, torch.where(finite, x, torch.full((), -inf, dtype=f64, device=device)), "amax")
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
        pieces = [INDEX_CACHE.get(n, sketch_k, device) for n in numels]
        bucket = torch.cat([p[0] for p in pieces]) if g > 1 else pieces[0][0]
        sign = torch.cat([p[1] for p in pieces]) if g > 1 else pieces[0][1]
        sk = torch.zeros(g * sketch_k, dtype=f64, device=device).index_add_(
            0, seg * sketch_k + bucket, xf * sign)
        # float32 on the wire: round here too, so both paths hand over the same values.
        parts.append(sk.view(g, sketch_k).to(torch.float32).to(f64))
    if hist_bins > 0:
        e = ((x.view(torch.int64) >> 52) & 0x7FF) - 1023  # floor(log2|x|) for normal x
        b = torch.clamp(2 + ((e + 40) >> 2), 1, hist_bins - 1)
        b = torch.where(nonzero, b, torch.zeros_like(b))
        idx = torch.where(finite, seg * hist_bins + b, torch.full_like(b, g * hist_bins))
        h = torch.zeros(g * hist_bins + 1, dtype=f64, device=device).index_add_(
            0, idx, torch.ones_like(x))
        parts.append(h[:-1].view(g, hist_bins))
    return torch.cat(parts, dim=1)


def device_stats(tensors, sketch_k=DEFAULT_SKETCH_K, hist_bins=HIST_BINS):
    """float64 [N, F] statistics of `tensors` (all on one device), on that device.

    Raises ValueError for a bad sketch_k / hist_bins or tensors on several devices
    (the caller, lockstep's recorder, catches and counts it)."""
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
        out = torch.empty((n, width), dtype=torch.float64, device=device)
        for dtype, idx in _groups(tensors):
            ts = [tensors[i] for i in idx]
            if dtype.is_complex:
                ts = [t.abs() for t in ts]
                dtype = ts[0].dtype
            rows = _group_rows(ts, dtype, sketch_k, hist_bins, device)
            if len(idx) == n:
                out = rows
            else:
                out.index_copy_(0, torch.tensor(idx, dtype=torch.int64, device=device), rows)
        return out
