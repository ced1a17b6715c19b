"""Micro steps and activation checkpointing (issue 20): with gradient accumulation (4
micro steps) and ``torch.utils.checkpoint`` (reentrant and not), a step has 4 micro
steps — not one more per recomputed forward —, every tensor is recorded once per micro
step, with the statistics of the same loop without checkpointing, and the execution
order counts on across micro steps."""
import collections
import warnings

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from conftest import fake_monitor

MICRO = 4
STEPS = 2


class Net(torch.nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.mode = mode  # None: no checkpoint; True / False: use_reentrant; "default"
        self.inp = torch.nn.Linear(6, 8)
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                        torch.nn.Linear(8, 8))
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        h = self.inp(x)
        if self.mode is None:
            h = self.body(h)
        elif self.mode == "default":  # what a loop written for torch 1.x calls (torch 2.x warns)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                h = checkpoint(self.body, h)
        else:
            h = checkpoint(self.body, h, use_reentrant=self.mode)
        return self.head(h)


def _run(mode):
    torch.manual_seed(0)
    model = Net(mode)
    mon, fake = fake_monitor(run="ckpt")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon.watch(model, optimizer=opt)
    return _train(model, mon, fake, opt)


def _train(model, mon, fake, opt):
    """STEPS steps of MICRO accumulated micro steps on seeded data; the fake's records."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        for _ in range(MICRO):
            x = torch.randn(5, 6, generator=gen)
            (model(x).square().mean() / MICRO).backward()
        opt.step()
        opt.zero_grad()
        mon.step(loss=1.0)
    assert mon.counters()["python_errors"] == 0, mon.counters()["last_python_error"]
    return fake


def _stats(rec):
    # "repeat" is how a record was computed, not what it holds: under checkpointing the
    # outputs are recorded in backward, so what the next module received in forward
    # (act_in) is no longer the record just before it, and is computed again.
    return tuple(sorted((k, v) for k, v in rec["stats"].items()
                        if not isinstance(v, list) and k != "repeat"))


@pytest.mark.parametrize("mode", [None, True, False, "default"],
                         ids=["plain", "reentrant", "non-reentrant", "default"])
def test_micro_steps_with_checkpointing(mode):
    fake = _run(mode)
    assert [s["micro_steps"] for s in fake.scalars] == [MICRO] * STEPS
    keys = collections.Counter((r["step"], r["micro"], r["name"], r["kind"])
                               for r in fake.records)
    dup = [k for k, n in keys.items() if n > 1]
    assert not dup, dup  # recomputation recorded nothing twice
    assert {k[1] for k in keys} == set(range(MICRO))
    names = {(k[2], k[3]) for k in keys if k[0] == 0 and k[1] == 2}
    assert {("body.0", "act"), ("body.2", "act_grad"), ("body", "act"), ("inp", "act_grad"),
            ("body.0.weight", "param_grad")} <= names, sorted(names)
    for step in range(STEPS):
        recs = [r for r in fake.records if r["step"] == step]
        orders = [r["order"] for r in recs]
        assert len(set(orders)) == len(orders)
        for micro in range(MICRO - 1):
            this = [r["order"] for r in recs if r["micro"] == micro]
            nxt = [r["order"] for r in recs if r["micro"] == micro + 1]
            assert max(this) < min(nxt), (step, micro)


def test_checkpointing_records_what_the_plain_loop_records():
    plain = {(r["step"], r["micro"], r["name"], r["kind"]): _stats(r)
             for r in _run(None).records}
    for mode in (True, False, "default"):
        got = {(r["step"], r["micro"], r["name"], r["kind"]): _stats(r)
               for r in _run(mode).records}
        assert got.keys() == plain.keys(), (mode, sorted(got.keys() ^ plain.keys()))
        assert got == plain, mode


# Issue 30: a module called twice per forward, its calls checkpointed. Reentrant
# checkpointing runs each segment's forward under no_grad and again in backward, in
# backward order, each with a backward of its own: the calls used to be named in backward
# order (`shared` and `shared#1` swapped) and each parameter of `shared` got one gradient
# record per segment. Every record must be the plain loop's.
class SharedNet(torch.nn.Module):
    """`shared` called twice; `wrap` says which calls are checkpointed: None (none),
    "each" (one checkpoint per call), "both" (one around the two calls), "second" (the
    second call only)."""

    def __init__(self, mode, wrap):
        super().__init__()
        self.mode, self.wrap = mode, wrap
        self.inp = torch.nn.Linear(6, 8)
        self.shared = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
        self.head = torch.nn.Linear(8, 2)

    def _ck(self, fn, h):
        return checkpoint(fn, h, use_reentrant=self.mode)

    def _twice(self, h):
        return self.shared(self.shared(h) * 0.5)

    def forward(self, x):
        h = self.inp(x)
        if self.wrap is None:
            h = self._twice(h)
        elif self.wrap == "both":
            h = self._ck(self._twice, h)
        elif self.wrap == "each":
            h = self._ck(self.shared, self._ck(self.shared, h) * 0.5)
        else:  # "second"
            h = self._ck(self.shared, self.shared(h) * 0.5)
        return self.head(h)


def _run_shared(mode, wrap, kinds=None, device_path=False):
    torch.manual_seed(0)
    model = SharedNet(mode, wrap)
    mon, fake = fake_monitor(run="ckpt-shared", _force_device_path=device_path)
    # `shared` is not updated: reentrant checkpointing adds each segment's piece of its
    # gradient to .grad on its own (B, A, then the next micro step's B, A), the plain loop
    # their sum, so its updated weights may differ by an ulp (torch's arithmetic, not
    # lockstep's records).
    opt = torch.optim.SGD([{"params": [*model.inp.parameters(), *model.head.parameters()]},
                           {"params": model.shared.parameters(), "lr": 0.0}], lr=0.1)
    mon.watch(model, optimizer=opt, **({} if kinds is None else {"kinds": kinds}))
    return _train(model, mon, fake, opt)


def _by_key(fake):
    got = {}
    for r in fake.records:
        k = (r["step"], r["micro"], r["name"], r["kind"])
        assert k not in got, k  # one record per tensor per micro step
        got[k] = _stats(r)
    return got


_PLAIN_SHARED = {}


def _plain_shared(kinds=None):
    if kinds not in _PLAIN_SHARED:
        _PLAIN_SHARED[kinds] = _by_key(_run_shared(None, None, kinds))
    return _PLAIN_SHARED[kinds]


@pytest.mark.parametrize("wrap", ["each", "both", "second"])
@pytest.mark.parametrize("mode", [True, False], ids=["reentrant", "non-reentrant"])
def test_shared_module_under_checkpointing_records_the_plain_loop(mode, wrap):
    plain = _plain_shared()
    # the plain loop itself: both calls, in forward order, one gradient per parameter
    names = {(k[2], k[3]) for k in plain if k[:2] == (1, 2)}
    assert {("shared", "act"), ("shared#1", "act"), ("shared.0#1", "act_in"),
            ("shared#1", "act_grad"), ("shared.0.weight", "param_grad")} <= names
    got = _by_key(_run_shared(mode, wrap))
    assert got.keys() == plain.keys(), sorted(got.keys() ^ plain.keys())
    diff = sorted(k for k in plain if got[k] != plain[k])
    assert not diff, diff  # names by forward call order, the summed parameter gradients


def test_shared_module_through_the_device_path():
    """The same through the device pipeline (CPU tensors forced through it): the summed
    pieces are batched like any gradient."""
    plain = _by_key(_run_shared(None, None, device_path=True))
    for wrap in ("each", "second"):
        got = _by_key(_run_shared(True, wrap, device_path=True))
        assert got.keys() == plain.keys(), (wrap, sorted(got.keys() ^ plain.keys()))
        assert got == plain, wrap


def test_shared_module_inputs_and_parameter_gradients_only():
    """kinds=("act_in", "param_grad"): no output is recorded, yet the forward hooks still
    number the calls, so the inputs keep their forward names and the pieces of
    `shared`'s gradient make one record."""
    kinds = ("act_in", "param_grad")
    plain = _plain_shared(kinds)
    assert {k[3] for k in plain} == {"act_in", "param_grad"}
    assert {("shared#1", "act_in"), ("shared.0#1", "act_in")} <= {k[2:] for k in plain}
    for wrap in ("each", "second"):
        got = _by_key(_run_shared(True, wrap, kinds))
        assert got == plain, (wrap, sorted(got.keys() ^ plain.keys()))


def _retained_twice(mode, wrap):
    """One micro step, two backward passes through one retained graph."""
    torch.manual_seed(0)
    model = SharedNet(mode, wrap)
    mon, fake = fake_monitor(run="ckpt-retained")
    mon.watch(model)
    out = model(torch.randn(5, 6, generator=torch.Generator().manual_seed(3)))
    out.sum().backward(retain_graph=True)
    out.square().sum().backward()
    mon.step(loss=1.0)
    assert mon.counters()["python_errors"] == 0, mon.counters()["last_python_error"]
    return collections.Counter((r["micro"], r["name"], r["kind"], _stats(r)) for r in fake.records)


def test_retained_graph_backward_twice_records_outputs_once():
    """A second backward through a retained graph recomputes the reentrant segments
    again: their outputs are not recorded again (the plain loop records them once), their
    gradients are (as the plain loop's, once per backward)."""
    plain = _retained_twice(None, None)
    assert sum(n for k, n in plain.items() if k[2] == "act") == \
        len({k for k in plain if k[2] == "act"})
    for mode in (True, False):
        got = _retained_twice(mode, "each")
        assert got == plain, (mode, sorted((got - plain).keys()), sorted((plain - got).keys()))
