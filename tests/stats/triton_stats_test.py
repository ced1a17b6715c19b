"""lockstep/_triton_stats.py: the fused Triton statistics kernel, its feature check and
its fallback (docs/statistics.md, docs/python.md "The fused statistics kernel").

Everywhere (CI has no GPU and no Triton): the feature check says no and the torch
path runs, LOCKSTEP_STATS_KERNEL=triton warns once and falls back, the self-check
turns a disagreeing kernel off naming the field, and the kernel's algorithm (tile
table, sign-pattern words, rotated lanes, per-block moments merged with Chan's
formula) is emulated in NumPy against the float64 reference.
On a CUDA device with Triton: the kernel, the torch path and the C++ host kernel on
the same tensors, within the documented tolerance (min/max/counts/histogram exact).
"""
import importlib.util
import math
import os
import warnings

import numpy as np
import pytest
import torch

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
GPU = pytest.mark.skipif(not (HAS_CUDA and HAS_TRITON),
                         reason="needs a CUDA device and triton (cuda %s, triton %s)"
                         % (HAS_CUDA, HAS_TRITON))


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
    monkeypatch.setitem(trs._state, "hist", False)  # no second try without tl.histogram
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


def test_self_check_falls_back_to_counting_by_comparisons(monkeypatch):
    """A kernel whose tl.histogram variant miscounts but whose comparison variant agrees
    passes the self-check with the comparison variant, and says so once."""
    cpu = torch.device("cpu")

    def hist_wrong(ts, k, bins):
        rows = tst.device_stats(ts, k, bins)
        if trs._state["hist"]:
            rows[:, K0 + k + 2] += 1
        return rows
    monkeypatch.setattr(trs, "fused_stats", hist_wrong)
    monkeypatch.setitem(trs._state, "hist", True)
    with pytest.warns(RuntimeWarning, match=r"tl.histogram failed .*hist\[2\]"):
        assert trs._self_check(cpu, 32, 16)
    assert trs.disabled_reason() is None and trs._state["hist"] is False


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
    bits = tst._patterns(torch.device("cpu"))  # [256, 256] bool
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


def _cases(dtype):
    """Tensors of one dtype: specials, zeros, subnormals, the dtype's limits, empty,
    multi-tile, non-contiguous views."""
    code, sat, min_normal = tst.limits(dtype)
    gen = torch.Generator().manual_seed(7)
    base = ref.specials_tensor(5000, torch.float64, 11)
    lim = torch.tensor([sat, -sat, min_normal, -min_normal, min_normal / 2, 0.0, -0.0,
                        float("nan"), float("inf"), float("-inf"), 1.0] * 50,
                       dtype=torch.float64)
    big = torch.randn(100_003, generator=gen, dtype=torch.float64) * 0.02 + 0.1
    mat = torch.randn(257, 129, generator=gen, dtype=torch.float64)
    cases = [base, lim, torch.zeros(1000, dtype=torch.float64), big,
             torch.zeros(0, dtype=torch.float64), torch.full((33,), float("nan")),
             torch.full((4097,), 3.0, dtype=torch.float64)]
    out = [c.to(dtype) for c in cases]
    m = mat.to(dtype)
    out += [m.t(), m[:, 3:70], m[::2]]  # transposed, sliced, strided rows
    return out


def _host_row(t, k, bins):
    """The C++ host kernel's row in the torch layout (None where it cannot read t)."""
    if HOST_STATS is None:
        return None
    name = str(t.dtype).split(".")[-1]
    code = getattr(_core, "DTYPES", {}).get(name)
    if code is None:
        return None
    c = t.detach().cpu().contiguous()
    d = HOST_STATS(c.data_ptr(), c.numel(), code, k, bins)
    names = {"nan": "nan_count", "inf": "inf_count", "zero": "zero_count",
             "sat": "sat_count", "subnormal": "subnormal_count"}
    row = [float(d[names.get(f, f)]) for f in tst.FIELDS]
    return np.array(row + [float(v) for v in d["sketch"]] + [float(v) for v in d["hist"]])


@GPU
@pytest.mark.parametrize("dtype", _gpu_dtypes(), ids=str)
@pytest.mark.parametrize("k,bins", [(32, 16), (17, 16), (0, 0), (256, 16)])
def test_kernel_equals_torch_path_host_kernel_and_reference(dtype, k, bins):
    """The kernel itself (called directly, so that a failed self-check still shows
    which fields of which dtype disagree), then the feature check."""
    cpu = _cases(dtype)
    gpu = [t.cuda() for t in cpu]
    got = trs.fused_stats(gpu, k, bins)
    assert got.is_cuda and got.shape == (len(cpu), tst.row_width(k, bins))
    got = got.cpu().numpy()
    torch_rows = tst.device_stats(gpu, k, bins).cpu().numpy()
    bad = trs.compare_rows(got, torch_rows, k, bins, limit=8)
    assert bad is None, "kernel vs torch path: " + bad
    for i, t in enumerate(cpu):
        if dtype in (torch.float32, torch.float16, torch.bfloat16):
            ref.check_row(got[i], t, k, bins)  # the float64 reference (slow for fp8 ids)
        host = _host_row(t, k, bins)
        # (not where |x| > 1e30: the host kernel's float32 sketch partials overflow there)
        if host is not None and not float(got[i, C["absmax"]]) > 1e30:
            bad = trs.compare_rows(got[i:i + 1], host[None, :], k, bins, limit=8)
            assert bad is None, "kernel vs host kernel, case %d: %s" % (i, bad)
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
    (step, rows, _micros, ids, _orders, _grad_sq, _scalars), = shipped
    assert step == 0 and rows.shape[0] == 1 and list(ids) == [1]
    assert rows[0, C["numel"]] == 1000
