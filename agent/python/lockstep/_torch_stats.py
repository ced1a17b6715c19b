"""Statistics of many tensors on their own device, batched (docs/statistics.md).

``device_stats(tensors, sketch_k, hist_bins)`` returns one float64 row per tensor, on
the tensors' device, computed with a fixed number of batched torch ops per (dtype,
chunk) group: no host sync, no ``.item()``, no per-tensor ``.cpu()``. It is the path
of every device without a fused kernel (an Ascend NPU through torch_npu, ROCm without
Triton, CUDA with the kernel off), so it uses only dense element-wise ops, dense
reductions along a dimension, ``index_select``, reading indexing and ``bucketize``: no
``histc``, ``bincount``, ``index_add_``, ``scatter_*`` or ``index_put_`` (atomics into
repeated targets: serial or an error in torch's deterministic mode, and an order that
depends on timing), no matmul (cuBLAS asks for a workspace setting in deterministic
mode), and no float64 arithmetic per element (float32 work for fp32/fp16/bf16/fp8;
float64 only on partial sums of 16 elements, per-row and per-tensor results). Every
reduction has a fixed order, so two calls on the same tensors on one device give
bit-identical rows, with deterministic algorithms on or off. The caller copies
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

import numpy as np
import torch

from lockstep import _core, _sketch_hash

# The packed row layout, the sketch and histogram sizes and the dtype codes are defined
# once, in C++ (lockstep/agent/packed_rows.h, types.h, schema/lockstep.fbs).
FIELDS = tuple(_core.PACKED_FIXED_FIELDS)
COL = {name: i for i, name in enumerate(FIELDS)}
SKETCH_COL = len(FIELDS)
DEFAULT_SKETCH_K = _core.DEFAULT_SKETCH_K
MAX_SKETCH_K = _core.MAX_SKETCH_K
HIST_BINS = _core.HIST_BINS

_CODE = _core.DTYPES
_F8E4M3 = getattr(torch, "float8_e4m3fn", None)
_F8E5M2 = getattr(torch, "float8_e5m2", None)

_F16_LIMITS = (_CODE["float16"], 65504.0, 2.0 ** -14)
_LIMITS = {  # code of limit_dtype, max finite (sat if |x| >=), min normal
    torch.float16: _F16_LIMITS,
    torch.bfloat16: (_CODE["bfloat16"], float.fromhex("0x1.FEp127"), 2.0 ** -126),
    torch.float32: _F16_LIMITS,
    torch.float64: _F16_LIMITS,
}
if _F8E4M3 is not None:
    _LIMITS[_F8E4M3] = (_CODE["float8_e4m3fn"], 448.0, 2.0 ** -6)
if _F8E5M2 is not None:
    _LIMITS[_F8E5M2] = (_CODE["float8_e5m2"], 57344.0, 2.0 ** -14)
_NO_LIMITS = (0, float("inf"), 0.0)  # integers, bool: no saturation/subnormal counts


def row_width(sketch_k, hist_bins):
    return len(FIELDS) + sketch_k + hist_bins


def limits(dtype):
    """(limit_dtype code, saturation threshold, min normal) for a tensor dtype."""
    return _LIMITS.get(dtype, _NO_LIMITS)


def _unit(k):
    """Row length U of the working layout: a multiple of 16 (the float32 partial sums)
    and of K (whole sketch blocks), at least PIECE and at least _BLOCKS_PER_ROW blocks
    (so the per-row sketch is a reduction, not a copy)."""
    base = 16 * k // math.gcd(k, 16) if k else 16
    want = max(PIECE, _BLOCKS_PER_ROW * k)
    return base * max(1, -(-want // base))


def _padded(numel, k):
    u = _unit(k)
    return -(-numel // u) * u


def _tensor_blocks(numel, k, device):
    """The block codes of a whole tensor of `numel` elements, padded to the layout."""
    return (_sketch_hash.block_codes(0, _padded(numel, k) // k, k, device),)


def _blocks_slice(numel, k, device, start, length):
    """int64 [2, length / K]: block codes of elements [start, start + length) of a
    tensor of `numel` elements (start, length multiples of K), from the cache when the
    whole tensor's codes fit in it. A model's tensors have the same shapes every step,
    so the hash is computed once."""
    nblocks = _padded(numel, k) // k
    if nblocks * 16 <= INDEX_CACHE.max_bytes:
        codes = INDEX_CACHE.get(_tensor_blocks, numel, k, device)[0]
        return codes[:, start // k:(start + length) // k]
    return _sketch_hash.block_codes(start // k, length // k, k, device)


class _IndexCache:
    """LRU of per-(kind, numel, K, device) hash tensors, bounded in bytes."""

    def __init__(self, max_bytes):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.items = collections.OrderedDict()
        self.lock = threading.Lock()

    def get(self, build, numel, k, device):
        key = (build.__name__, numel, k, _unit(k), str(device))
        return self.get_key(key, lambda: build(numel, k, device))

    def get_key(self, key, build):
        """The entry (a tuple of tensors) under `key`, built by build() on a miss."""
        with self.lock:
            hit = self.items.get(key)
            if hit is not None:
                self.items.move_to_end(key)
                return hit[0]
        entry = build()
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
# Reduction plans and row-to-tensor indices per group layout (the tuple of row counts):
# a model's groups recur every step; dynamic shapes make new ones, so bounded in bytes.
PLAN_CACHE = _IndexCache(64 << 20)
# Elements per batched group and per pass of a larger tensor: bounds the working set
# (8 bytes per element: the work-dtype copy and its zeroed, scaled copy, plus the
# input when a group is concatenated).
CHUNK_ELEMENTS = 1 << 26
# Elements per piece of the slot counting and of the sketch, whose temporaries are
# larger (about 20 bytes per element at K = 32: |x|, the int32 slots and quad indices,
# the packed int64 codes; the signs, the doubled signed blocks, the rotated values):
# ~80 MB at once, in CHUNK_ELEMENTS / _WORK_ELEMENTS pieces per group at most.
_WORK_ELEMENTS = 1 << 22
# The working layout: every tensor starts a new row of U = _unit(K) >= PIECE elements
# (rows padded with NaN, which is counted and then taken off the NaN count). Per-row
# figures come from plain dim-1 reductions; rows go to their tensor through a
# reduction tree (_seg_plan): rows gathered into groups of _TREE (padded with a
# neutral row), reduced along a dimension, repeated until one row per tensor is left.
PIECE = 256
_BLOCKS_PER_ROW = 8
_TREE = 16
# Sums: float32 partial sums of 16 consecutive elements (after an exact power-of-2
# scaling per tensor, so that nothing overflows), added in float64.
_PARTIAL = 16

_small_cache = {}


def _cached(key, build):
    """Small constant tensors (0-d constants, slot tables, reduction plans) per device,
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
    """A small host list (or NumPy array) on `device` without a host sync: pinned,
    non_blocking (a plain torch.tensor(..., device=cuda) copies from pageable memory
    and synchronizes)."""
    if isinstance(values, np.ndarray):
        t = torch.from_numpy(values).to(dtype)
    else:
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


def _pack_table(s, u, device):
    """Counting slots without a histogram: each element's slot has a packed int64 code
    with a 1 in the slot's bit field (fields of ``bits`` bits, wide enough for U,
    ``per`` fields to a word, W words), so the sum of a row's codes is every slot count
    of the row at once, exact. Four consecutive elements share one code: table
    [s^4, W] holds the sum of the codes of every quadruple of slots (s <= 20: at most
    160000 rows, 3.8 MB), which quarters the gathered and summed bytes. Returns
    (table, shifts [per], mask, W, per)."""
    def build():
        bits = u.bit_length()
        per = 63 // bits
        w = -(-s // per)
        one = np.zeros((s, w), dtype=np.int64)
        for i in range(s):
            one[i, i // per] = 1 << (bits * (i % per))
        quad = (one[:, None, None, None] + one[None, :, None, None] +
                one[None, None, :, None] + one[None, None, None, :]).reshape(s ** 4, w)
        shifts = np.arange(per, dtype=np.int64) * bits
        return (_to_device(quad, torch.int64, device), _to_device(shifts, torch.int64, device),
                (1 << bits) - 1, w, per)
    return _cached(("pack", s, u, str(device)), build)


def _row_counts(slot, s, u, device):
    """int64 [P, s]: per row of slot int32 [P, U], how many elements fall in each slot."""
    p = slot.shape[0]
    table, shifts, mask, w, per = _pack_table(s, u, device)
    pair = slot.view(-1, 2)
    pair = torch.add(pair[:, 1], pair[:, 0], alpha=s).view(-1, 2)  # s0 * s + s1
    quad = torch.add(pair[:, 1], pair[:, 0], alpha=s * s)  # index of (s0, s1, s2, s3)
    words = table.index_select(0, quad).view(p, u // 4, w).sum(1)  # [P, W]
    return ((words.unsqueeze(2) >> shifts) & mask).view(p, w * per)[:, :s]


def _sign_table(k, work, device):
    """[512, K] work dtype: row 2 p + f holds the signs (+-1) of sign pattern p, flipped
    when f = 1, for offsets 0..K-1."""
    def build():
        bits = _sketch_hash.patterns(device)[:, :k].to(torch.int8)  # [256, K] 0/1
        both = torch.stack([bits, 1 - bits], dim=1).reshape(2 * _sketch_hash.NUM_PATTERNS, k)
        return (1 - 2 * both).to(work)
    return _cached(("signs", k, str(work), str(device)), build)


def _seg_plan(rows, device):
    """The reduction tree from rows to segments (rows: the row count of each segment,
    consecutive): a list of int64 gather indices, one per level. A level takes each
    segment's rows in groups of _TREE (the last group padded with the index of a
    neutral row appended after the rows), so a segment of r rows becomes
    max(1, ceil(r / _TREE)) rows, until every segment has one. None when there is one
    segment with at least one row (a plain reduction over dim 0)."""
    if len(rows) == 1 and rows[0] >= 1:
        return None

    def build():
        levels = []
        cur = np.asarray(rows, dtype=np.int64)
        while len(cur) and np.any(cur != 1):
            n_in = int(cur.sum())
            out = np.maximum(1, -(-cur // _TREE))
            width = out * _TREE
            total = int(width.sum())
            start_in = np.concatenate([[0], np.cumsum(cur)[:-1]])
            start_w = np.concatenate([[0], np.cumsum(width)[:-1]])
            pos = np.arange(total, dtype=np.int64) - np.repeat(start_w, width)
            src = np.repeat(start_in, width) + pos
            levels.append(_to_device(np.where(pos < np.repeat(cur, width), src, n_in),
                                     torch.int64, device))
            cur = out
        return tuple(levels)
    return PLAN_CACHE.get_key(("plan", tuple(rows), str(device)), build)


def _seg_reduce(v, plan, op):
    """[g, c]: per segment, the sum ("sum") or max ("max") of its rows of v [R, c]."""
    if plan is None:
        return v.sum(0, keepdim=True) if op == "sum" else v.amax(0, keepdim=True)
    c = v.shape[1]
    for idx in plan:
        neutral = torch.full((1, c), 0.0 if op == "sum" else -float("inf"), dtype=v.dtype,
                             device=v.device)
        v = torch.cat([v, neutral]).index_select(0, idx).view(-1, _TREE, c)
        v = v.sum(1) if op == "sum" else v.amax(1)
    return v


def _aminmax(v):
    """(min, max) of each row of v [P, U] (one pass where torch has aminmax)."""
    if hasattr(torch, "aminmax"):
        return torch.aminmax(v, dim=1)
    return v.amin(1), v.amax(1)


def _work_dtype(dtype):
    """float32 for every float type it holds exactly, float64 otherwise."""
    if dtype in (torch.float16, torch.bfloat16, torch.float32) or dtype in (_F8E4M3, _F8E5M2):
        return torch.float32
    return torch.float64


def _pow2_scale(b, work):
    """Per-segment power of two s with |x| * s < 1 for |x| <= b (b [g]; 1/2 where b is
    not finite, as for a segment without finite values), clamped so that s is a normal
    number of the work dtype. None (no scaling) for float64."""
    if work != torch.float32:
        return None
    e = torch.frexp(torch.nan_to_num(b, nan=1.0, posinf=1.0, neginf=1.0))[1]
    return ((127 - e.clamp_(-100, 126)) << 23).view(torch.float32)


def _partial_sums(v, rows, square):
    """float64 [rows]: per row of `v` [rows, U], the sum (or the sum of squares) in
    float32 (work dtype) partials of 16 consecutive elements, added in float64."""
    q = v.view(-1, _PARTIAL)
    if square:
        p = torch.linalg.vector_norm(q, dim=1).to(torch.float64)
        p = p * p
    else:
        p = q.sum(1).to(torch.float64)
    return p.view(rows, v.shape[1] // _PARTIAL).sum(1)


class _Buffer:
    """The views of one pass, in the working layout: x [P, U] (work dtype, NaN-padded
    rows), rowseg [P] (segment of each row), the reduction plan and the host lists."""

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
        self.rows = rows
        self.plan = _seg_plan(rows, device)

        def build():
            small = _to_device(np.repeat(np.arange(g, dtype=np.int64), rows), torch.int64,
                               device)
            return small, _to_device([float(p) for p in pads], torch.float64, device)
        self.rowseg, self.pads_t = PLAN_CACHE.get_key(
            ("rowseg", tuple(rows), tuple(pads), str(device)), build)


def _row_sketch(xs, codes, k, p, u, work, device):
    """[P, K] (work dtype): per row, sketch bucket j = the sum over the row's blocks of
    sign * x at offset (j - r(b)) mod K. Signs from a [512, K] table per block; the
    rotation without a per-element index: each signed block is written twice in a row
    ([nb, 2K]), and block b reads the window of K starting at K - r(b) (an index per
    block). No scatter."""
    nb = p * (u // k)
    signs = _sign_table(k, work, device).index_select(0, codes[1]).unsqueeze(1)
    doubled = (xs.reshape(nb, 1, k).expand(nb, 2, k) * signs).view(nb, 2 * k)
    block = torch.arange(nb, dtype=torch.int64, device=device)
    z = doubled.unfold(1, k, 1)[block, k - codes[0]]  # [nb, K]
    return z.view(p, u // k, k).sum(1)


def _pass1(buf, codes, dtype, work, k, bins, device):
    """Everything but the variance, per segment of `buf`: (minmax [g, 2] float64 (-min,
    max over the finite values; -inf where none), slot counts [g, E + 1] float64,
    (sum, sum of squares) [g, 2] float64, sketch [g, K] float64 or None), and the
    segment's |x| bound [g] (work dtype) for the variance pass."""
    f64 = torch.float64
    inf = float("inf")
    p, u, x = buf.p, buf.u, buf.x
    edges, fold = _slot_table(dtype, work, bins, device)
    s = fold.shape[0]
    xs = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = _aminmax(xs)  # per row; a non-finite value reads as 0 here (fixed below)
    # counts: one bucketing of |x|, counted per row in packed int64 fields; and the
    # smallest finite |x| per row: as integers, |x|'s bits order every finite value
    # below +Inf and NaN (abs clears the sign bit, IEEE 754)
    step = max(1, _WORK_ELEMENTS // u)
    bits = torch.int32 if work == torch.float32 else torch.int64
    counts, min_abs = [], []
    for a in range(0, max(p, 1), step):
        ab = x[a:a + step].abs()
        min_abs.append(ab.view(bits).amin(1))
        counts.append(_row_counts(torch.bucketize(ab, edges, out_int32=True), s, u, device))
        del ab
    counts = counts[0] if len(counts) == 1 else torch.cat(counts)
    min_abs = (min_abs[0] if len(min_abs) == 1 else torch.cat(min_abs)).view(work)
    # min / max of the finite values per row, then per segment (exact). The zeros that
    # stand for NaN/Inf in xs matter only in a row with NaN/Inf and no finite zero
    # whose min (max) came out 0: all its finite values are > 0 (< 0), so its min (max)
    # is +min|x| (-min|x|); a row without finite values has none (+Inf, -Inf).
    n_nonfinite = counts[:, s - 1] + counts[:, s - 2]
    fake = (n_nonfinite > 0) & (counts[:, 0] == 0)
    lo = torch.where(fake & (lo == 0), min_abs, lo)
    hi = torch.where(fake & (hi == 0), -min_abs, hi)
    none = n_nonfinite == u
    lo = torch.where(none, _const(inf, device, work), lo)
    hi = torch.where(none, _const(-inf, device, work), hi)
    minmax = _seg_reduce(torch.stack([-lo, hi], dim=1), buf.plan, "max")
    bound = torch.maximum(minmax[:, 0], minmax[:, 1])  # -inf where nothing is finite
    scale = _pow2_scale(bound, work)
    if scale is not None:  # exact: a power of two per segment
        xs.mul_(scale.index_select(0, buf.rowseg).unsqueeze(1))
    parts = [_partial_sums(xs, p, False).unsqueeze(1), _partial_sums(xs, p, True).unsqueeze(1),
             counts.to(f64)]
    if k:
        bpr = u // k  # blocks per row
        sk = [_row_sketch(xs[a:a + step], codes[:, a * bpr:(a + step) * bpr], k,
                          min(step, p - a), u, work, device) for a in range(0, max(p, 1), step)]
        parts.append((sk[0] if len(sk) == 1 else torch.cat(sk)).to(f64))
    del xs
    seg = _seg_reduce(torch.cat(parts, dim=1), buf.plan, "sum")
    counts = seg[:, 2:2 + s] - torch.nn.functional.pad(buf.pads_t.unsqueeze(1), (s - 1, 0))
    s1, s2 = seg[:, 0], seg[:, 1]
    sketch = seg[:, 2 + s:] if k else None
    if scale is not None:
        sc = scale.to(f64)
        s1, s2 = s1 / sc, s2 / (sc * sc)
        if k:
            sketch = sketch / sc.unsqueeze(1)
    return minmax.to(f64), counts, torch.stack([s1, s2], dim=1), sketch, bound


def _pass2(buf, bound, m, work, device):
    """float64 [g, 2]: sums over the finite values of d = x - m and of d^2, with m [g]
    the mean rounded to the work dtype (float32 partials of scaled deviations, float64
    beyond). The sum of d corrects both the mean and the variance (corrected two-pass
    algorithm): the deviations are small, so their sums are accurate relative to std."""
    f64 = torch.float64
    p, x, rowseg = buf.p, buf.x, buf.rowseg
    scale = _pow2_scale(torch.maximum(bound, m.abs()), work)
    if scale is None:
        dev = x - m.index_select(0, rowseg).unsqueeze(1)
    else:  # x * s - m * s: the products are exact (powers of two), one rounding
        dev = torch.addcmul((-m * scale).index_select(0, rowseg).unsqueeze(1), x,
                            scale.index_select(0, rowseg).unsqueeze(1))
    dev = torch.nan_to_num(dev, nan=0.0, posinf=0.0, neginf=0.0)
    seg = _seg_reduce(torch.stack([_partial_sums(dev, p, False),
                                   _partial_sums(dev, p, True)], dim=1), buf.plan, "sum")
    if scale is None:
        return seg
    sc = scale.to(f64)
    return torch.stack([seg[:, 0] / sc, seg[:, 1] / (sc * sc)], dim=1)


def _fold(counts, fold):
    """counts [g, S] x fold [S, C] without a matmul (cuBLAS asks for a workspace setting
    in deterministic mode): exact, small."""
    return (counts.unsqueeze(2) * fold.unsqueeze(0)).sum(1)


def _finish_rows(numel, folded, m, s2, dev, minmax, sketch, code, bins, device):
    """[g, F] rows from per-segment reductions (dev: sums of d = x - m and d^2, m the
    mean rounded to the work dtype, in float64)."""
    f64 = torch.float64
    n_nan, n_inf = folded[:, bins + 3], folded[:, bins + 4]
    n_f = numel - n_inf - n_nan
    d1, d2 = dev[:, 0], dev[:, 1]
    mean = m + d1 / n_f
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


def _group_rows(ts, dtype, sketch_k, hist_bins, device):
    """[g, F] rows of g tensors of one dtype: one set of kernels for the whole group,
    or, for a tensor above CHUNK_ELEMENTS alone, the same in passes of about that many
    elements (two passes: the variance needs the mean)."""
    f64 = torch.float64
    k, bins = sketch_k, hist_bins
    work = _work_dtype(dtype)
    u = _unit(k)
    _, fold = _slot_table(dtype, work, bins, device)
    numels = [t.numel() for t in ts]
    numel = _to_device([float(n) for n in numels], f64, device)
    code = limits(dtype)[0]
    flats = [t.detach().reshape(-1) for t in ts]
    if len(ts) == 1 and numels[0] > CHUNK_ELEMENTS:
        n = numels[0]
        step = max(1, CHUNK_ELEMENTS // u) * u  # whole rows (and sketch blocks)
        slices = [(a, min(n, a + step)) for a in range(0, n, step)]
    else:
        slices = [None]
    bufs, res = [], []
    for sl in slices:
        if sl is None:
            buf = _Buffer(flats, dtype, work, u, device)
            codes = None
            if k:
                codes = [_blocks_slice(nn, k, device, 0, _padded(nn, k)) for nn in numels]
                codes = codes[0] if len(codes) == 1 else torch.cat(codes, dim=1)
        else:
            a, b = sl
            buf = _Buffer([flats[0][a:b]], dtype, work, u, device)
            codes = _blocks_slice(numels[0], k, device, a, _padded(b - a, k)) if k else None
        bufs.append(buf)
        res.append(_pass1(buf, codes, dtype, work, k, bins, device))
        if len(slices) > 1:
            buf.x = None  # rebuilt for the second pass: one pass's copy at a time
    if len(res) == 1:
        minmax, counts, s12, sketch, _ = res[0]
    else:
        minmax = torch.stack([r[0] for r in res]).amax(0)
        counts = torch.stack([r[1] for r in res]).sum(0)
        s12 = torch.stack([r[2] for r in res]).sum(0)
        sketch = torch.stack([r[3] for r in res]).sum(0) if k else None
    folded = _fold(counts, fold)
    n_f = numel - folded[:, bins + 3] - folded[:, bins + 4]
    m = (s12[:, 0] / n_f).to(work)  # NaN where nothing is finite (0 / 0)
    dev = None
    for sl, buf, r in zip(slices, bufs, res):
        if buf.x is None:
            a, b = sl
            buf = _Buffer([flats[0][a:b]], dtype, work, u, device)
        d = _pass2(buf, r[4], m, work, device)
        dev = d if dev is None else dev + d
    return _finish_rows(numel, folded, m.to(f64), s12[:, 1], dev, minmax, sketch, code,
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
