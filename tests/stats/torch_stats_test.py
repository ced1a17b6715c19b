"""lockstep/_torch_stats.py against a float64 NumPy reference written from
docs/statistics.md, against the sketch hash in plain Python integers (the C++ known
answers), and against the C++ host kernel (lockstep._core.host_stats) when the extension
is built. Tolerances as in docs/statistics.md: counts, min/max/absmax and histogram
exact; mean/std/l2 1e-6 relative (the C++ kernel's float partial sums); sketch 1e-5*l2.
"""
import importlib.util
import math
import os

import numpy as np
import pytest
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_SRC = os.path.join(_HERE, "..", "..", "agent", "python", "lockstep", "_torch_stats.py")
_spec = importlib.util.spec_from_file_location("lockstep_torch_stats_under_test", _SRC)
ts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ts)
_spec = importlib.util.spec_from_file_location("lockstep_sketch_hash_under_test",
                                               os.path.join(os.path.dirname(_SRC), "_sketch_hash.py"))
sh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sh)

try:  # the C++ kernel, once engineer "python" has built lockstep._core
    from lockstep import _core
    HOST_STATS = getattr(_core, "host_stats", None)
except Exception:  # pragma: no cover - depends on the build
    HOST_STATS = None

C = ts.COL
K0 = ts.SKETCH_COL


# ---- the definitions, in plain Python integers and NumPy float64 -------------------
def py_mix32(v):
    v = ((v ^ (v >> 16)) * 0x045D9F3B) & 0xFFFFFFFF
    v = ((v ^ (v >> 16)) * 0x045D9F3B) & 0xFFFFFFFF
    return v ^ (v >> 16)


def py_hash(i, seed):
    return py_mix32((i & 0xFFFFFFFF) ^ seed ^ py_mix32(i >> 32))


def py_bucket_sign(i, k):
    b, o = divmod(i, k)
    h1 = py_hash(b, sh.ROT_SEED)
    rot = (h1 * k) >> 32
    h2 = py_mix32(h1 ^ sh.PAT_SEED)
    pat, flip = h2 >> 24, (h2 >> 23) & 1
    bit = py_hash(pat * 256 + o, sh.SIGN_SEED) >> 31
    return (o + rot) % k, -1.0 if bit ^ flip else 1.0


def reference(t, k, bins):
    x = t.detach().to(torch.float64).reshape(-1).numpy()
    code, sat, min_normal = ts.limits(t.dtype)
    fin = np.isfinite(x)
    xf = x[fin]
    row = {"numel": x.size, "nan": int(np.isnan(x).sum()), "inf": int(np.isinf(x).sum()),
           "zero": int((xf == 0).sum()), "sat": int((np.abs(xf) >= sat).sum()),
           "subnormal": int(((xf != 0) & (np.abs(xf) < min_normal)).sum()), "limit_dtype": code}
    if xf.size:
        row.update(min=xf.min(), max=xf.max(), mean=xf.mean(), std=xf.std(),
                   l2=math.sqrt(float((xf * xf).sum())), absmax=np.abs(xf).max())
    else:
        row.update({f: math.nan for f in ("min", "max", "mean", "std", "l2", "absmax")})
    sketch = np.zeros(k)
    if k:
        idx = np.arange(x.size)
        bs = [py_bucket_sign(int(i), k) for i in idx[fin]]
        for (bk, sg), v in zip(bs, xf):
            sketch[bk] += sg * v
    hist = np.zeros(bins)
    if bins:
        for v in xf:
            if v == 0:
                hist[0] += 1
            else:
                e = math.frexp(abs(v))[1] - 1
                hist[min(15, max(1, 2 + ((e + 40) >> 2)))] += 1
    return row, sketch, hist


def check_row(got, t, k, bins):
    want, sketch, hist = reference(t, k, bins)
    for f in ("numel", "nan", "inf", "zero", "sat", "subnormal", "limit_dtype"):
        assert got[C[f]] == want[f], f
    for f in ("min", "max", "absmax"):
        if math.isnan(want[f]):
            assert math.isnan(got[C[f]]), f
        else:
            assert got[C[f]] == want[f], f
    for f in ("mean", "std", "l2"):
        if math.isnan(want[f]):
            assert math.isnan(got[C[f]]), f
        elif math.isinf(want[f]):  # float64 squares of values near its limit
            assert got[C[f]] == want[f], f
        else:
            tol = 1e-6 * (abs(want[f]) + (want["std"] if f == "mean" else 0)) + 1e-300
            assert abs(got[C[f]] - want[f]) <= tol, (f, got[C[f]], want[f])
    l2 = 0.0 if math.isnan(want["l2"]) else want["l2"]
    np.testing.assert_allclose(got[K0:K0 + k], sketch, rtol=0, atol=1e-5 * l2 + 1e-30)
    assert list(got[K0 + k:K0 + k + bins]) == list(hist)


def specials_tensor(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 3 + 0.5
    pick = torch.randint(0, 100, (n,), generator=g)
    vals = {0: math.nan, 1: math.inf, 2: -math.inf, 3: 0.0, 4: -0.0, 5: 1e-40, 6: -3e-6,
            7: 65504.0, 8: -70000.0, 9: 1e-12}
    for code, v in vals.items():
        x[pick == code] = v
    return x.to(dtype)


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
HAS_CUDA = torch.cuda.is_available()
# Every statistics test runs on the CPU and, where a GPU is present, on CUDA: the same
# code, the same float64 reference (computed from the CPU copy of the tensor).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA,
                                                                reason="no CUDA device"))]


def rows_on(tensors, device, k=32, bins=16):
    """device_stats of the tensors moved to `device`, back on the host."""
    rows = ts.device_stats([t.to(device) for t in tensors], k, bins)
    assert rows.device.type == torch.device(device).type
    return rows.cpu()


def test_sketch_hash_matches_plain_integers_and_cpp_known_answers():
    kat = [(0, 11, 1), (1, 12, 1), (2, 13, 0), (31, 10, 1), (32, 29, 0), (33, 30, 0),
           (1000, 27, 1), (4294967301, 1, 1), (123456789012, 2, 0)]
    assert py_mix32(1) == 824515495
    assert py_hash(5, sh.SIGN_SEED) == 1464143695
    for i, bucket, neg in kat:
        assert py_bucket_sign(i, 32) == (bucket, -1.0 if neg else 1.0), i
    # torch int64 ops reproduce the integers bit for bit, also past 2^32 elements
    idx = torch.tensor([i for i, _, _ in kat], dtype=torch.int64)
    assert sh.hash_index(idx, sh.SIGN_SEED).tolist() == [py_hash(i, sh.SIGN_SEED) for i, _, _ in kat]
    b, neg = sh.sketch_index(70, 32, "cpu")
    for i in range(70):
        assert (int(b[i]), -1.0 if bool(neg[i]) else 1.0) == py_bucket_sign(i, 32)


def test_known_answer_sketch_of_small_tensor():
    r = ts.device_stats([torch.arange(1, 11, dtype=torch.float32)], 4, 16)
    assert r[0, K0:K0 + 4].tolist() == [10.0, -17.0, 16.0, 8.0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64_reference_with_specials(dtype, device):
    tensors = [specials_tensor(n, dtype, n) for n in (1, 7, 100, 3000)]
    tensors.append(torch.empty(0, dtype=dtype))
    rows = rows_on(tensors, device)  # one batch: the segmented path
    assert rows.dtype == torch.float64 and rows.shape == (len(tensors), ts.row_width(32, 16))
    for i, t in enumerate(tensors):
        check_row(rows[i].numpy(), t, 32, 16)
        # each tensor alone: the single-tensor path
        check_row(rows_on([t], device)[0].numpy(), t, 32, 16)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtypes_keep_row_order_and_other_widths(device):
    tensors = [specials_tensor(50, DTYPES[i % 4], i) for i in range(8)]
    for k, bins in ((0, 0), (5, 16), (100, 0)):
        rows = rows_on(tensors, device, k, bins)
        for i, t in enumerate(tensors):
            check_row(rows[i].numpy(), t, k, bins)


@pytest.mark.parametrize("device", DEVICES)
def test_large_tensors_alone_and_in_passes_match_the_reference(device, monkeypatch):
    """Tensors above CHUNK_ELEMENTS (shrunk here) are reduced on their own in passes,
    with small pieces (PIECE shrunk); the others in batches up to the chunk size."""
    monkeypatch.setattr(ts, "CHUNK_ELEMENTS", 1000)
    monkeypatch.setattr(ts, "PIECE", 16)
    tensors = [specials_tensor(n, dt, n) for n, dt in
               ((3001, torch.float32), (65, torch.bfloat16), (20, torch.float32),
                (2500, torch.float16), (1000, torch.float64), (993, torch.float32))]
    tensors.append(torch.full((1500,), math.nan))  # no finite value in any pass
    for k, bins in ((32, 16), (5, 16), (7, 0), (0, 16)):
        rows = rows_on(tensors, device, k, bins)
        for i, t in enumerate(tensors):
            check_row(rows[i].numpy(), t, k, bins)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_tensor_uses_logical_row_major_order(device):
    x = torch.randn(40, 24)
    rows = rows_on([x.t(), x.t().contiguous()], device)
    # equal up to the summation order of the device's atomics
    assert torch.allclose(rows[0], rows[1], rtol=1e-12, atol=1e-12)
    big = torch.randn(300, 400)  # alone: the single-tensor path
    assert torch.allclose(rows_on([big.t()], device), rows_on([big.t().contiguous()], device),
                          rtol=1e-12, atol=1e-12)


def test_all_nan_gives_nan_statistics_and_limit_dtype_codes():
    t = torch.tensor([math.nan, math.inf, -math.inf])
    r = ts.device_stats([t, torch.zeros(3, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.float16)])
    assert math.isnan(r[0, C["mean"]]) and math.isnan(r[0, C["l2"]])
    assert r[0, C["nan"]] == 1 and r[0, C["inf"]] == 2
    assert [r[i, C["limit_dtype"]].item() for i in range(3)] == [2.0, 3.0, 2.0]


def test_chunking_gives_the_same_rows(monkeypatch):
    tensors = [torch.randn(1000) for _ in range(5)]
    whole = ts.device_stats(tensors)
    monkeypatch.setattr(ts, "CHUNK_ELEMENTS", 1500)
    assert torch.allclose(ts.device_stats(tensors), whole, rtol=1e-12, atol=0, equal_nan=True)
    monkeypatch.setattr(ts, "CHUNK_ELEMENTS", 300)  # every tensor alone, in passes of 300
    assert torch.allclose(ts.device_stats(tensors), whole, rtol=1e-12, atol=0, equal_nan=True)


def test_bad_arguments_raise_one_sentence():
    with pytest.raises(ValueError, match="sketch_k"):
        ts.device_stats([torch.zeros(2)], 300, 16)
    with pytest.raises(ValueError, match="hist_bins"):
        ts.device_stats([torch.zeros(2)], 32, 8)


@pytest.mark.skipif(HOST_STATS is None, reason="lockstep._core.host_stats not built")
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_equals_cpp_host_kernel(dtype):
    codes = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3, torch.float64: 4}
    for n in (33, 5000):
        t = specials_tensor(n, dtype, 7 * n).contiguous()
        row = ts.device_stats([t], 32, 16)[0].numpy()
        d = HOST_STATS(t.data_ptr(), t.numel(), codes[dtype], 32, 16)
        names = {"nan": "nan_count", "inf": "inf_count", "zero": "zero_count",
                 "sat": "sat_count", "subnormal": "subnormal_count"}
        for f in ts.FIELDS:
            want = d[names.get(f, f)]
            if isinstance(want, float) and math.isnan(want):
                assert math.isnan(row[C[f]]), f
            elif f in ("mean", "std", "l2"):
                assert abs(row[C[f]] - want) <= 1e-6 * (abs(want) + d["std"]), f
            else:
                assert row[C[f]] == want, f
        np.testing.assert_allclose(row[K0:K0 + 32], d["sketch"], rtol=0, atol=1e-5 * d["l2"])
        assert list(row[K0 + 32:]) == [float(h) for h in d["hist"]]


def check_same_exact_columns(a, b):
    """Rows of one tensor from two devices: what is exact (counts, min, max, absmax,
    histogram) is equal; sums may differ in the order of the float32 partials, within the
    documented tolerance (each is checked against the reference by check_row)."""
    exact = [C[f] for f in ("numel", "min", "max", "absmax", "nan", "inf", "zero", "sat",
                            "subnormal", "limit_dtype")]
    exact += list(range(K0 + 32, a.shape[-1]))
    assert torch.equal(torch.nan_to_num(a[..., exact], nan=-7.0),
                       torch.nan_to_num(b[..., exact], nan=-7.0))


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_cuda_rows_stay_on_device_and_match_cpu():
    tensors = [specials_tensor(n, dt, n) for n, dt in ((1000, torch.float32), (513, torch.bfloat16),
                                                       (100_000, torch.float16))]
    cpu = ts.device_stats(tensors)
    gpu = ts.device_stats([t.cuda() for t in tensors])
    assert gpu.is_cuda
    gpu = gpu.cpu()
    check_same_exact_columns(gpu, cpu)
    for i, t in enumerate(tensors):
        check_row(gpu[i].numpy(), t, 32, 16)
    assert torch.allclose(gpu, cpu, rtol=1e-6, atol=1e-6, equal_nan=True)


def _sync_debug(mode):
    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    return old


@pytest.mark.skipif(not HAS_CUDA or not hasattr(torch.cuda, "set_sync_debug_mode"),
                    reason="no CUDA device (or no sync debug mode in this torch)")
def test_cuda_device_stats_never_synchronizes():
    """Every path (one tensor, a batch, mixed dtypes reordered, passes of a large tensor,
    first calls that build the hash caches) runs without a host sync: the sync debug
    mode turns any sync into an error."""
    tensors = [specials_tensor(n, dt, n).cuda() for n, dt in
               ((3000, torch.float32), (70_000, torch.bfloat16), (100, torch.float16),
                (5, torch.float32), (0, torch.float32))]
    for cache in (ts.INDEX_CACHE, ts.PLAN_CACHE):
        cache.items.clear()
        cache.bytes = 0
    ts._small_cache.clear()
    torch.cuda.synchronize()
    old = _sync_debug("error")
    try:
        for k in (32, 17):
            ts.device_stats(tensors, k, 16)
            ts.device_stats(tensors[:1], k, 16)
            ts.device_stats(tensors[1:2], k, 0)
        big = torch.randn(ts.CHUNK_ELEMENTS + 4099, device="cuda")
        ts.device_stats([big])
    finally:
        torch.cuda.set_sync_debug_mode(old)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_cuda_large_tensor_in_two_passes_matches_cpu():
    x = specials_tensor(ts.CHUNK_ELEMENTS + 4099, torch.float32, 3)
    gpu = ts.device_stats([x.cuda()])[0].cpu()
    cpu = ts.device_stats([x])[0]
    check_same_exact_columns(gpu, cpu)
    assert torch.allclose(gpu, cpu, rtol=1e-6, atol=1e-6, equal_nan=True)
    # against the float64 reference, on a part of it (the reference is slow)
    part = x[:200_000].clone()
    check_row(ts.device_stats([part.cuda()])[0].cpu().numpy(), part, 32, 16)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_cuda_strict_deterministic_mode_gives_the_same_rows():
    """torch.use_deterministic_algorithms(True) (no warn_only): lockstep's kernels have
    deterministic CUDA implementations, so nothing raises and the rows are the same."""
    tensors = [specials_tensor(n, dt, n).cuda() for n, dt in
               ((3000, torch.float32), (70_000, torch.bfloat16), (100, torch.float16))]
    want = ts.device_stats(tensors).cpu()
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        got = ts.device_stats(tensors).cpu()
        got_single = ts.device_stats(tensors[1:2]).cpu()
    finally:
        torch.use_deterministic_algorithms(was)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)
    assert torch.allclose(got_single, want[1:2], rtol=1e-12, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_extreme_values_and_other_dtypes_match_the_reference(device):
    """Values near the float32 limit (the float32 partial sums are scaled per tensor), a
    mean far above std (the corrected two-pass variance), integers, bool and float64."""
    g = torch.Generator().manual_seed(5)
    tensors = [
        torch.tensor([3e38, -3e38, 1e38, 2.0, math.nan, -math.inf], dtype=torch.float32),
        (torch.randn(5000, generator=g, dtype=torch.float64) * 1e-5 + 1.0).float(),
        (torch.randn(5000, generator=g, dtype=torch.float64) * 1e-3 + 1e4).float(),
        torch.full((777,), 3.25),
        torch.randn(3000, generator=g) * 1e20,
        torch.randn(3000, generator=g) * 1e-30,
        torch.randn(300, generator=g, dtype=torch.float64) * 1e30,
        (torch.randn(3000, generator=g) * 1e4).to(torch.bfloat16),
        torch.randint(-5, 100000, (1000,), generator=g, dtype=torch.int64),
        torch.rand(1000, generator=g) > 0.5,
    ]
    for k in (32, 7, 0):
        rows = rows_on(tensors, device, k, 16)
        for i, t in enumerate(tensors):
            check_row(rows[i].numpy(), t, k, 16)
    assert rows[3, C["std"]] == 0.0  # a constant tensor


# ---- the fallback's contract: every dtype and edge, K widths, one call for many -------
F8 = [d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None))
      if d is not None]


def limit_tensor(dtype, n, seed):
    """Values at the dtype's limits: its largest finite value (both signs), its smallest
    normal and subnormals, zeros of both signs, NaN, +-Inf, and ordinary values. float64
    gets float32's limits: the sketch travels as float32, so float64's largest values
    have no sketch to compare."""
    fi = torch.finfo(torch.float32 if dtype == torch.float64 else dtype)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    specials = [fi.max, -fi.max, fi.tiny, -fi.tiny, fi.tiny / 2, -fi.tiny / 4, 0.0, -0.0,
                math.nan, math.inf, -math.inf, 65504.0, 448.0, 2.0 ** -14, 2.0 ** -40]
    for i, v in enumerate(specials):
        x[(i * 37) % n] = v
    if dtype in F8:  # fp8 e4m3fn has no Inf: a cast would make NaN of it
        x = torch.nan_to_num(x, posinf=fi.max, neginf=-fi.max).clamp(-fi.max, fi.max)
    return x.to(dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_every_dtype_at_its_limits_in_one_call_with_every_sketch_width(device):
    """fp32/fp16/bf16/fp64 (fp8 where torch has it): limits, subnormals, zeros, NaN,
    +-Inf, empty tensors and non-contiguous views, in one call, for K = 0, 5, 32, 256."""
    tensors = []
    for i, dt in enumerate([torch.float32, torch.float16, torch.bfloat16, torch.float64] + F8):
        tensors += [limit_tensor(dt, 700, i), torch.empty(0, dtype=dt),
                    limit_tensor(dt, 60 * 31, 10 + i).view(60, 31)[::2, 3:].t()]
    for k in (0, 5, 32, 256):
        rows = rows_on(tensors, device, k, 16)
        for i, t in enumerate(tensors):
            check_row(rows[i].numpy(), t, k, 16)


@pytest.mark.parametrize("device", DEVICES)
def test_many_tensors_of_mixed_sizes_in_one_call(device, monkeypatch):
    """Dozens of tensors from 0 to a few thousand elements, mixed dtypes, in one call
    (several levels of the row-to-tensor reduction tree, PIECE shrunk so the small ones
    have many rows; the counting and the sketch in pieces of a few rows), each row
    against the reference."""
    monkeypatch.setattr(ts, "PIECE", 16)
    monkeypatch.setattr(ts, "_WORK_ELEMENTS", 1000)
    g = torch.Generator().manual_seed(11)
    sizes = torch.randint(0, 1500, (40,), generator=g).tolist() + [0, 1, 15, 16, 17, 4000]
    dts = [torch.float32, torch.bfloat16, torch.float16]
    tensors = [specials_tensor(n, dts[i % 3], 100 + i) for i, n in enumerate(sizes)]
    rows = rows_on(tensors, device, 5, 16)
    for i, t in enumerate(tensors):
        check_row(rows[i].numpy(), t, 5, 16)


def test_a_large_tensor_in_passes_with_a_wide_sketch(monkeypatch):
    monkeypatch.setattr(ts, "CHUNK_ELEMENTS", 3000)
    monkeypatch.setattr(ts, "_WORK_ELEMENTS", 2048)
    t = specials_tensor(11_111, torch.float32, 5)
    for k in (256, 5):
        whole = ts.device_stats([t, t[:10]], k, 16)  # two tensors: not in passes
        check_row(whole[0].numpy(), t, k, 16)
        alone = ts.device_stats([t], k, 16)  # alone above the chunk: in passes
        check_row(alone[0].numpy(), t, k, 16)


def _same(a, b):
    return torch.equal(torch.nan_to_num(a, nan=-7.0), torch.nan_to_num(b, nan=-7.0))


def _mixed_batch():
    g = torch.Generator().manual_seed(3)
    return [specials_tensor(n, dt, n) for n, dt in
            ((30_000, torch.float32), (7_000, torch.bfloat16), (100, torch.float16),
             (0, torch.float32), (5, torch.float32))] + [
        torch.randn(64, 96, generator=g).t(), torch.randn(20_000, generator=g) * 1e4 + 3e5]


@pytest.mark.parametrize("device", DEVICES)
def test_rows_are_bit_identical_across_calls_and_in_deterministic_mode(device):
    """Fixed reduction order: two calls give the same bits, and so does a call under
    torch.use_deterministic_algorithms(True) (strict: nothing the fallback uses raises
    or turns serial there)."""
    tensors = [t.to(device) for t in _mixed_batch()]
    first = ts.device_stats(tensors).cpu()
    assert _same(ts.device_stats(tensors).cpu(), first)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        det = ts.device_stats(tensors).cpu()
        det_single = ts.device_stats(tensors[1:2], 5, 0).cpu()
    finally:
        torch.use_deterministic_algorithms(was)
    assert _same(det, first)
    assert _same(det_single, ts.device_stats(tensors[1:2], 5, 0).cpu())


# Ops that accumulate into repeated targets (atomics: serial, nondeterministic or an
# error in torch's deterministic mode on CUDA), and matmuls (cuBLAS wants a workspace
# setting in deterministic mode).
_FORBIDDEN = {"histc", "bincount", "index_add", "index_add_", "scatter", "scatter_",
              "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_",
              "index_put", "index_put_", "_index_put_impl_", "put", "put_", "mm", "bmm",
              "matmul", "addmm", "baddbmm", "embedding_bag", "_embedding_bag",
              "index_reduce", "index_reduce_", "segment_reduce", "_segment_reduce"}
_VIEWS = {"slice", "select", "view", "unsqueeze", "detach", "_reshape_alias", "lift_fresh",
          "alias", "as_strided", "expand", "reshape", "t", "transpose", "squeeze",
          "_unsafe_view", "lift_fresh_copy"}


def _dispatched_ops(fn):
    """(op name, [(dtype, numel) of its outputs]) of every aten op `fn` runs, or None
    where torch has no TorchDispatchMode."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten
    except ImportError:
        return None

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
            self.ops.append((func.overloadpacket.__name__, [(o.dtype, o.numel()) for o in outs]))
            return out

    with Record() as rec:
        fn()
    return rec.ops


def test_no_atomics_no_matmul_no_float64_per_element_and_launches_bounded_per_group():
    """The op list of a call (CPU, the same code a GPU/NPU runs): nothing from the
    forbidden list, float64 only on per-row or per-tensor results (well under one value
    per element), and the same ops for 5 tensors as for 50 of one dtype."""
    big = [torch.randn(100_000), torch.randn(50_000).to(torch.bfloat16)]
    ts.device_stats(big)  # warm the caches: then only the per-call work is seen
    ops = _dispatched_ops(lambda: ts.device_stats(big))
    if ops is None:
        pytest.skip("no TorchDispatchMode in this torch")
    names = {name for name, _ in ops}
    assert not names & _FORBIDDEN, names & _FORBIDDEN
    f64 = max(n for _, outs in ops for dt, n in outs if dt == torch.float64)
    assert f64 <= 150_000 // 4, f64
    counts = []
    for n in (5, 50):
        few = [torch.randn(300) for _ in range(n)]
        ts.device_stats(few)
        ops = _dispatched_ops(lambda few=few: ts.device_stats(few))
        counts.append(sum(1 for name, _ in ops if name not in _VIEWS))
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize("device", DEVICES)
def test_min_and_max_of_rows_with_nan_or_inf_and_no_zero(device):
    """NaN/Inf read as 0 in the per-row min/max and are corrected where a row has no
    finite zero: all-positive and all-negative finite values beside NaN/Inf, a row of
    nothing but NaN/Inf beside finite rows, and a true zero beside NaN."""
    nan, inf = math.nan, math.inf
    pos = torch.rand(600, generator=torch.Generator().manual_seed(1)) + 1.0
    pos[::97] = nan
    pos[5] = inf
    first_row_nan = torch.rand(600, generator=torch.Generator().manual_seed(2)) + 0.5
    first_row_nan[:256] = nan
    tensors = [torch.tensor([3.0, nan, 5.0, inf, 2.5]), torch.tensor([-3.0, -inf, -7.0, nan]),
               torch.tensor([nan, inf, -inf]), torch.tensor([0.0, nan, 4.0]),
               torch.tensor([-0.0, -inf, -2.0]), pos, -pos, first_row_nan]
    tensors += [t.to(torch.bfloat16) for t in tensors[:2]] + [t.double() for t in tensors[:2]]
    rows = rows_on(tensors, device, 32, 16)
    for i, t in enumerate(tensors):
        check_row(rows[i].numpy(), t, 32, 16)
        check_row(rows_on([t], device, 32, 16)[0].numpy(), t, 32, 16)
    assert rows[0, C["min"]] == 2.5 and rows[1, C["max"]] == -3.0
