"""lockstep/_triton_stats.py: the fused Triton statistics kernel, its feature check and
its fallback (docs/statistics.md, docs/python.md "The fused statistics kernel").

Everywhere (CI has no GPU and no Triton): the feature check says no and the torch
path runs, LOCKSTEP_STATS_KERNEL=triton warns once and falls back, the self-check
turns a disagreeing kernel off naming the field, and the kernel's algorithm (tile
table, sign-pattern words, rotated lanes, per-block moments merged with Chan's
formula) is emulated in NumPy against the float64 reference.
On a CUDA device with Triton: the kernel, the torch path and the C++ host kernel on
the same tensors, within the documented tolerance (min/max/counts/histogram exact).
Where triton is installed (the torch 2.x stack), with or without a GPU: the same kernel
source run by Triton's interpreter on CPU tensors, through the production launch
(fused_stats, _mixed_stats, _self_check), on the same cases at smaller sizes, against
the torch path, the host kernel and the float64 reference; the sketch bit for bit where
its sums are exact. What the interpreter cannot check: docs/statistics.md, "Under
Triton's interpreter", and the section of that name below.
"""
import importlib.util
import math
import os
import sys
import warnings

import numpy as np
import pytest
import torch

from lockstep import _sketch_hash
from lockstep import _torch_stats as tst
from lockstep import _triton_stats as trs

try:
    from lockstep import _core
    HOST_STATS = getattr(_core, "host_stats", None)
except Exception:  # pragma: no cover - depends on the build
    _core = None
    HOST_STATS = None

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "lockstep_torch_stats_test_ref", os.path.join(_HERE, "torch_stats_test.py"))
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)  # reference(), check_row(), specials_tensor()

C = tst.COL
K0 = tst.SKETCH_COL
HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
# Triton's interpreter is chosen per process, before triton is imported (its own
# library, tl.zeros, tl.cdiv, ..., is made of @triton.jit functions that are interpreted
# or compiled from then on). Without CUDA (CI) this module turns it on, here rather
# than in the ctest entry's environment: on a machine with a GPU the same entry then
# compiles the kernel for the GPU tests instead (TRITON_INTERPRET=1 set by hand runs
# the interpreter tests there and skips the GPU ones).
# (If triton was imported before this module, the interpreter tests error, never skip.)
INTERPRET = HAS_TRITON and (not HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1")
if INTERPRET and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"
GPU = pytest.mark.skipif(not (HAS_CUDA and HAS_TRITON) or INTERPRET,
                         reason="needs a CUDA device and triton, compiled (cuda %s, triton "
                         "%s, TRITON_INTERPRET %s)" % (HAS_CUDA, HAS_TRITON, INTERPRET))


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.delenv(trs.ENV, raising=False)
    trs._reset_for_tests()
    yield
    trs._reset_for_tests()


# ---- everywhere: the feature check and the fallback ---------------------------------
def test_cpu_tensors_are_never_the_kernels_and_rows_equal_the_torch_path():
    ts = [ref.specials_tensor(n, dt, n) for n, dt in
          ((700, torch.float32), (33, torch.bfloat16), (0, torch.float16), (90, torch.float64))]
    assert not trs.available(torch.device("cpu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = trs.device_stats(ts, 32, 16)
    assert not [w for w in caught if "lockstep" in str(w.message)]  # auto: a quiet fallback
    want = tst.device_stats(ts, 32, 16)
    assert torch.equal(torch.nan_to_num(got, nan=-1.0), torch.nan_to_num(want, nan=-1.0))


@pytest.mark.skipif(HAS_TRITON and HAS_CUDA, reason="tests the machine without the kernel")
def test_forced_triton_without_triton_or_cuda_warns_once_and_falls_back(monkeypatch):
    monkeypatch.setenv(trs.ENV, "triton")
    ts = [ref.specials_tensor(500, torch.float32, 3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert not trs.available()
            rows = trs.device_stats(ts, 32, 16)
    ours = [w for w in caught if "LOCKSTEP_STATS_KERNEL=triton" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert ours[0].category is RuntimeWarning
    ref.check_row(rows[0].numpy(), ts[0], 32, 16)


def test_torch_mode_and_bad_mode(monkeypatch):
    monkeypatch.setenv(trs.ENV, "torch")
    assert trs.mode() == "torch" and not trs.available()
    monkeypatch.setenv(trs.ENV, "fast")
    with pytest.warns(RuntimeWarning, match="not one of auto, triton, torch"):
        assert trs.mode() == "auto"


def test_bad_arguments_raise_as_the_torch_path():
    t = torch.zeros(4)
    with pytest.raises(ValueError, match="sketch_k"):
        trs.device_stats([t], 300, 16)
    with pytest.raises(ValueError, match="hist_bins"):
        trs.device_stats([t], 32, 8)
    assert trs.device_stats([], 32, 16).shape == (0, tst.row_width(32, 16))


def test_self_check_accepts_an_agreeing_kernel_and_rejects_one_naming_the_field(monkeypatch):
    cpu = torch.device("cpu")
    # A "kernel" that is the torch path: agrees.
    monkeypatch.setattr(trs, "fused_stats", tst.device_stats)
    assert trs._self_check(cpu, 32, 16)
    assert trs.disabled_reason() is None

    def off_by_one_count(ts, k, bins):
        rows = tst.device_stats(ts, k, bins)
        if ts[0].dtype == torch.float16:
            rows[0, C["sat"]] += 1
        return rows
    monkeypatch.setattr(trs, "fused_stats", off_by_one_count)
    with pytest.warns(RuntimeWarning, match="field sat"):
        assert not trs._self_check(cpu, 32, 16)
    assert "field sat" in trs.disabled_reason()
    assert not trs.available(cpu)


def test_self_check_rejects_a_raising_kernel_and_the_sketch_beyond_tolerance(monkeypatch):
    cpu = torch.device("cpu")

    def boom(ts, k, bins):
        raise RuntimeError("no such intrinsic")
    monkeypatch.setattr(trs, "fused_stats", boom)
    with pytest.warns(RuntimeWarning, match="no such intrinsic"):
        assert not trs._self_check(cpu, 32, 16)
    trs._reset_for_tests()

    def sketch_off(ts, k, bins):
        rows = tst.device_stats(ts, k, bins)
        rows[0, K0 + 5] += 1e-3 * rows[0, C["l2"]]
        return rows
    monkeypatch.setattr(trs, "fused_stats", sketch_off)
    with pytest.warns(RuntimeWarning, match=r"sketch\[5\]"):
        assert not trs._self_check(cpu, 32, 16)


def test_compare_rows_tolerances():
    ts = trs.check_tensors(torch.device("cpu"))
    want = tst.device_stats(ts, 32, 16).numpy()
    assert trs.compare_rows(want.copy(), want, 32, 16) is None
    got = want.copy()
    got[0, C["mean"]] += 1e-9 * (abs(want[0, C["mean"]]) + want[0, C["std"]])
    got[0, C["l2"]] *= 1 + 1e-8
    assert trs.compare_rows(got, want, 32, 16) is None
    got[0, C["std"]] *= 1 + 1e-5
    assert "field std" in trs.compare_rows(got, want, 32, 16)
    got = want.copy()
    got[-1, K0 + 32 + 3] += 1
    assert "hist[3]" in trs.compare_rows(got, want, 32, 16)


def test_tile_table_offsets_tiles_and_owners():
    host, base_i, n_tiles = trs.tile_table([10, 0, 40000, 5], [5000, 0, 1000, 9000], 4, 16384)
    assert base_i == 2 and n_tiles == 1 + 0 + 3 + 1
    tab = host[:16].reshape(4, 4)
    assert tab.tolist() == [[1000, 10, 0, 1], [0, 0, 1, 0], [0, 40000, 1, 3], [2000, 5, 4, 1]]
    assert host[16:].tolist() == [0, 2, 2, 2, 3]
    with pytest.raises(RuntimeError, match="element size"):
        trs.tile_table([4, 4], [1000, 1002], 4, 16384)


def test_pattern_words_hold_the_sign_patterns():
    words = trs._pattern_words(torch.device("cpu")).to(torch.int64) & 0xFFFFFFFF
    bits = _sketch_hash.patterns(torch.device("cpu"))  # [256, 256] bool
    got = (words.view(256, 8, 1) >> torch.arange(32)) & 1
    assert torch.equal(got.reshape(256, 256).bool(), bits)


# ---- the kernel's algorithm, emulated in NumPy ------------------------------------
def _emulate(x, k):
    """The tile kernel and the finishing kernel, step by step, in NumPy with the
    kernel's float32 arithmetic (float32 x: the dtype's values widened exactly): the
    block hash in int64, lane j loading offset (j - r) mod K, the sign from the pattern
    words, the power-of-two scaling, float32 row sums added in float64, the corrected
    two-pass block moments merged with Chan's formula per tile, then the tiles merged
    likewise. Returns (sketch, mean, std, l2, min, max)."""
    m32 = 0xFFFFFFFF
    f32 = np.float32

    def mix(v):
        v = ((v ^ (v >> 16)) * 0x045D9F3B) & m32
        v = ((v ^ (v >> 16)) * 0x045D9F3B) & m32
        return v ^ (v >> 16)

    def rows(a):  # float32 sums of rows of K lanes, added in float64
        return float(a.sum(axis=1, dtype=f32).astype(np.float64).sum())
    words = (trs._pattern_words(torch.device("cpu")).numpy().astype(np.int64) & m32)
    kl, kp, nb, tile = trs._layout(k)
    n = x.size
    sketch = np.zeros(kp)
    tiles = []
    lo, hi = np.inf, -np.inf
    for start in range(0, n, tile):
        rem = min(n - start, tile)
        tn = ts_ = tm2 = tq = 0.0
        for it in range(-(-rem // (nb * kl))):
            blk = it * nb + np.arange(nb)[:, None]
            j = np.arange(kp)[None, :]
            b = start // k + blk
            h1 = mix((b & m32) ^ 0x1B873593 ^ mix(b >> 32))
            r = (h1 * k) >> 32
            h2 = mix(h1 ^ 0x6A09E667)
            p, flip = h2 >> 24, (h2 >> 23) & 1
            o = (j - r) % k
            idx = blk * kl + o
            valid = (j < kl) & (idx < rem)
            v = np.where(valid, x[start + np.minimum(idx, rem - 1)], f32(0)).astype(f32)
            fin = valid & np.isfinite(v)
            x0 = np.where(fin, v, f32(0)).astype(f32)
            nbk = float(fin.sum())
            mn = float(np.where(fin, v, np.inf).min())
            mx = float(np.where(fin, v, -np.inf).max())
            lo, hi = min(lo, mn), max(hi, mx)
            bmax = max(-mn, mx)
            bmax = bmax if bmax > 0 else 1.0
            kk = min(max(int(np.frexp(f32(bmax))[1]), -126), 126)  # floor(log2) + 1
            s, inv = f32(2.0 ** -kk), 2.0 ** kk
            xs = (x0 * s).astype(f32)
            sx = rows(xs) * inv
            mean32 = f32(sx / max(nbk, 1.0))
            d = np.where(fin, xs - f32(mean32 * s), f32(0)).astype(f32)
            d1 = rows(d) * inv
            d2 = rows(d * d) * inv * inv
            qb = rows(xs * xs) * inv * inv
            sb = float(mean32) * nbk + d1
            mb = sb / max(nbk, 1.0)
            m2b = max(d2 - d1 * d1 / max(nbk, 1.0), 0.0)
            delta = mb - ts_ / max(tn, 1.0)
            w = tn * nbk / max(tn + nbk, 1.0) if tn > 0 and nbk > 0 else 0.0
            tm2 += m2b + delta * delta * w
            ts_ += sb
            tn += nbk
            tq += qb
            bit = (words[p * 8 + (o >> 5)] >> (o & 31)) & 1
            signed = np.where((bit ^ flip) != 0, -xs, xs).astype(f32)
            sketch += signed.sum(axis=0, dtype=f32).astype(np.float64) * inv
        tiles.append((tn, ts_, tm2, tq))
    big_n = sum(t[0] for t in tiles)
    mean = sum(t[1] for t in tiles) / big_n
    m2 = sum(t[2] + (t[0] * (t[1] / t[0] - mean) ** 2 if t[0] else 0.0) for t in tiles)
    return (sketch[:k], mean, math.sqrt(m2 / big_n), math.sqrt(sum(t[3] for t in tiles)),
            lo, hi)


def _emulation_cases(n, seed):
    g = torch.Generator().manual_seed(seed)
    yield "specials", ref.specials_tensor(n, torch.float32, seed)
    yield "large mean, small spread", 1000.0 + torch.randn(n, generator=g) * 1e-3
    yield "tiny", torch.randn(n, generator=g) * 1e-30
    yield "huge", torch.randn(n, generator=g) * 1e37
    x = torch.randn(n, generator=g)
    x[::5] = 3e38  # near float32's limit: the scaling keeps the sums finite
    yield "near the limit", x


@pytest.mark.parametrize("k,n", [(32, 40_000), (17, 5_003), (100, 12_345), (256, 70_000),
                                 (1, 300)])
def test_emulated_kernel_algorithm_matches_the_reference(k, n):
    """The kernel's algorithm, in float32 where the kernel is, within the documented
    tolerance of the float64 reference (the sketch bit for bit in its buckets and signs:
    a wrong bucket or sign would be off by far more than 1e-5 * l2)."""
    for name, t in _emulation_cases(n, k + n):
        sketch, mean, std, l2, lo, hi = _emulate(t.numpy(), k)
        want, want_sketch, _ = ref.reference(t, k, 0)
        assert lo == want["min"] and hi == want["max"], name
        np.testing.assert_allclose(sketch, want_sketch, rtol=0, atol=1e-5 * want["l2"],
                                   err_msg=name)
        tol_mean = 1e-6 * (abs(want["mean"]) + want["std"]) + 1e-7 * want["absmax"]
        assert abs(mean - want["mean"]) <= tol_mean, (name, mean, want["mean"])
        assert abs(std - want["std"]) <= 1e-6 * want["std"], (name, std, want["std"])
        assert abs(l2 - want["l2"]) <= 1e-6 * want["l2"], (name, l2, want["l2"])


# ---- on a GPU: kernel, torch path and C++ host kernel ----------------------------
def _gpu_dtypes():
    out = [torch.float32, torch.float16, torch.bfloat16]
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if getattr(torch, name, None) is not None:
            out.append(getattr(torch, name))
    return out


def _cases(dtype, big_n=100_003, mat_rows=257):
    """Tensors of one dtype: specials, zeros, subnormals, the dtype's limits, empty,
    multi-tile (big_n elements: several tiles at every K), non-contiguous views."""
    code, sat, min_normal = tst.limits(dtype)
    gen = torch.Generator().manual_seed(7)
    base = ref.specials_tensor(5000, torch.float64, 11)
    lim = torch.tensor([sat, -sat, min_normal, -min_normal, min_normal / 2, 0.0, -0.0,
                        float("nan"), float("inf"), float("-inf"), 1.0] * 50,
                       dtype=torch.float64)
    big = torch.randn(big_n, generator=gen, dtype=torch.float64) * 0.02 + 0.1
    mat = torch.randn(mat_rows, 129, generator=gen, dtype=torch.float64)
    cases = [base, lim, torch.zeros(1000, dtype=torch.float64), big,
             torch.zeros(0, dtype=torch.float64), torch.full((33,), float("nan")),
             torch.full((4097,), 3.0, dtype=torch.float64)]
    out = [c.to(dtype) for c in cases]
    m = mat.to(dtype)
    out += [m.t(), m[:, 3:70], m[::2]]  # transposed, sliced, strided rows
    return out


def _host_row(t, k, bins):
    """The C++ host kernel's row in the torch layout (None where _core is not built).
    The host kernel reads fp32/fp16/bf16/fp64, not fp8: an fp8 tensor is given to it
    widened to fp32 (exact), and its sat/subnormal counts and limit_dtype, which refer to
    the fp8 format, are counted here from the widened values instead."""
    if HOST_STATS is None:
        return None
    dtype = t.dtype
    c = t.detach().cpu().contiguous()
    if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        c = c.to(torch.float32)
    d = HOST_STATS(c.data_ptr(), c.numel(), _core.DTYPES[str(c.dtype).split(".")[-1]], k, bins)
    names = {"nan": "nan_count", "inf": "inf_count", "zero": "zero_count",
             "sat": "sat_count", "subnormal": "subnormal_count"}
    row = [float(d[names.get(f, f)]) for f in tst.FIELDS]
    if c.dtype != dtype:
        code, sat, min_normal = tst.limits(dtype)
        x = c.double().numpy()
        fin = x[np.isfinite(x)]
        row[C["sat"]] = float((np.abs(fin) >= sat).sum())
        row[C["subnormal"]] = float(((fin != 0) & (np.abs(fin) < min_normal)).sum())
        row[C["limit_dtype"]] = float(code)
    return np.array(row + [float(v) for v in d["sketch"]] + [float(v) for v in d["hist"]])


def _check_kernel_rows(dev_tensors, cpu_tensors, k, bins, reference=True):
    """fused_stats of tensors of one dtype against the torch path (all of them, within
    the documented tolerance), the float64 reference (fp32/fp16/bf16 when `reference`)
    and the C++ host kernel (each tensor). Returns the kernel's rows (NumPy)."""
    dtype = cpu_tensors[0].dtype
    got = trs.fused_stats(dev_tensors, k, bins)
    assert got.device == dev_tensors[0].device
    assert got.shape == (len(cpu_tensors), tst.row_width(k, bins))
    got = got.cpu().numpy()
    torch_rows = tst.device_stats(dev_tensors, k, bins).cpu().numpy()
    bad = trs.compare_rows(got, torch_rows, k, bins, limit=8)
    assert bad is None, "kernel vs torch path: " + bad
    for i, t in enumerate(cpu_tensors):
        # (not where |x| > 1e30: a sketch bucket of such values can pass float32's limit,
        # Inf on the wire in the kernel and the torch path, finite in the float64
        # reference; and the host kernel's float32 sketch partials overflow there)
        huge = float(got[i, C["absmax"]]) > 1e30
        if reference and not huge and dtype in (torch.float32, torch.float16, torch.bfloat16):
            ref.check_row(got[i], t, k, bins)  # the float64 reference (slow for fp8 ids)
        host = _host_row(t, k, bins)
        if host is not None and not huge:
            bad = trs.compare_rows(got[i:i + 1], host[None, :], k, bins, limit=8)
            assert bad is None, "kernel vs host kernel, case %d: %s" % (i, bad)
    return got


@GPU
@pytest.mark.parametrize("dtype", _gpu_dtypes(), ids=str)
@pytest.mark.parametrize("k,bins", [(32, 16), (17, 16), (0, 0), (256, 16)])
def test_kernel_equals_torch_path_host_kernel_and_reference(dtype, k, bins):
    """The kernel itself (called directly, so that a failed self-check still shows
    which fields of which dtype disagree), then the feature check."""
    cpu = _cases(dtype)
    _check_kernel_rows([t.cuda() for t in cpu], cpu, k, bins)
    assert trs.available(torch.device("cuda"), k, bins), trs.disabled_reason()


@GPU
def test_dispatch_mixes_kernel_and_torch_groups_in_order_without_host_sync():
    ts = [ref.specials_tensor(n, dt, n).cuda() for n, dt in
          ((3000, torch.float32), (70_000, torch.bfloat16), (100, torch.float64),
           (5, torch.float16), (0, torch.float32), (64, torch.float32))]
    ts.append(torch.arange(10, device="cuda"))
    assert trs.available(ts[0], 32, 16)
    torch.cuda.synchronize()
    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = trs.device_stats(ts, 32, 16)
    finally:
        torch.cuda.set_sync_debug_mode(old)
    want = tst.device_stats(ts, 32, 16)
    assert trs.compare_rows(got.cpu().numpy(), want.cpu().numpy(), 32, 16) is None
    assert trs.disabled_reason() is None


@GPU
def test_results_are_deterministic():
    ts = [torch.randn(1_000_003, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    a = trs.fused_stats(ts, 32, 16)
    b = trs.fused_stats(ts, 32, 16)
    assert torch.equal(a, b)


@GPU
def test_tensor_over_2_pow_31_elements():
    n = 2 ** 31 + 4099
    free, _ = torch.cuda.mem_get_info()
    if free < n * 2 + (2 << 30):
        pytest.skip("needs %.1f GB of free GPU memory, %.1f free" % (n * 2 / 1e9 + 2, free / 1e9))
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    x.fill_(0.5)
    x[-7:] = torch.tensor([float("nan"), float("inf"), -3.0, 0.0, 2.0 ** -130, 1e4, -1e30],
                          dtype=torch.bfloat16, device="cuda")
    x[1000] = 9.0
    assert trs.available(x, 32, 16)
    row = trs.fused_stats([x], 32, 16)[0].cpu().numpy()
    finite = n - 2
    assert row[C["numel"]] == n
    assert row[C["nan"]] == 1 and row[C["inf"]] == 1 and row[C["zero"]] == 1
    assert row[C["min"]] == float(torch.tensor(-1e30, dtype=torch.bfloat16))
    assert row[C["max"]] == float(torch.tensor(1e4, dtype=torch.bfloat16))
    s = 0.5 * (n - 8) + 9.0 - 3.0 + float(torch.tensor([2.0 ** -130, 1e4, -1e30],
                                                         dtype=torch.bfloat16).double().sum())
    assert abs(row[C["mean"]] - s / finite) <= 1e-6 * (abs(s / finite) + row[C["std"]])
    assert row[C["subnormal"]] == 1  # 2^-130 < bf16's min normal 2^-126
    assert row[K0 + 32:].sum() == finite  # histogram
    want = tst.device_stats([x], 32, 16)[0].cpu().numpy()  # the torch path, in passes
    assert trs.compare_rows(row[None, :], want[None, :], 32, 16) is None


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_pipeline_skips_statistics_during_cuda_graph_capture():
    """Statistics asked for while a CUDA graph is being captured are skipped and
    counted (no kernel, no table copy in the capture); outside it they are recorded."""
    import time
    from lockstep._device import DevicePipeline
    shipped = []
    pipe = DevicePipeline(32, 16, lambda *a: shipped.append(a))
    x = torch.randn(1000, device="cuda")
    y = x * 2  # warm the kernel outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 2
        pipe.add(y, 1, 0, 0, False)
        pipe.add(y, 2, 1, 0, False, defer=True)
        pipe.flush_deferred()
    assert pipe.capture_skipped == 2
    g.replay()
    pipe.add(y, 1, 0, 0, False)
    pipe.end_step(0, {})
    assert pipe.drain(time.monotonic() + 10)
    (step, rows, _micros, ids, _orders, _grad_sq, _scalars, _flags), = shipped
    assert step == 0 and rows.shape[0] == 1 and list(ids) == [1]
    assert rows[0, C["numel"]] == 1000


# ---- under Triton's interpreter, on CPU tensors ------------------------------------
# Where triton is installed and this process has no CUDA (the torch 2.x stack in CI),
# the kernel source runs in Triton's interpreter on CPU tensors, imported and launched
# by the production code (_build_kernels, fused_stats, _mixed_stats, _self_check;
# available() itself keeps refusing CPU tensors). The interpreter runs the programs of
# the grid one after another, every tl op as NumPy on the whole block, loads and stores
# through raw addresses: it checks the kernel's indexing, masks, hashing, scaling,
# moments, merges and bit decoding, value for value. It cannot check
# (docs/statistics.md, "Under Triton's interpreter"): compilation and code generation,
# warps and registers, the GPU's own arithmetic (fused multiply-adds, the order of its
# float32 block reductions, denormal flushing), speed, and
# a tensor over 2^31 elements (4 GiB of bf16 and hours in the interpreter: the 64-bit
# index arithmetic is checked instead with tile tables placed beyond 2^31, 2^32 and
# 2^40, below). The interpreter's own bf16/fp8 -> fp32 conversion is not exact (it loses
# subnormals and reads fp8 NaN/Inf codes as numbers): the kernel decodes those formats
# from their bits (_triton_kernels.widen), the same code as on a GPU.
INTERPRETER = pytest.mark.skipif(
    not INTERPRET, reason="triton is not installed (the Debian torch 1.13 stack)"
    if not HAS_TRITON else "CUDA is present: this process compiles the kernel (the GPU "
    "tests); run with TRITON_INTERPRET=1 for these")


def _fix_interpreter_index(interp):
    """Triton 3.6's interpreter holds a scalar as a one-element array and hands it to
    Python (a loop bound read at run time: `range(0, tl.cdiv(rem, BLOCK))`) with
    int(array), which NumPy >= 2.4 refuses for an array of ndim 1 (TypeError 'only
    0-dimensional arrays can be converted to Python scalars'; fixed in later Triton).
    Wraps its patching of tl.tensor so that __index__ reads the one element."""
    try:
        int(np.zeros(1, dtype=np.int32))
        return  # an older NumPy: nothing to fix
    except TypeError:
        pass
    orig = getattr(interp, "_patch_lang_tensor", None)
    assert orig is not None, ("triton.runtime.interpreter has no _patch_lang_tensor: check "
                              "whether this Triton's interpreter still needs the NumPy 2.4 fix")
    if getattr(orig, "lockstep_index_fix", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
    patched.lockstep_index_fix = True
    interp._patch_lang_tensor = patched


@pytest.fixture(scope="module")
def interpreted_kernels():
    """Production's kernels (_triton_stats._build_kernels, which imports
    lockstep/_triton_kernels.py), checked to be the interpreter's. Errors, never skips,
    when triton is installed and this process should interpret but does not."""
    import triton  # pylint: disable=import-outside-toplevel  (installed: must import)
    import triton.language as tl  # pylint: disable=import-outside-toplevel
    import triton.runtime.interpreter as interp  # pylint: disable=import-outside-toplevel
    _fix_interpreter_index(interp)
    assert triton.knobs.runtime.interpret and isinstance(tl.zeros, interp.InterpretedFunction), \
        ("triton was imported before this module could set TRITON_INTERPRET=1 (Triton reads "
         "it at import): run this file in a process of its own, as ctest does")
    kern = trs._build_kernels()
    from lockstep import _triton_kernels  # pylint: disable=import-outside-toplevel
    for name in ("tile_kernel", "finish_kernel", "mix32", "widen"):
        assert isinstance(getattr(_triton_kernels, name), interp.InterpretedFunction), \
            "triton %s did not give an interpreted %s" % (triton.__version__, name)
    return dict(kern)


@pytest.fixture
def interp(interpreted_kernels):
    """The interpreted kernels."""
    assert trs._build_kernels() == interpreted_kernels
    yield


def _interp_cases(dtype):
    """The GPU test's cases at the interpreter's sizes (the multi-tile tensor spans 2
    tiles at K = 32 and at K = 17)."""
    return _cases(dtype, big_n=trs._layout(32)[3] + 1001, mat_rows=33)


def _interp_configs():
    """Every dtype at the default configuration and each other sketch shape (K not a
    power of two, sketch and histogram off, the widest K) once: `widen` depends on the
    dtype only, the lane layout on K only."""
    out = [(dt, 32, 16) for dt in _gpu_dtypes()]
    out += [(torch.float32, 17, 16), (torch.bfloat16, 0, 0), (out[-1][0], 256, 16)]
    return [pytest.param(*c, id="%s-K%d-bins%d" % (str(c[0]).split(".")[-1], c[1], c[2]))
            for c in out]


@INTERPRETER
@pytest.mark.parametrize("dtype,k,bins", _interp_configs())
def test_interpreted_kernel_equals_torch_path_host_kernel_and_reference(interp, dtype, k,
                                                                        bins):
    """The GPU test above, on CPU tensors: specials, limits, zeros, subnormals, empty,
    multi-tile, views, against the torch path, the host kernel and (at K = 32) the
    float64 reference."""
    cpu = _interp_cases(dtype)
    _check_kernel_rows(cpu, cpu, k, bins, reference=(k, bins) == (32, 16))


def _exact_case(dtype, n, seed, tiny=False):
    """Values whose every partial sum is exact in float32, whatever the order: multiples
    of 1/4 up to 4 in magnitude (any sum of 2^20 of them fits 24 bits), or with `tiny`
    multiples of the dtype's smallest subnormal up to 16 of them; with NaN, +-Inf (NaN
    for e4m3fn, which has no Inf) and -0. Each implementation's sketch, counts, min, max
    and histogram are then the same bits."""
    g = torch.Generator().manual_seed(seed)
    unit = 0.25
    if tiny:
        unit = {torch.float16: 2.0 ** -24, torch.bfloat16: 2.0 ** -133,
                torch.float32: 2.0 ** -149}.get(dtype, 2.0 ** -9 if "e4m3" in str(dtype)
                                                else 2.0 ** -16)
    x = torch.randint(-16, 17, (n,), generator=g).to(torch.float64) * unit
    pick = torch.randint(0, 50, (n,), generator=g)
    for c, v in {0: float("nan"), 1: float("inf"), 2: float("-inf"), 3: -0.0}.items():
        x[pick == c] = v
    return x.to(dtype)


@INTERPRETER
@pytest.mark.parametrize("dtype,k", [(dt, 32) for dt in _gpu_dtypes()]
                         + [(torch.float32, 17), (torch.bfloat16, 256)], ids=str)
def test_interpreted_sketch_is_bit_identical_to_torch_and_host_kernel(interp, dtype, k):
    """Exact sums: the kernel's sketch (its buckets, signs and lanes), counts, min, max
    and histogram are bit for bit those of the torch path, of the C++ host kernel and
    of the definitions in plain Python integers (mean, std and l2 round differently in
    each: within the tolerance, checked above)."""
    ts = [_exact_case(dtype, 6001, 1), _exact_case(dtype, 777, 2, tiny=True),
          _exact_case(dtype, 1, 3), _exact_case(dtype, 60 * 80, 4).view(60, 80)[:, ::2].t()]
    got = trs.fused_stats(ts, k, 16).numpy()
    want = tst.device_stats(ts, k, 16).numpy()
    exact = [C[f] for f in ("numel", "min", "max", "absmax", "nan", "inf", "zero", "sat",
                            "subnormal", "limit_dtype")] + list(range(K0, K0 + k + 16))

    def same(a, b):
        return np.array_equal(a[..., exact], b[..., exact], equal_nan=True)
    assert same(got, want), np.argwhere(~np.isclose(got[:, exact], want[:, exact],
                                                    rtol=0, atol=0, equal_nan=True))
    for i, t in enumerate(ts):
        host = _host_row(t, k, 16)
        if host is not None:
            assert same(got[i], host), i
        _, sketch, _ = ref.reference(t, k, 0)
        assert np.array_equal(got[i, K0:K0 + k], sketch), i
    assert np.array_equal(got[:, K0 + k:].sum(1), got[:, C["numel"]] - got[:, C["nan"]]
                          - got[:, C["inf"]])  # every finite value is in the histogram


@INTERPRETER
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_interpreted_kernel_reads_every_16_bit_pattern(interp, dtype):
    """All 65536 bit patterns of fp16 / bf16 (every subnormal, NaN payload, +-Inf, +-0,
    the largest finite) in one tensor: the same row as the torch path and the C++ host
    kernel (exact sums here are not expected: the values span the whole range)."""
    x = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    _check_kernel_rows([x], [x], 32, 16, reference=False)


@INTERPRETER
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_interpreted_kernel_decodes_every_fp8_code(interp, name):
    """All 256 codes of each fp8 format in one block of K = 256: the sketch puts each
    element alone in its own bucket, so every decoded value is compared on its own, bit
    for bit, with torch's decoding (the torch path's sketch and the definitions); NaN
    and Inf codes count, the rest as in the torch path."""
    dtype = getattr(torch, name, None)
    if dtype is None:
        pytest.skip("this torch has no %s" % name)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    got = trs.fused_stats([codes], 256, 16).numpy()[0]
    want = tst.device_stats([codes], 256, 16).numpy()[0]
    assert trs.compare_rows(got[None], want[None], 256, 16, limit=8) is None
    assert np.array_equal(got[K0:K0 + 256], want[K0:K0 + 256])
    vals = codes.float().double().numpy()
    sketch = np.zeros(256)
    for i in np.flatnonzero(np.isfinite(vals)):
        bucket, sign = ref.py_bucket_sign(int(i), 256)
        assert sketch[bucket] == 0
        sketch[bucket] = sign * vals[i]
    assert np.array_equal(got[K0:K0 + 256], sketch)
    assert got[C["nan"]] == np.isnan(vals).sum() and got[C["inf"]] == np.isinf(vals).sum()


@INTERPRETER
def test_interpreted_self_check_passes_and_warns_nothing(interp):
    """The self-check production runs on a GPU's first use, here on the CPU: it passes
    and warns nothing. (NumPy's 'overflow encountered
    in cast' comes from the interpreter rounding a sketch bucket of +-3e38 values to
    float32: Inf on the wire, as the torch path gives; docs/statistics.md.)"""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert trs._self_check(torch.device("cpu"), 32, 16), trs.disabled_reason()
    ours = [str(w.message) for w in caught
            if not (w.category is RuntimeWarning and "overflow encountered in cast"
                    in str(w.message))]
    assert not ours, ours
    assert trs.disabled_reason() is None


@INTERPRETER
def test_interpreted_dispatch_mixes_kernel_and_torch_groups_in_order(interp):
    """_mixed_stats: kernel groups (fp32, bf16, fp16) and torch groups (fp64, int64) in
    one call, rows back in the callers' order, equal to the torch path."""
    ts = [ref.specials_tensor(n, dt, n) for n, dt in
          ((3000, torch.float32), (2000, torch.bfloat16), (100, torch.float64),
           (5, torch.float16), (0, torch.float32), (64, torch.float32))]
    ts.append(torch.arange(10))
    got = trs._mixed_stats(ts, 32, 16)
    want = tst.device_stats(ts, 32, 16)
    assert trs.compare_rows(got.numpy(), want.numpy(), 32, 16) is None


@INTERPRETER
def test_interpreted_results_are_deterministic(interp):
    ts = [torch.randn(3001).to(torch.bfloat16), torch.randn(2000)]
    a = trs._mixed_stats(ts, 32, 16)
    b = trs._mixed_stats(ts, 32, 16)
    assert torch.equal(a, b)


def _launch_at(x, first_index, k):
    """The two kernels on CPU tensor x as if it were elements [first_index, first_index
    + n) of a tensor of first_index + n elements (first_index a multiple of the tile):
    the tile table says the tensor starts first_index elements before x (offset
    -first_index) and its first tile is -(first_index / tile), so program 0 computes the
    tile at element first_index, with the int64 arithmetic of a real tensor that long
    (start, global block index, both halves of the hash, the pointer), while the grid
    stays small. The finishing kernel gets an ordinary table (its tiles from 0)."""
    kern = trs._build_kernels()
    kl, kp, nb, tile = trs._layout(k)
    assert first_index % tile == 0
    n = x.numel()
    ntiles = (n + tile - 1) // tile
    total = first_index + n
    tab = torch.tensor([-first_index, total, -(first_index // tile), ntiles]
                       + [0] * ntiles, dtype=torch.int64)
    pw = trs._SCALARS + trs._CLASSES + kp
    part = torch.empty((ntiles, pw), dtype=torch.float64)
    code, sat, min_normal = tst.limits(x.dtype)
    kern["tile"][(ntiles,)](x, tab, tab[4:], part, trs._pattern_words(x.device), float(sat),
                            float(min_normal), K=k, KL=kl, KP=kp, NB=nb, ITERS=trs.ITERS,
                            PW=pw, SKETCH=True, FMT=0)
    fin = torch.tensor([0, total, 0, ntiles], dtype=torch.int64)
    out = torch.empty((1, tst.row_width(k, 16)), dtype=torch.float64)
    kern["finish"][(1,)](part, fin, out, float(code), K=k, KP=kp, BINS=True, PW=pw,
                         W=out.shape[1], TC=trs.FINISH_TILES, SKETCH=True)
    return out[0].numpy()


@INTERPRETER
@pytest.mark.parametrize("k,at", [(32, 2 ** 31), (17, 2 ** 32), (32, 2 ** 40), (1, 2 ** 33)])
def test_interpreted_kernel_index_arithmetic_beyond_2_pow_31(interp, k, at):
    """What the tensor over 2^31 elements checks on a GPU, without the tensor: the
    kernel's tiles placed across element 2^31 and 2^32, and at 2^40 (K = 32: block
    indices beyond 2^32, the hash's high half) and 2^33 (K = 1: every element its own
    block), the sketch bit for bit that of those global indices (exact sums; plain
    Python integers, docs/statistics.md), the rest as the torch path gives for the same
    values at index 0."""
    _, _, _, tile = trs._layout(k)
    first_index = (at // tile) * tile  # its first tile below `at`, the second above
    if first_index == at:
        first_index -= tile
    x = _exact_case(torch.float32, tile + 1000, 99)
    row = _launch_at(x, first_index, k)
    assert row[C["numel"]] == first_index + x.numel()
    vals = x.double().numpy()
    sketch = np.zeros(k)
    for i in np.flatnonzero(np.isfinite(vals)):
        bucket, sign = ref.py_bucket_sign(first_index + int(i), k)
        sketch[bucket] += sign * vals[i]
    assert np.array_equal(row[K0:K0 + k], sketch)
    want = tst.device_stats([x], k, 16)[0].numpy()  # the same values at index 0
    assert not np.array_equal(row[K0:K0 + k], want[K0:K0 + k])  # the index did matter
    row[C["numel"]] = x.numel()
    row[K0:K0 + k] = want[K0:K0 + k]
    assert trs.compare_rows(row[None], want[None], k, 16, limit=8) is None


# ---- compiled for a GPU, without one ------------------------------------------------
_COMPILE_SCRIPT = r'''
import json, sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from lockstep import _triton_kernels as kern, _triton_stats as trs
ptrs = {torch.float32: "*fp32", torch.float16: "*fp16", torch.int16: "*i16", torch.uint8: "*u8"}
kl, kp, nb, _ = trs._layout(32)
pw = trs._SCALARS + trs._CLASSES + kp
out = []
for arch in (90, 80):  # sm_80: only the formats whose loads differ by architecture
    target = GPUTarget("cuda", arch, 32)
    jobs = []
    for dtype, (fmt, as_int) in trs._FORMATS.items():
        if arch == 80 and str(dtype) not in ("torch.bfloat16", "torch.float8_e4m3fn"):
            continue
        cs = dict(K=32, KL=kl, KP=kp, NB=nb, ITERS=trs.ITERS, PW=pw, SKETCH=True,
                  FMT=fmt)
        sig = {"base": ptrs[as_int or dtype], "tab": "*i64", "tiles": "*i64", "part": "*fp64",
               "pat": "*i32", "SAT": "fp32", "MINN": "fp32"}
        jobs.append((str(dtype), kern.tile_kernel, sig, cs, trs.NUM_WARPS))
    cs = dict(K=32, KP=kp, BINS=True, PW=pw, W=13 + 32 + 16, TC=trs.FINISH_TILES, SKETCH=True)
    if arch == 90:
        jobs.append(("finish", kern.finish_kernel,
                     {"part": "*fp64", "tab": "*i64", "out": "*fp64", "CODE": "fp32"}, cs, 4))
    for name, fn, sig, cs, warps in jobs:
        sig = dict(sig, **{k: "constexpr" for k in cs})
        try:
            c = triton.compile(ASTSource(fn, sig, cs), target=target,
                               options={"num_warps": warps})
            out.append([arch, name, None if c.asm.get("cubin") else "no cubin"])
        except Exception as e:  # pylint: disable=broad-except
            out.append([arch, name, "%s: %s" % (type(e).__name__, str(e)[-600:])])
print(json.dumps(out))
'''


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (the Debian torch 1.13 "
                    "stack)")
def test_kernels_compile_for_sm80_and_sm90_without_a_gpu(tmp_path):
    """Triton's own compiler, down to a cubin through the ptxas it ships, for an H100
    (sm_90: the tile kernel for every dtype it reads, K = 32, and the
    finishing kernel) and an A100 (sm_80: bf16 and fp8 e4m3fn, whose loads differ). No GPU is needed to compile; this catches
    what the interpreter cannot (types the code generator refuses, a tl op without a
    lowering, an fp8 conversion an architecture lacks: before the kernel decoded fp8
    from its bits, e4m3fn did not compile for sm_80). In a child process, because this
    one may be interpreting; with its own cache directory, so it compiles every time."""
    import subprocess  # pylint: disable=import-outside-toplevel
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path))
    env.pop("TRITON_INTERPRET", None)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(trs.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg] + [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=240, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    import json  # pylint: disable=import-outside-toplevel
    results = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(results) == len(trs._FORMATS) + 1 + 2, results
    bad = [res for res in results if res[2] is not None]
    assert not bad, bad
