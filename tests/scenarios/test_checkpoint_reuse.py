"""Issue 30, item 1: a module called twice, under activation checkpointing.

Model: ReuseNet. `inp` (Linear), then the module `shared` (Linear + Tanh) called twice,
then two heads (`heads.cls`, a classifier under cross-entropy, `heads.reg`, a regressor
under MSE); the root returns a dict (`<root>[hidden]`, `<root>[cls]`, `<root>[reg]`).
Gradient accumulation over 2 micro batches a step, AdamW, fp32 on CPU, 3 steps. Each call
of `shared` is its own checkpoint segment (`torch.utils.checkpoint`, reentrant or not).

Reentrant checkpointing runs a segment's forward under no_grad and again in backward, in
backward order, each followed by a backward of its own: before, the recomputed calls were
named in backward order (`shared` and `shared#1` swapped) and each parameter of `shared`
got one gradient record per segment, so the same training with and without checkpointing
was a false critical (the backward of `<root>[hidden]`), and a change in the second call
was blamed on the heads.

- twins: the plain loop against the same loop with checkpointing: no alert, compare
  exits 0. (Reentrant checkpointing adds the two pieces of `shared`'s gradient to .grad
  one at a time, the plain loop their sum: their updates may differ by an ulp, which is
  the platform's rounding and far below any tolerance.)
- the second call changed: a forward hook on the candidate's `shared` scales the output
  of the second call only by (1 + 1e-4); the first divergence names `shared#1` at step 0,
  an op, not the heads.

Measured (build of 2026-11-27 ~20:15, pytest -s prints the alerts): the change is born at
`shared#1` (Sequential), its inputs agree, its output differs by 1.07e-4, 44.9x what
rounding explains (torch 1.13 and 2.11 alike; plain, reentrant and non-reentrant), a
warning. With the agent before this fix: twins under reentrant checkpointing got a
critical first divergence "born in the backward of <root>[hidden]" and 20+ critical
tensor_drift alerts; the change was born at `shared` (the first call's name).

Each asserts live == compare: the collector's alerts file and `lockstep compare --json`
of the same logs give the same multiset of (rule, step, rank, micro step, tensor, kind,
severity), and the same first divergence.
"""
import collections

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from scenario_lib import (AccumRun, Heads, collect_pair, compare_json, fmt_alerts, one_first_divergence,
                          seeded_state)

D_IN, D_H, CLASSES, BATCH, MICRO, STEPS = 12, 16, 4, 8, 2, 3
REL_CHANGE = 1e-4


class ReuseNet(nn.Module):
    """`ckpt`: None (no checkpointing), True / False (use_reentrant). The second call
    of `shared` goes through _second, which raises `shared.second` for a changing hook
    (run again by reentrant recomputation, so the hook sees the same call there)."""

    def __init__(self, ckpt=None):
        super().__init__()
        self.ckpt = ckpt
        self.inp = nn.Linear(D_IN, D_H)
        self.shared = nn.Sequential(nn.Linear(D_H, D_H), nn.Tanh())
        self.heads = Heads(D_H, CLASSES)

    def _second(self, h):
        self.shared.second = True
        return self.shared(h)

    def _call(self, fn, h):
        return fn(h) if self.ckpt is None else checkpoint(fn, h, use_reentrant=self.ckpt)

    def forward(self, x):
        h = self._call(self.shared, self.inp(x))
        h = self._call(self._second, h * 0.5)
        return {"hidden": h, "cls": self.heads.cls(h), "reg": self.heads.reg(h).squeeze(-1)}


def scale_second_call(module, _inputs, output):
    """The change: the output of `shared`'s second call x (1 + REL_CHANGE)."""
    if getattr(module, "second", False):
        module.second = False
        return output * (1 + REL_CHANGE)
    return None


def micro_batches(steps, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(BATCH, D_IN, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g),
              torch.randn(BATCH, generator=g)) for _ in range(MICRO)] for _ in range(steps)]


class ReuseRun(AccumRun):
    """Each micro batch: classification + regression loss over ReuseNet's heads."""

    def micro_loss(self, _m, x, label, target):  # pylint: disable=arguments-differ
        out = self.model(x)
        return nn.functional.cross_entropy(out["cls"], label) + nn.functional.mse_loss(out["reg"], target)


def reuse_run(state, ckpt, change=False):
    def make(endpoint, run, role, experiment):
        model = ReuseNet(ckpt)
        model.load_state_dict(state)
        if change:  # before watch(): lockstep records what the next op receives
            model.shared.register_forward_hook(scale_second_call)
        return ReuseRun(endpoint, run, role, experiment, model=model)
    return make


def same_alerts(alerts, rep):
    """Live and compare --json give the same multiset of alerts."""
    def key(a):
        return (a["rule"], a["step"], a.get("rank", 0), a.get("micro_step", 0), a["tensor"], a["kind"],
                a["severity"])
    assert collections.Counter(map(key, alerts)) == collections.Counter(map(key, rep["alerts"])), \
        (fmt_alerts(alerts), rep["alerts"])


MODES = [True, False]
MODE_IDS = ["reentrant", "non-reentrant"]


@pytest.mark.parametrize("ckpt", MODES, ids=MODE_IDS)
def test_checkpointing_changes_no_record(tmp_path, ckpt):
    state = seeded_state(ReuseNet)
    alerts, col, b, c = collect_pair(tmp_path, "reuse-twins", reuse_run(state, None),
                                     reuse_run(state, ckpt), [(mb,) for mb in micro_batches(STEPS)])
    assert alerts == [], fmt_alerts(alerts)
    code, rep = compare_json(col, "reuse-twins")
    assert code == 0, rep.get("first_divergence")
    assert rep.get("first_divergence") is None, rep["first_divergence"]
    same_alerts(alerts, rep)
    assert b.losses == pytest.approx(c.losses, rel=1e-6)


@pytest.mark.parametrize("ckpt", [None] + MODES, ids=["plain"] + MODE_IDS)
def test_change_in_the_second_call_is_named_there(tmp_path, ckpt):
    state = seeded_state(ReuseNet)
    alerts, col, _, _ = collect_pair(tmp_path, "reuse-second", reuse_run(state, ckpt),
                                     reuse_run(state, ckpt, change=True),
                                     [(mb,) for mb in micro_batches(STEPS)])
    text = fmt_alerts(alerts)
    print(text)
    fd = one_first_divergence(alerts)
    assert (fd["step"], fd.get("micro_step", 0), fd["tensor"], fd["kind"], fd["cause"]) == \
        (0, 0, "shared#1", "act", "op"), text
    assert "heads" not in fd["message"], text
    assert "shared#1 (Sequential)" in fd["message"], text
    # live == compare: the same first divergence from the same logs
    code, rep = compare_json(col, "reuse-second")
    assert code == 0, rep["critical"]  # a warning: 1e-4 is below the fp32 tolerance
    same_alerts(alerts, rep)
    cfd = rep["first_divergence"]
    keys = ("step", "micro_step", "tensor", "kind", "cause", "severity", "message")
    assert {k: fd.get(k) for k in keys} == {k: cfd.get(k) for k in keys}, (fd, cfd)
