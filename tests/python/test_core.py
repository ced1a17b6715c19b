"""lockstep._core, the binding: host_stats passes the kernel's result through intact,
record_packed/unpack_row accept exactly the documented row layout, and the hot calls
report failures as values instead of raising."""
import math
import threading

import numpy as np
import pytest
import torch

from lockstep import _core

K, BINS = _core.DEFAULT_SKETCH_K, _core.HIST_BINS
F32, F16, BF16 = _core.DTYPES["float32"], _core.DTYPES["float16"], _core.DTYPES["bfloat16"]


def special_values(dtype):
    tiny = torch.finfo(dtype).tiny
    x = torch.tensor([0.0, -0.0, 1.5, -2.25, float("nan"), float("inf"), -float("inf"),
                      tiny / 4, 3.0e4, -7.0], dtype=torch.float32).to(dtype)
    return x


@pytest.mark.parametrize("dtype,code", [(torch.float32, F32), (torch.float16, F16),
                                        (torch.bfloat16, BF16)])
def test_host_stats_matches_a_float64_reference(dtype, code):
    x = special_values(dtype)
    s = _core.host_stats(x.data_ptr(), x.numel(), code, K, BINS)
    ref = x.double()
    finite = ref[torch.isfinite(ref)]
    assert s["numel"] == x.numel()
    assert (s["nan_count"], s["inf_count"]) == (1, 2)
    assert s["zero_count"] == int((ref == 0).sum())
    assert s["min"] == pytest.approx(finite.min().item(), rel=1e-12)
    assert s["max"] == pytest.approx(finite.max().item(), rel=1e-12)
    assert s["mean"] == pytest.approx(finite.mean().item(), rel=1e-6)
    assert s["std"] == pytest.approx(finite.std(unbiased=False).item(), rel=1e-6)
    assert s["l2"] == pytest.approx(finite.norm().item(), rel=1e-6)
    assert s["absmax"] == pytest.approx(finite.abs().max().item(), rel=1e-12)
    assert len(s["sketch"]) == K and len(s["hist"]) == BINS
    assert s["subnormal_count"] >= 1  # tiny/4 is subnormal in every one of these dtypes


def test_host_stats_rejects_an_unsupported_dtype_with_a_sentence():
    x = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"\w+ \w+"):
        _core.host_stats(x.data_ptr(), 4, _core.DTYPES["int32"], K, BINS)


def row_for(stats, k=K, bins=BINS):
    fixed = [stats[f] for f in ("numel", "min", "max", "mean", "std", "l2", "absmax",
                                "nan_count", "inf_count", "zero_count", "sat_count",
                                "subnormal_count", "limit_dtype")]
    return np.array(fixed + list(stats["sketch"])[:k] + list(stats["hist"])[:bins],
                    dtype=np.float64)


def test_unpack_row_round_trips_the_documented_layout():
    assert _core.PACKED_FIXED_COLUMNS == 13
    x = torch.randn(100)
    s = _core.host_stats(x.data_ptr(), 100, F32, K, BINS)
    back = _core.unpack_row(row_for(s), K, BINS)
    for key in ("numel", "min", "max", "mean", "std", "l2", "absmax", "nan_count",
                "zero_count", "limit_dtype"):
        assert back[key] == s[key], key
    assert back["sketch"] == pytest.approx(s["sketch"], rel=1e-6)
    assert back["hist"] == s["hist"]


@pytest.mark.parametrize("mutate", [
    lambda r: r[:-1],                                   # wrong width
    lambda r: np.concatenate([r, [0.0]]),
    lambda r: np.where(np.arange(len(r)) == 0, -1.0, r),   # negative numel
    lambda r: np.where(np.arange(len(r)) == 7, math.nan, r),  # NaN count
    lambda r: np.where(np.arange(len(r)) == 12, 99.0, r),  # unknown limit dtype code
])
def test_unpack_row_rejects_malformed_rows(mutate):
    x = torch.randn(10)
    row = row_for(_core.host_stats(x.data_ptr(), 10, F32, K, BINS))
    assert _core.unpack_row(row, K, BINS) is not None
    assert _core.unpack_row(mutate(row), K, BINS) is None


def test_hot_calls_return_values_instead_of_raising():
    agent = _core.Agent.create(endpoint="tcp://127.0.0.1:9", run="core-test")
    try:
        tid = agent.register_tensor("w", _core.KINDS["act"], F32, [3], 0)
        assert tid == agent.register_tensor("w", _core.KINDS["act"], F32, [3], 0)
        x = torch.randn(3)
        l2 = agent.record_host_tensor(0, 0, tid, 0, x.data_ptr(), 3, F32)
        assert l2 == pytest.approx(x.double().norm().item(), rel=1e-6)
        assert agent.record_host_tensor(0, 0, tid, 0, x.data_ptr(), 3, 77) == _core.HostOutcome.REFUSED
        rows = np.stack([row_for(_core.host_stats(x.data_ptr(), 3, F32, K, BINS))] * 2)
        ids = np.array([tid, tid], dtype=np.uint32)
        assert agent.record_packed(0, ids * 0, ids, np.array([1, 2], np.uint32), rows) == 2
        assert agent.record_packed(0, ids * 0, ids, ids, rows[:, :-1]) == 0  # bad width
        assert agent.record_packed(0, ids[:1], ids, ids, rows) == 0          # bad lengths
        assert agent.record_scalars(0, loss=1.0)
        assert agent.end_step(0)
        c = agent.counters()
        assert c["host_stats_errors"] == 1 and c["packed_errors"] == 2
        assert c["records_enqueued"] == 3
    finally:
        assert agent.close(1.0) in (True, False)


NOTHING = _core.HostOutcome.NOTHING_TO_REPEAT


def test_record_repeat_reuses_only_this_threads_last_statistics_of_this_agent():
    a = _core.Agent.create(endpoint="tcp://127.0.0.1:9", run="repeat-a")
    b = _core.Agent.create(endpoint="tcp://127.0.0.1:9", run="repeat-b")
    try:
        x = torch.randn(5)
        ta = [a.register_tensor(n, _core.KINDS["act"], F32, [5], i) for i, n in enumerate("pq")]
        tb = b.register_tensor("p", _core.KINDS["act"], F32, [5], 0)
        assert a.record_repeat(0, 0, ta[1], 1) == NOTHING  # nothing computed yet
        l2 = a.record_host_tensor(0, 0, ta[0], 0, x.data_ptr(), 5, F32)
        assert a.record_repeat(0, 0, ta[1], 1) == l2
        assert b.record_repeat(0, 0, tb, 0) == NOTHING  # a's statistics are not b's
        assert a.record_host_tensor(0, 0, ta[0], 0, x.data_ptr(), 5, 77) == _core.HostOutcome.REFUSED
        assert a.record_repeat(0, 0, ta[1], 1) == NOTHING  # a refused tensor leaves none
        got = []
        a.record_host_tensor(0, 0, ta[0], 0, x.data_ptr(), 5, F32)
        th = threading.Thread(target=lambda: got.append(a.record_repeat(0, 0, ta[1], 1)))
        th.start()
        th.join()
        assert got == [NOTHING]  # another thread's last statistics are not this one's
        assert a.counters()["records_enqueued"] == 3
    finally:
        a.close(1.0)
        b.close(1.0)


def test_agent_create_names_the_bad_option():
    with pytest.raises(ValueError, match="role 'boss'"):
        _core.Agent.create(endpoint="tcp://127.0.0.1:9", run="x", role="boss")
    with pytest.raises(ValueError, match="run"):
        _core.Agent.create(endpoint="tcp://127.0.0.1:9", run="../x")
