"""The watch() hooks written in C (_core.forward_hook, input_hook, param_grad_hook,
param_accumulated_hook: agent/python/src/py_hooks.h) record exactly what their Python
twins record, hand every rare path to them, send their errors to the guard, and let a
model that outlives its Monitor be collected."""
import gc
import weakref

import pytest
import torch
import torch.utils.checkpoint

from lockstep import _watch
from conftest import fake_monitor

C_MODULE_HOOKS, C_PARAM_HOOKS = _watch._C_HOOKS, _watch._C_PARAM_HOOKS
needs_c = pytest.mark.skipif(not C_MODULE_HOOKS,
                             reason="torch < 2.0: the forward and input hooks are Python")


class Pair(torch.nn.Module):
    """Returns a tuple: its output's tensors are named in Python (output_tensors)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.a(x)
        return y, y * 2


class Mixer(torch.nn.Module):
    """Two arguments, one by keyword: its inputs are named in Python (input_names)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(8, 8)

    def forward(self, x, scale=None):
        return self.w(x) * scale


class Net(torch.nn.Module):
    """A shared module called twice, an in-place ReLU, BatchNorm, a tuple output, a
    keyword argument, a checkpointed segment and an integer output."""

    def __init__(self, ckpt):
        super().__init__()
        self.ckpt = ckpt
        self.inp = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.relu = torch.nn.ReLU(inplace=True)
        self.shared = torch.nn.Linear(8, 8)
        self.pair = Pair()
        self.mixer = Mixer()
        self.seg = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = self.relu(self.bn(self.inp(x)))
        h = self.shared(self.shared(h))
        a, b = self.pair(h)
        h = self.mixer(a + b, scale=torch.full((1,), 0.5))
        if self.ckpt:
            h = torch.utils.checkpoint.checkpoint(self.seg, h, use_reentrant=False)
        else:
            h = self.seg(h)
        return self.head(h)


def _rows(fake):
    return [(r["step"], r["micro"], r["order"], r["kind"], r["name"],
             tuple(sorted((k, v) for k, v in r["stats"].items() if not isinstance(v, list))))
            for r in fake.records]


def _train(c_hooks, worker, ckpt=False, monkeypatch=None):
    monkeypatch.setattr(_watch, "_C_HOOKS", c_hooks and C_MODULE_HOOKS)
    monkeypatch.setattr(_watch, "_C_PARAM_HOOKS", c_hooks and C_PARAM_HOOKS)
    torch.manual_seed(0)
    model = Net(ckpt)
    mon, fake = fake_monitor(run="c-hooks", worker=worker)
    mon.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        for _micro in range(2):  # gradient accumulation: two micro steps
            x = torch.randn(16, 8, generator=gen)
            model(x).square().mean().backward()
            if worker:
                fake.run_jobs()
        opt.step()
        opt.zero_grad()
        mon.step()
        if worker:
            fake.run_jobs()
    counters = mon.counters()
    mon.close(timeout=1.0)
    assert counters["python_errors"] == 0, counters["last_python_error"]
    return _rows(fake)


@pytest.mark.parametrize("worker", [False, True])
@pytest.mark.parametrize("ckpt", [False, True])
def test_c_hooks_record_what_the_python_hooks_record(worker, ckpt, monkeypatch):
    python = _train(False, worker, ckpt, monkeypatch)
    c = _train(True, worker, ckpt, monkeypatch)
    assert len(python) > 100
    assert {"act", "act_grad", "act_in", "param_grad"} <= {r[3] for r in c}
    assert c == python


@needs_c
def test_watch_puts_c_hooks_on_modules_and_parameters():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    mon, _ = fake_monitor(run="c-hooks-types")
    mon.watch(model)
    hooks = list(model[0]._forward_hooks.values()) + list(model[0]._forward_pre_hooks.values())
    assert hooks and all(type(h).__name__ == "Hook" for h in hooks), hooks
    assert "forward hook of '0'" in repr(model[0]._forward_hooks[next(iter(model[0]._forward_hooks))])
    assert all(type(h).__name__ == "Hook" for h in model[0].weight._backward_hooks.values())
    mon.close(timeout=1.0)


@needs_c
def test_an_error_in_a_c_hook_goes_to_the_guard_and_training_goes_on():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    mon, _ = fake_monitor(run="c-hooks-error")
    mon.watch(model)
    calls = mon._session.calls

    class Broken(dict):  # not a dict the C hook reads itself: the Python twin's path
        pass

    mon._session.calls = Broken(calls)
    boom = RuntimeError("boom")

    def refuse(*_args):
        raise boom

    mon._rec._register = refuse  # the first record of every name calls it
    with pytest.warns(RuntimeWarning, match="internal error in the (forward|input) hook"):
        loss = model(torch.randn(2, 4)).sum()
    loss.backward()
    assert mon.counters()["python_errors"] >= 1
    assert "boom" in mon.counters()["last_python_error"]
    mon.close(timeout=1.0)


@needs_c
def test_a_model_that_outlives_its_monitor_is_collected_with_its_c_hooks():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    mon, _ = fake_monitor(run="c-hooks-gc")
    mon.watch(model)
    model(torch.randn(2, 4)).sum().backward()
    mon_ref, model_ref = weakref.ref(mon), weakref.ref(model)
    del mon
    gc.collect()
    assert mon_ref() is None  # the hooks hold their Session weakly, not the Monitor
    model(torch.randn(2, 4)).sum().backward()  # hooks of a gone Monitor: no-ops
    del model
    gc.collect()
    assert model_ref() is None  # the hook -> model cycle is the GC's to break


@needs_c
@pytest.mark.parametrize("thread", ["off", "auto"])
def test_the_c_hooks_leak_nothing_step_after_step(thread):
    """The C hooks count their references by hand: an object made per call and leaked
    (an output's gradient hook, a tensor kept) would grow by thousands over these steps
    (checked: a leaked gradient hook, 1803 objects)."""
    import tracemalloc  # pylint: disable=import-outside-toplevel
    import lockstep  # pylint: disable=import-outside-toplevel
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                                torch.nn.Tanh(), torch.nn.Linear(8, 2))
    mon = lockstep.Monitor(run="c-hooks-leak", endpoint="tcp://127.0.0.1:9",
                           host_stats_thread=thread)
    mon.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)

    def steps(n):
        for _ in range(n):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            mon.step()

    steps(30)
    gc.collect()
    tracemalloc.start()
    try:
        objects, before = len(gc.get_objects()), tracemalloc.take_snapshot()
        steps(300)  # ~20 hook calls a step
        gc.collect()
        grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
        new_objects = len(gc.get_objects()) - objects
    finally:
        tracemalloc.stop()
    counters = mon.counters()
    mon.close(timeout=1.0)
    assert counters["tensors_recorded"] > 300 * 15
    assert new_objects < 1000, new_objects
    assert grown < 100_000, grown


def test_a_watched_model_can_be_deep_copied_as_with_python_hooks():
    """copy.deepcopy(model) (an EMA copy) copies its hook dicts: a hook is copied as a
    Python function is, by sharing it."""
    import copy  # pylint: disable=import-outside-toplevel
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    mon, _ = fake_monitor(run="c-hooks-copy")
    mon.watch(model)
    model(torch.randn(2, 4)).sum().backward()
    twin = copy.deepcopy(model)
    assert list(twin[0]._forward_hooks.values()) == list(model[0]._forward_hooks.values())
    twin(torch.randn(2, 4)).sum().backward()
    assert copy.copy(next(iter(model[0]._forward_hooks.values()))) is next(
        iter(model[0]._forward_hooks.values()))
    assert mon.counters()["python_errors"] == 0
    mon.close(timeout=1.0)
