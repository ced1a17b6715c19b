"""The host statistics thread (Monitor host_stats_thread): outputs' and output
gradients' statistics computed off the training thread must be exactly the ones
computed inline, recorded under the same names, steps and order before the step's
EndStep; an output changed in place while its statistics were in flight is dropped
(never recorded with the changed values), and a name seen changing stays inline.

Unit tests drive a fake agent whose "thread" runs when the test says so (conftest's
FakeAgent(worker=True)), so each race is made to happen on purpose; the end-to-end
test runs the real thread into a real collector."""
import os

import pytest
import torch
from torch import nn

import lockstep
from conftest import TENSOR_KINDS, fake_monitor, plain_stats
from lockstep import _config
from lockstep._tune import ThreadTuner

from test_watch import mlp, train_step


def _key(r):
    return (r["step"], r["micro"], r["order"])


def _records(fake):
    return [(r["step"], r["micro"], r["order"], r["name"], r["kind"], r["stats"])
            for r in sorted(fake.records, key=_key)]


def test_threaded_records_equal_inline_records_and_settle_before_end_step():
    runs = {}
    for worker in (False, True):
        mon, fake = fake_monitor(worker=worker)
        model = mlp()
        mon.watch(model)
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
        for _ in range(4):
            train_step(model, x, mon)
            assert fake.settled == len(fake.jobs)  # nothing left for after EndStep
        runs[worker] = (_records(fake), mon.counters(), fake)
    inline, threaded = runs[False][0], runs[True][0]
    assert threaded == inline
    counters, fake = runs[True][1], runs[True][2]
    # Step 0 is all inline (first records are probed); then outputs and output
    # gradients go to the thread, parameter gradients stay inline.
    assert counters["tensors_threaded"] == len(fake.jobs) > 0
    kinds = {fake.tensors[job[2]][1] for job in fake.jobs}
    assert kinds <= {"act", "act_grad", "act_in"}
    assert min(job[0] for job in fake.jobs) == 1
    assert counters["tensors_changed_in_flight"] == 0
    assert fake.kicks == 6  # the start and the end of each backward that handed it gradients


# torch >= 2.1: a parameter's .grad adopted by autograd can go to the thread.
_POST_ACCUMULATE = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


def _optimizer_run(worker, clip=False, accumulate=1, steps=5):
    """SGD with zero_grad(set_to_none=True) after each update (the default): each
    backward's .grad was None before it, so autograd adopts the gradient as .grad.
    With `accumulate` > 1, micro steps after the first add into .grad."""
    mon, fake = fake_monitor(worker=worker)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mon.watch(model, optimizer=opt)
    gen = torch.Generator().manual_seed(3)
    for _ in range(steps):
        for _ in range(accumulate):
            loss = model(torch.randn(5, 4, generator=gen)).pow(2).mean()
            loss.backward()
        if clip:  # scales every gradient in place, after backward
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
        opt.step()
        opt.zero_grad(set_to_none=True)
        mon.step(loss=loss)
        assert fake.settled == len(fake.jobs)
    return _records(fake), mon.counters(), fake


def _threaded_kinds(fake, step=None):
    return {fake.tensors[job[2]][1] for job in fake.jobs if step is None or job[0] == step}


def test_adopted_parameter_gradients_go_to_the_thread_with_the_inline_statistics():
    inline, _, fake_inline = _optimizer_run(False)
    threaded, counters, fake = _optimizer_run(True)
    assert threaded == inline
    # The reported gradient norm (from the parameter gradients' l2) is the same too.
    assert [s["grad_norm"] for s in fake.scalars] == \
        [s["grad_norm"] for s in fake_inline.scalars]
    assert counters["tensors_changed_in_flight"] == 0 and counters["tensors_failed"] == 0
    if not _POST_ACCUMULATE:  # torch 1.13: no post-accumulate hook, gradients inline
        assert "param_grad" not in _threaded_kinds(fake)
        return
    # Step 0 has no ids yet, step 1 probes .grad (inline), from step 2 on the thread.
    assert "param_grad" not in _threaded_kinds(fake, 1)
    assert _threaded_kinds(fake, 2) >= {"param_grad", "act", "act_grad"}
    n_params = len(list(mlp().parameters()))
    assert sum(fake.tensors[j[2]][1] == "param_grad" for j in fake.jobs) == 3 * n_params


def test_gradients_clipped_in_place_after_backward_stay_inline_and_none_is_dropped():
    inline, _, _ = _optimizer_run(False, clip=True)
    threaded, counters, fake = _optimizer_run(True, clip=True)
    assert threaded == inline
    assert "param_grad" not in _threaded_kinds(fake)  # the probe saw the clip
    assert counters["tensors_changed_in_flight"] == 0


def test_accumulated_micro_steps_record_each_micro_steps_own_gradient():
    inline, _, _ = _optimizer_run(False, accumulate=2, steps=4)
    threaded, counters, fake = _optimizer_run(True, accumulate=2, steps=4)
    assert threaded == inline
    # Micro step 1 adds into the .grad micro step 0 left (in place): the probe sees it,
    # and the parameter gradients stay inline (each micro step's own gradient, exact).
    assert "param_grad" not in _threaded_kinds(fake)
    assert _threaded_kinds(fake) >= {"act", "act_grad"}
    assert counters["tensors_changed_in_flight"] == 0


def test_a_repeat_of_a_tensor_still_in_flight_is_recorded_with_its_result():
    mon, fake = fake_monitor(worker=True)
    model = mlp()
    mon.watch(model, kinds=TENSOR_KINDS)  # outputs' repeats only (act_in: test_watch)
    for _ in range(3):
        train_step(model, torch.randn(3, 4), mon)
    recs = {(r["step"], r["name"], r["kind"]): r["stats"] for r in fake.records}
    for step in (1, 2):  # "<root>"'s output is "2"'s, computed on the thread
        for kind in ("act", "act_grad"):
            a, b = recs[(step, "<root>", kind)], recs[(step, "2", kind)]
            assert plain_stats(a) == plain_stats(b)
            assert a.get("repeat", False) != b.get("repeat", False)  # one of them is the repeat
    assert mon.counters()["tensors_repeated"] == 6
    assert len(fake.records) == len({(r["step"], r["name"], r["kind"]) for r in fake.records})


class InPlaceFromStep1(nn.Module):
    """Changes its child's output in place after the child's hook, from step 1 on: the
    first (probed) record sees no change, so the name goes to the thread."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)
        self.calls = 0

    def forward(self, x):
        y = self.lin(x)
        if self.calls > 0:
            y.mul_(3.0).add_(1.0)
        self.calls += 1
        return y


def test_an_output_changed_in_place_while_in_flight_is_dropped_then_kept_inline():
    mon, fake = fake_monitor(worker=True)
    model = InPlaceFromStep1()
    mon.watch(model, kinds=("act",))
    seen = {}
    model.lin.register_forward_hook(lambda _m, _i, o: seen.__setitem__("lin", o.detach().clone()))
    means = []
    for _ in range(3):
        train_step(model, torch.randn(3, 4), mon)
        means.append(seen["lin"].double().mean().item())
    lin = {r["step"]: r["stats"] for r in fake.records if r["name"] == "lin"}
    # step 1: the thread read the tensor after mul_/add_ (the test ran it at step end):
    # dropped, not recorded with the changed values
    assert sorted(lin) == [0, 2]
    assert lin[0]["mean"] == pytest.approx(means[0], rel=1e-5)
    assert lin[2]["mean"] == pytest.approx(means[2], rel=1e-5)  # inline from then on
    counters = mon.counters()
    assert counters["tensors_changed_in_flight"] == 1
    assert [fake.tensors[j[2]][0] for j in fake.jobs].count("lin") == 1


def test_a_result_read_before_an_in_place_change_but_settled_after_is_dropped():
    mon, fake = fake_monitor(worker=True)
    model = InPlaceFromStep1()
    mon.watch(model, kinds=("act",))
    seen = {}

    def grab(_m, _i, o):
        seen["lin"] = o.detach().clone()

    model.lin.register_forward_hook(grab)
    train_step(model, torch.randn(3, 4), mon)
    # step 1: run the thread's job right after lockstep's hook, before mul_/add_ ...
    model.lin.register_forward_hook(lambda *_: fake.run_jobs())
    train_step(model, torch.randn(3, 4), mon)
    lin = {r["step"]: r["stats"] for r in fake.records if r["name"] == "lin"}
    # ... but settled only after the change: the recorder cannot tell when the thread
    # read it, so it drops the result rather than risk a wrong one
    assert sorted(lin) == [0]
    assert mon.counters()["tensors_changed_in_flight"] == 1


class ResidualBlock(nn.Module):
    """A ResNet-style block: the norm's output is changed in place by the residual add
    and an inplace ReLU, after the norm's hook, at every step."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.norm(self.lin(x))
        out += x
        return self.relu(out)


def test_outputs_changed_in_place_at_every_step_stay_inline_and_are_right():
    mon, fake = fake_monitor(worker=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), ResidualBlock(), nn.Linear(6, 2))
    mon.watch(model)
    seen = {}
    model[1].norm.register_forward_hook(
        lambda _m, _i, o: seen.__setitem__("norm", o.detach().clone()))
    norms = []
    for _ in range(4):
        train_step(model, torch.randn(5, 4), mon)
        norms.append(seen["norm"].double())
    recs = {r["step"]: r["stats"] for r in fake.records
            if r["name"] == "1.norm" and r["kind"] == "act"}
    assert sorted(recs) == [0, 1, 2, 3]
    for step, ref in enumerate(norms):
        assert recs[step]["mean"] == pytest.approx(ref.mean().item(), rel=1e-5, abs=1e-7)
        assert recs[step]["l2"] == pytest.approx(ref.norm().item(), rel=1e-5)
    counters = mon.counters()
    assert counters["tensors_changed_in_flight"] == 0
    threaded = {fake.tensors[j[2]][:2] for j in fake.jobs}
    assert ("1.norm", "act") not in threaded
    assert ("1.relu", "act") in threaded  # nothing changes the ReLU's output after it
    assert counters["tensors_threaded"] > 0


def test_a_full_thread_means_inline_records():
    mon, fake = fake_monitor(worker=True)
    fake.worker_full = True
    model = mlp()
    mon.watch(model, kinds=TENSOR_KINDS)
    for _ in range(3):
        train_step(model, torch.randn(3, 4), mon)
    assert fake.jobs == []
    assert mon.counters()["tensors_threaded"] == 0
    assert len(fake.records) == 3 * len(fake.names(step=0))


def test_host_stats_thread_option_values():
    assert _config.resolve_host_stats_thread("on") is True
    assert _config.resolve_host_stats_thread(False) is False
    auto = _config.resolve_host_stats_thread("auto")
    cores = _config.physical_cores()
    assert 1 <= cores <= len(os.sched_getaffinity(0))
    assert auto == (max(torch.get_num_threads(), _config.blas_threads()) < cores)
    with pytest.warns(RuntimeWarning, match="host_stats_thread='sometimes' is not valid: give one of auto, on, off"):
        mon = lockstep.Monitor(run="x", endpoint="tcp://127.0.0.1:9",
                               host_stats_thread="sometimes")
    assert not mon.enabled


def _tensor_records(collector, run):
    log = collector.inspect(run)
    assert log and log[-1]["type"] == "Goodbye", log[-3:]
    return sorted(((r["body"]["step"], s["micro_step"], s["order"], s["name"], s["kind"],
                    tuple(sorted((k, str(v)) for k, v in s.items()
                                 if k not in ("order", "micro_step"))))
                   for r in log if r["type"] == "StepStats" for s in r["body"]["stats"]),
                  key=lambda t: t[:3])


class _PassThrough:
    """The real agent behind a Python object: the recorder then calls it through Python
    (RecorderCore's AgentPort), as it does a test's FakeAgent."""

    def __init__(self, agent):
        self._agent = agent

    def __getattr__(self, name):
        return getattr(self._agent, name)


def test_real_thread_into_a_real_collector_matches_inline(collector):
    """The real C++ thread, a model with in-place changes after hooks, a real collector:
    the logs of a threaded and an inline run are identical record for record, and so
    are those of a threaded run whose recorder calls the agent through Python (what the
    FakeAgent tests see) instead of directly."""
    results = {}
    for mode in ("on", "off", "on-via-python"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 64), ResidualBlock64(), nn.Linear(64, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run = "host-thread-" + mode
        mon = lockstep.Monitor(run=run, endpoint=collector.endpoint,
                               host_stats_thread=mode.split("-")[0])
        assert mon.enabled
        if mode == "on-via-python":
            mon._rec._agent = _PassThrough(mon._rec._agent)
        mon.watch(model, kinds=TENSOR_KINDS)
        gen = torch.Generator().manual_seed(3)
        for _ in range(5):
            x = torch.randn(256, 4, generator=gen)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss=loss)
        assert mon.close(timeout=10.0)
        results[mode] = (_tensor_records(collector, run), mon.counters())
    on, off = results["on"], results["off"]
    assert on[1]["tensors_threaded"] > 0
    assert off[1]["tensors_threaded"] == 0
    assert on[1]["tensors_changed_in_flight"] == 0
    assert on[1]["python_errors"] == 0, on[1]["last_python_error"]
    assert len(on[0]) == len(off[0]) == 5 * len([r for r in off[0] if r[0] == 0])
    assert on[0] == off[0]
    via = results["on-via-python"]
    assert via[1]["tensors_threaded"] == on[1]["tensors_threaded"]
    assert via[0] == on[0]


class ResidualBlock64(ResidualBlock):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)
        self.norm = nn.LayerNorm(64)


def _feed(tuner, on_s, off_s, steps):
    """Runs `steps` watched steps taking on_s with the thread and off_s without."""
    modes = []
    for _ in range(steps):
        mode = tuner.next_mode()
        modes.append(mode)
        tuner.add(mode, on_s if mode else off_s)
    return modes


def test_tuner_keeps_the_thread_only_where_it_is_faster():
    n = ThreadTuner.WARMUP + 2 * ThreadTuner.PAIRS
    faster = ThreadTuner()
    modes = _feed(faster, 0.97, 1.0, n)
    assert modes[:ThreadTuner.WARMUP] == [True] * ThreadTuner.WARMUP
    measured = modes[ThreadTuner.WARMUP:]
    for i in range(0, len(measured), 2):  # each pair: one step each way
        assert measured[i] != measured[i + 1]
    assert faster.decisions == 1 and faster.use_thread and faster.ratio == pytest.approx(0.97)
    assert _feed(faster, 0.97, 1.0, 5) == [True] * 5

    slower = ThreadTuner()
    _feed(slower, 1.03, 1.0, n)
    assert not slower.use_thread and slower.ratio == pytest.approx(1.03)
    assert _feed(slower, 1.03, 1.0, 5) == [False] * 5

    even = ThreadTuner()  # not faster by the margin: inline (no thread to pay for)
    _feed(even, 0.998, 1.0, n)
    assert not even.use_thread


def test_tuner_measures_again_and_follows_a_change():
    tuner = ThreadTuner()
    _feed(tuner, 0.9, 1.0, ThreadTuner.WARMUP + 2 * ThreadTuner.PAIRS)
    assert tuner.use_thread
    _feed(tuner, 0.9, 1.0, ThreadTuner.RETUNE)  # then the machine changes
    _feed(tuner, 1.1, 1.0, 2 * ThreadTuner.PAIRS)
    assert tuner.decisions == 2 and not tuner.use_thread


def test_auto_switches_the_recorder_per_step_as_the_tuner_says():
    mon, fake = fake_monitor(worker=True)
    mon._tuner = ThreadTuner()
    model = mlp()
    mon.watch(model, kinds=TENSOR_KINDS)
    planned, submitted = [], []
    for step in range(ThreadTuner.WARMUP + 2 * ThreadTuner.PAIRS + 3):
        planned.append(mon._tuner.next_mode())
        before = len(fake.jobs)
        train_step(model, torch.randn(3, 4), mon)
        submitted.append(len(fake.jobs) > before)
    # Step 0's records are all first records (inline); from then on a step uses the
    # thread exactly when the tuner planned it.
    assert submitted[1:] == planned[1:]
    assert mon._tuner.decisions == 1
    counters = mon.counters()
    assert counters["host_stats_thread_ratio"] == mon._tuner.ratio is not None
    assert counters["host_stats_thread"] == mon._tuner.use_thread
    # Inline or threaded, every step recorded the same tensors.
    per_step = {s: len(fake.names(step=s)) for s in range(len(planned))}
    assert len(set(per_step.values())) == 1


class Transpose(nn.Module):
    def forward(self, y):
        return y.transpose(0, 1)  # a (6, 128) view of (128, 6): element-wise strides


class NineDims(nn.Module):
    def forward(self, y):
        # Nine dims in reverse order: nothing merges, more than the kernel's eight.
        return y.reshape(-1)[:512].reshape((2,) * 9).permute(*reversed(range(9)))


class Views(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 6)
        self.t = Transpose()
        self.nine = NineDims()

    def forward(self, x):
        y = self.lin(x)
        return self.t(y).sum(0) + self.nine(y).sum()


@pytest.mark.parametrize("worker", [False, True])
def test_strided_views_are_read_in_place_with_the_statistics_of_their_copy(worker):
    mon, fake = fake_monitor(worker=worker)
    model = Views()
    mon.watch(model, kinds=("act",))
    seen, layouts = {}, set()

    def keep(_m, _i, o, name):
        layouts.add(o.is_contiguous())
        # (clone() alone would keep a permuted tensor's strides)
        seen.setdefault(name, []).append(o.detach().clone(memory_format=torch.contiguous_format))

    for name in ("t", "nine"):
        getattr(model, name).register_forward_hook(lambda m, i, o, name=name: keep(m, i, o, name))
    x = torch.randn(128, 4, generator=torch.Generator().manual_seed(3))
    for _ in range(3):
        train_step(model, x, mon)
    assert layouts == {False}
    for name in ("t", "nine"):
        recs = [r["stats"] for r in sorted(fake.records, key=_key) if r["name"] == name]
        assert len(recs) == 3
        for got, copy in zip(recs, seen[name]):
            want = lockstep._core.host_stats(copy.data_ptr(), copy.numel(), 1, fake.k, fake.bins)
            for key in ("numel", "min", "max", "nan_count", "zero_count", "hist"):
                assert got[key] == want[key], (name, key)
            for key in ("mean", "std", "l2"):
                assert got[key] == pytest.approx(want[key], rel=1e-6), (name, key)
            assert got["sketch"] == pytest.approx(want["sketch"], abs=1e-5 * want["l2"])
    # The transposed view went to the kernel in place every step (inline at step 0, the
    # thread's after); the nine-dim one each time as a contiguous copy.
    assert fake.strided >= 3
    if worker:
        threaded = [fake.tensors[j[2]][0] for j in fake.jobs]
        assert threaded.count("t") == 2 and "nine" not in threaded
        assert mon.counters()["tensors_changed_in_flight"] == 0
