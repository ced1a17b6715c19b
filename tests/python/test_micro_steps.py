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
    gen = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        for _ in range(MICRO):
            x = torch.randn(5, 6, generator=gen)
            (model(x).square().mean() / MICRO).backward()
        opt.step()
        opt.zero_grad()
        mon.step(loss=1.0)
    assert mon.counters()["python_errors"] == 0
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
