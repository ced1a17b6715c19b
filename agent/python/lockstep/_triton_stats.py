"""Fused statistics of CUDA tensors in Triton: one read of each tensor gives its whole row.

``device_stats(tensors, sketch_k, hist_bins)`` has the signature and the row layout of
``_torch_stats.device_stats`` (``FIELDS``, then ``sketch[K]``, then ``hist[16]``; the
definitions of docs/statistics.md) and is what ``DevicePipeline`` calls. Per call it
uses the fused kernel for the CUDA tensors of the dtypes it reads natively (fp32, fp16,
bf16, fp8 e4m3fn / e5m2) when ``available()`` says so, and ``_torch_stats.device_stats``
for everything else (fp64, integers, bool, complex, other devices), so the caller never
sees a difference but speed.

The kernel (one launch per dtype group, no atomics, fixed reduction order):
  * a table of the group's tensors (element offset from a base pointer, numel, first
    tile, tile count) and one tile id per program; a tile is ``ITERS`` iterations of
    ``NB`` sketch blocks of ``K`` consecutive elements (``K`` lanes padded to a power of
    two), so every tile starts on a sketch block;
  * per block the count-sketch hash of docs/statistics.md (rotation ``r(b)``, pattern
    ``p(b)``, flip), in int64 arithmetic exactly as ``_sketch_hash.hash_index`` (one hash
    per K elements); the element of lane ``j`` is loaded from block offset
    ``(j - r(b)) mod K``, so lane ``j`` *is* bucket ``j`` and the sketch is a plain sum
    over blocks (no scatter, no one-hot over buckets);
  * each element widened exactly to float32: fp32 / fp16 by conversion, bf16 and fp8
    loaded as integers and decoded from their bits (``_triton_kernels.widen``);
  * every statistic accumulates per slot (row, lane) in registers over the tile's
    iterations, and is reduced across the block once, at the tile's end: the finite
    values' min / max; 20 counts in 8-bit fields of int32 words (the 16 log2 bins, NaN,
    Inf, and the saturation / subnormal counts by comparison against the limit dtype's
    thresholds; a slot sees at most ITERS <= 255 elements, so the fields never carry);
    and in float64 the sums of ``d = x - c`` and ``d^2`` around a shift ``c`` per slot
    (its first element), the sketch's signed sums likewise; at the tile's end the slots'
    means and ``M2 = sum d^2 - (sum d)^2 / n`` merge with Chan's parallel formula.
    Masked lanes (past a tensor's end, the padding lanes of K < KP) load as NaN and
    are taken off the NaN count. Four blocks are loaded per loop trip before any is
    used, so that a thread has several loads in flight (measured on an H200: one
    reduction across the block per iteration held the first version to 4 % of the
    copy bandwidth, docs/performance.md);
  * each tile writes one float64 partial row ``[tiles, PW]``; a second kernel (one
    program per tensor) adds its tiles in fixed order, merges their moments (Chan: the
    variance needs no second read of the data) and writes the final row.

Feature check: ``available(device, sketch_k, hist_bins)`` is True only when triton
imports, the device is CUDA, ``LOCKSTEP_STATS_KERNEL`` (auto | triton | torch, default
auto) allows it, and a one-time self-check on that device and configuration passes:
a fixed set of tensors (mixed dtypes, NaN, +-Inf, zeros, subnormals, values at the
dtype's limit, an empty tensor, a multi-tile tensor, a strided view) through this
kernel and through ``_torch_stats.device_stats``, compared within the tolerance of
docs/statistics.md. A disagreement, or any exception (also a later one at run time),
warns once (``RuntimeWarning`` naming the field) and turns the kernel off for the rest
of the process: an unverified kernel is used only where it agrees with the tested path.
"""
import contextlib
import os
import threading
import warnings

import numpy as np
import torch

from lockstep import _sketch_hash
from lockstep import _torch_stats as _ts

ENV = "LOCKSTEP_STATS_KERNEL"
_MODES = ("auto", "triton", "torch")

# Float dtypes the kernel reads in place (the limit thresholds are those of _torch_stats).
_NATIVE = [torch.float32, torch.float16, torch.bfloat16]
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if getattr(torch, _name, None) is not None:
        _NATIVE.append(getattr(torch, _name))
_NATIVE = tuple(_NATIVE)
# How the kernel reads each: (FMT of _triton_kernels.widen, the dtype it loads). bf16 and
# fp8 are loaded as integers and decoded from their bits (exact, every architecture).
_FORMATS = {torch.float32: (0, None), torch.float16: (0, None),
            torch.bfloat16: (1, torch.int16)}
for _name, _fmt in (("float8_e4m3fn", 2), ("float8_e5m2", 3)):
    if getattr(torch, _name, None) is not None:
        _FORMATS[getattr(torch, _name)] = (_fmt, torch.uint8)

ITERS = 64         # iterations per tile (a multiple of 4, <= 255): 65536 elements at K=32
LANES = 1024       # elements (padded lanes) per iteration: 4 slots a thread at 8 warps
NUM_WARPS = 8
FINISH_TILES = 64  # tiles per step of the finishing kernel
_SCALARS = 8       # partial row: S, M2, Q, min, max, sat, sub, n_finite
_CLASSES = 32      # then 32 class counts (0..15 histogram, 16 NaN, 17 Inf), then sketch

_lock = threading.Lock()
_state = {"triton": None, "disabled": None, "checked": {}, "warned": set()}
_kernels = {}


def _warn_once(key, message):
    with _lock:
        if key in _state["warned"]:
            return
        _state["warned"].add(key)
    warnings.warn("lockstep: " + message, RuntimeWarning, stacklevel=3)


def mode():
    """LOCKSTEP_STATS_KERNEL: auto (the kernel where it is available and verified),
    triton (the same, but say so when it is not available), torch (never the kernel)."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in _MODES:
        _warn_once(("mode", value), "%s=%r is not one of auto, triton, torch; using auto."
                   % (ENV, value))
        return "auto"
    return value


def _triton():
    """(triton, triton.language) or None; imported once."""
    with _lock:
        mod = _state["triton"]
    if mod is None:
        try:
            import triton  # pylint: disable=import-outside-toplevel
            import triton.language as tl  # pylint: disable=import-outside-toplevel
            mod = (triton, tl)
        except Exception:  # pylint: disable=broad-except  (absent or broken: torch path)
            mod = False
        with _lock:
            _state["triton"] = mod
    return mod or None


def disable(reason):
    """Turns the kernel off for the rest of the process, with one warning."""
    with _lock:
        already = _state["disabled"] is not None
        if not already:
            _state["disabled"] = reason
    if not already:
        _warn_once(("disabled",), "the fused Triton statistics kernel is off (%s); the torch "
                   "statistics are used instead (same results, slower)." % reason)


def disabled_reason():
    return _state["disabled"]


def _reset_for_tests():
    with _lock:
        _state.update(disabled=None, checked={}, warned=set())


def available(device=None, sketch_k=_ts.DEFAULT_SKETCH_K, hist_bins=_ts.HIST_BINS):
    """True when the fused kernel is used for tensors on `device` (a torch.device, a
    string, a tensor, or None for the current CUDA device) with this configuration:
    triton imports, the device is CUDA, LOCKSTEP_STATS_KERNEL allows it, and the
    self-check passed (run here on first use: one host sync, once per device and
    configuration). Never raises."""
    try:
        m = mode()
        if m == "torch" or _state["disabled"] is not None:
            return False
        if isinstance(device, torch.Tensor):
            device = device.device
        if device is None:
            if not torch.cuda.is_available():
                if m == "triton":
                    _warn_once(("forced",), "%s=triton but there is no CUDA device; using "
                               "the torch statistics." % ENV)
                return False
            device = torch.device("cuda", torch.cuda.current_device())
        device = torch.device(device)
        if device.type != "cuda":
            if m == "triton":
                _warn_once(("forced",), "%s=triton but the tensors are on %s "
                           "(the kernel is for CUDA); using the torch statistics."
                           % (ENV, device.type))
            return False
        if _triton() is None:
            if m == "triton":
                _warn_once(("forced",), "%s=triton but triton does not import; using the "
                           "torch statistics." % ENV)
            return False
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        key = (device.index, int(sketch_k), int(hist_bins))
        with _lock:
            done = _state["checked"].get(key)
        if done is None:
            done = _self_check(device, int(sketch_k), int(hist_bins))
            with _lock:
                _state["checked"][key] = done
        return bool(done) and _state["disabled"] is None
    except Exception as e:  # pylint: disable=broad-except
        disable("the feature check raised %s: %s" % (type(e).__name__, e))
        return False


def device_stats(tensors, sketch_k=_ts.DEFAULT_SKETCH_K, hist_bins=_ts.HIST_BINS):
    """float64 [N, F] rows of `tensors` (one device), as _torch_stats.device_stats:
    the fused kernel for the CUDA float groups where available(), the torch path for
    the rest. Raises ValueError exactly where _torch_stats.device_stats does."""
    valid = (0 <= sketch_k <= _ts.MAX_SKETCH_K and hist_bins in (0, _ts.HIST_BINS)
             and tensors and all(t.device == tensors[0].device for t in tensors))
    if not valid or not available(tensors[0].device, sketch_k, hist_bins):
        return _ts.device_stats(tensors, sketch_k, hist_bins)
    try:
        return _mixed_stats(tensors, sketch_k, hist_bins)
    except Exception as e:  # pylint: disable=broad-except
        disable("it raised %s: %s" % (type(e).__name__, e))
        return _ts.device_stats(tensors, sketch_k, hist_bins)


def _mixed_stats(tensors, sketch_k, hist_bins):
    """Fused rows for the native dtype groups, torch rows for the others, in order."""
    device = tensors[0].device
    groups = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype if t.dtype in _NATIVE else None, []).append(i)
    order, parts = [], []
    with torch.no_grad():
        for dtype, idx in groups.items():
            ts = [tensors[i] for i in idx]
            if dtype is None:
                parts.append(_ts.device_stats(ts, sketch_k, hist_bins))
            else:
                parts.append(fused_stats(ts, sketch_k, hist_bins))
            order.extend(idx)
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        n = len(tensors)
        if order != list(range(n)):
            inverse = [0] * n
            for pos, i in enumerate(order):
                inverse[i] = pos
            out = out.index_select(0, _ts._to_device(inverse, torch.int64, device))
        return out


# ---- the kernels ------------------------------------------------------------------
def _build_kernels():
    """The two Triton kernels (lockstep/_triton_kernels.py, imported on first use)."""
    if not _kernels:
        from lockstep import _triton_kernels  # pylint: disable=import-outside-toplevel
        _kernels.update(tile=_triton_kernels.tile_kernel,
                        finish=_triton_kernels.finish_kernel)
    return _kernels


_pattern_cache = {}


def _pattern_words(device):
    """int32 [256 * 8]: bit o of sign pattern p is bit (o % 32) of word p * 8 + o // 32
    (bit(p, o) = H(p * 256 + o, SIGN_SEED) >> 31, as _sketch_hash.patterns)."""
    key = str(device)
    t = _pattern_cache.get(key)
    if t is None:
        idx = torch.arange(_sketch_hash.NUM_PATTERNS * _sketch_hash.PATTERN_BITS, dtype=torch.int64)
        bits = (_sketch_hash.hash_index(idx, _sketch_hash.SIGN_SEED) >> 31).view(_sketch_hash.NUM_PATTERNS, 8, 32)
        words = (bits << torch.arange(32, dtype=torch.int64)).sum(2).reshape(-1)
        words = words - (words >= 2 ** 31).to(torch.int64) * 2 ** 32
        t = words.to(torch.int32).to(device)
        _pattern_cache[key] = t
    return t


def _layout(sketch_k):
    """(KL block width, KP lanes, NB blocks per iteration, tile elements)."""
    kl = sketch_k if sketch_k else 32
    kp = 1 << (kl - 1).bit_length()
    nb = max(1, LANES // kp)
    return kl, kp, nb, kl * nb * ITERS


def tile_table(numels, ptrs, esize, tile):
    """(int64 table, index of the base tensor, tile count) of one launch: per tensor
    (element offset from the base tensor, numel, first tile, tiles), then per tile its
    tensor. The base is the lowest address of a non-empty tensor, so offsets are >= 0."""
    g = len(numels)
    numels = np.asarray(numels, dtype=np.int64).reshape(g)
    ptrs = np.asarray(ptrs, dtype=np.uint64).astype(np.int64).reshape(g)
    live = numels > 0
    base_i = int(np.argmin(np.where(live, ptrs, np.iinfo(np.int64).max))) if live.any() else 0
    diff = np.where(live, ptrs - ptrs[base_i], 0)
    if np.any(diff % esize):
        raise RuntimeError("a tensor's address is not a multiple of its element size")
    ntiles = (numels + tile - 1) // tile
    first = np.concatenate([[0], np.cumsum(ntiles)[:-1]]).astype(np.int64)
    n_tiles = int(ntiles.sum())
    host = np.empty(g * 4 + n_tiles, dtype=np.int64)
    host[0:g * 4:4] = diff // esize
    host[1:g * 4:4] = numels
    host[2:g * 4:4] = first
    host[3:g * 4:4] = ntiles
    host[g * 4:] = np.repeat(np.arange(g, dtype=np.int64), ntiles)
    return host, base_i, n_tiles


def fused_stats(tensors, sketch_k=_ts.DEFAULT_SKETCH_K, hist_bins=_ts.HIST_BINS):
    """float64 [g, F] rows of CUDA tensors of ONE native dtype: two kernel launches
    (tiles, finish) and one small host-to-device copy of the table; no host sync."""
    dtype = tensors[0].dtype
    device = tensors[0].device
    kern = _build_kernels()
    code, sat, min_normal = _ts.limits(dtype)
    kl, kp, nb, tile = _layout(sketch_k)
    sketch = sketch_k > 0
    pw = _SCALARS + _CLASSES + (kp if sketch else 0)
    width = _ts.row_width(sketch_k, hist_bins)
    flats = [t.detach() if t.is_contiguous() else t.detach().contiguous() for t in tensors]
    g = len(flats)
    host, base_i, n_tiles = tile_table([f.numel() for f in flats],
                                       [f.data_ptr() for f in flats],
                                       flats[0].element_size(), tile)
    tab = torch.from_numpy(host)
    cuda = device.type == "cuda"
    if cuda:
        try:
            tab = tab.pin_memory()
        except RuntimeError:
            pass
    tab = tab.to(device, non_blocking=True)
    out = torch.empty((g, width), dtype=torch.float64, device=device)
    part = torch.empty((max(1, n_tiles), pw), dtype=torch.float64, device=device)
    pat = _pattern_words(device)
    fmt, as_int = _FORMATS[dtype]
    base = flats[base_i] if as_int is None else flats[base_i].view(as_int)
    # (CPU tensors reach here only from the tests, with the kernels run by Triton's
    # interpreter: available() never picks the kernel for them)
    with torch.cuda.device(device) if cuda else contextlib.nullcontext():
        if n_tiles:
            kern["tile"][(n_tiles,)](
                base, tab, tab[g * 4:], part, pat, float(sat), float(min_normal),
                K=sketch_k, KL=kl, KP=kp, NB=nb, ITERS=ITERS, PW=pw, SKETCH=sketch,
                FMT=fmt, num_warps=NUM_WARPS)
        kern["finish"][(g,)](part, tab, out, float(code), K=sketch_k, KP=kp,
                             BINS=hist_bins > 0, PW=pw, W=width, TC=FINISH_TILES,
                             SKETCH=sketch, num_warps=4)
    return out


# ---- the self-check ---------------------------------------------------------------
def check_tensors(device):
    """The fixed tensors of the self-check (and of the tests): every dtype the kernel
    reads, NaN, +-Inf, +-0, subnormals, values at and beyond the limit thresholds, a
    constant tensor, a large mean over a small spread, an empty tensor, a tensor of
    several tiles, a transposed view."""
    gen = torch.Generator().manual_seed(1234)
    out = []
    for dtype in _NATIVE:
        x = torch.randn(5000, generator=gen, dtype=torch.float64) * 3 + 0.5
        pick = torch.randint(0, 60, (5000,), generator=gen)
        lim = _ts.limits(dtype)
        specials = {0: float("nan"), 1: float("inf"), 2: float("-inf"), 3: 0.0, 4: -0.0,
                    5: lim[2] / 4, 6: -lim[2] * 0.75, 7: min(lim[1], 3e38), 8: 1e-40,
                    9: 2.0 ** -30}
        for c, v in specials.items():
            x[pick == c] = v
        if dtype in (torch.float32, torch.float16, torch.bfloat16):
            x[pick == 10] = -65504.0
            x[pick == 11] = 70000.0
        out.append(x.to(dtype))
    out.append(torch.full((3000,), 7.25, dtype=torch.float32))
    out.append(1000.0 + torch.randn(40000, generator=gen) * 1e-3)
    out.append(torch.zeros(0, dtype=torch.bfloat16))
    out.append(torch.full((17,), float("nan"), dtype=torch.float16))
    out.append((torch.randn(70001, generator=gen) * 1e-20).to(torch.float32))
    out.append(torch.randn(100, 300, generator=gen).to(torch.bfloat16).t())
    return [t.to(device) for t in out]


def compare_rows(got, want, sketch_k, hist_bins, limit=1):
    """None when `got` agrees with `want` (float64 [N, F] on the host) within the
    tolerance of docs/statistics.md, else 'row i field f: got a want b' for the first
    `limit` disagreements, joined by '; '."""
    bad = []
    for i in range(want.shape[0]):
        for msg in _row_disagreements(got[i], want[i], sketch_k, hist_bins):
            bad.append("row %d field %s" % (i, msg))
            if len(bad) >= limit:
                return "; ".join(bad)
    return "; ".join(bad) if bad else None


def _row_disagreements(g, w, sketch_k, hist_bins):
    """Yields 'f: got a want b' for each field of row g outside the tolerance."""
    col = _ts.COL
    exact = ("numel", "min", "max", "absmax", "nan", "inf", "zero", "sat", "subnormal",
             "limit_dtype")
    for f in exact:
        a, b = float(g[col[f]]), float(w[col[f]])
        if not (a == b or (a != a and b != b)):
            yield "%s: got %r want %r" % (f, a, b)
    absmax = 0.0 if w[col["absmax"]] != w[col["absmax"]] else float(w[col["absmax"]])
    std = 0.0 if w[col["std"]] != w[col["std"]] else float(w[col["std"]])
    for f in ("mean", "std", "l2"):
        a, b = float(g[col[f]]), float(w[col[f]])
        if b != b:
            if a == a:
                yield "%s: got %r want nan" % (f, a)
            continue
        tol = (1e-6 * (abs(b) + std) + 1e-7 * absmax if f == "mean"
               else 1e-6 * abs(b)) + 1e-300
        if not abs(a - b) <= tol:
            yield "%s: got %r want %r" % (f, a, b)
    l2 = float(w[col["l2"]]) if w[col["l2"]] == w[col["l2"]] else 0.0
    k0 = _ts.SKETCH_COL
    for j in range(sketch_k):
        a, b = float(g[k0 + j]), float(w[k0 + j])
        if a != b and not abs(a - b) <= 1e-5 * l2 + 1e-30:  # (equal: also +-inf)
            yield "sketch[%d]: got %r want %r" % (j, a, b)
    for j in range(hist_bins):
        a, b = float(g[k0 + sketch_k + j]), float(w[k0 + sketch_k + j])
        if a != b:
            yield "hist[%d]: got %r want %r" % (j, a, b)


def _self_check(device, sketch_k, hist_bins):
    """Runs the check tensors through the kernel and the torch path; True when they
    agree. Otherwise (or on any exception) turns the kernel off with one warning."""
    old = None
    if device.type == "cuda" and hasattr(torch.cuda, "get_sync_debug_mode"):
        old = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)  # this one sync is deliberate, and only once
    try:
        ts = check_tensors(device)
        with torch.no_grad():
            want = _ts.device_stats(ts, sketch_k, hist_bins).cpu().numpy()
            try:
                got = _mixed_stats(ts, sketch_k, hist_bins).cpu().numpy()
                bad = compare_rows(got, want, sketch_k, hist_bins, limit=3)
                problem = None if bad is None else \
                    "it disagreed with the torch statistics at %s" % bad
            except Exception as e:  # pylint: disable=broad-except
                problem = "it raised %s: %s" % (type(e).__name__, e)
        if problem is not None:
            disable("self-check: " + problem)
            return False
        return True
    except Exception as e:  # pylint: disable=broad-except
        disable("its self-check raised %s: %s" % (type(e).__name__, e))
        return False
    finally:
        if old is not None:
            torch.cuda.set_sync_debug_mode(old)
