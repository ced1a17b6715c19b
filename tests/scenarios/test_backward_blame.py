"""Issue 30, items 2 and 3: whom the first divergence blames, and what its cause says.

- A shared trunk feeding two heads (`heads.cls`, a classifier under cross-entropy, and
  `heads.reg`, a regressor under MSE), trained with gradient accumulation (2 micro
  batches a step). The candidate gets one changed label in one micro batch: the
  gradient arriving at `heads.cls` differs while every forward tensor agrees. That is
  the data (the loss's other input), not an op, and never the backward of the sibling
  head that happens to be recorded next to it.
- The same two heads, with a custom backward (an autograd Function that scales the
  gradient by 1.05) in heads.reg's own code: trunk's gradient is the sum of what both
  heads pass on, so the cause (op) names both heads and no birth point is claimed for
  one of them.
- A parent whose own forward code changes what it hands to a frozen child (`x * 1.01`
  before calling `frozen`): with the root as the parent, the first divergence is the
  child's input and its cause names the root's own code, not the child; with a module
  as the parent, that module is the birth point, "in its own code", naming the child it
  fed.

Each asserts the culprit, the cause word, and that the live alert equals
`lockstep compare --json`'s first divergence of the same logs (step, tensor, kind,
cause, micro step and message).

Seen before the fix (collector of 2026-11-27 ~19:40): the label changed at step 0,
micro step 0, read "the error is born in the backward of heads.reg ... cause: op"; at
step 1, micro step 1, "cause: op (... heads.cls (Linear) computes differently)"; the
root's x * 1.01 read "first divergent tensor frozen.0 (Linear) ... frozen.0 (Linear)
computes differently" (frozen's input was not compared: it repeats trunk's output in the
baseline only). Whole file: 2.5 s (torch 1.13) and 4.0 s (torch 2.x) on this 2-core
machine.
"""
import pytest
import torch
from torch import nn

from scenario_lib import (DRIFT_RULES, AccumRun, Heads, Run, collect_pair, compare_json, fmt_alerts,
                          one_first_divergence, seeded_state)

D_IN, D_H, CLASSES, BATCH, MICRO = 12, 16, 4, 8, 2
STEPS = 3


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(D_IN, D_H), nn.Tanh())
        self.heads = Heads(D_H, CLASSES)

    def forward(self, x):
        h = self.trunk(x)
        return self.heads.cls(h), self.heads.reg(h).squeeze(-1)


def micro_batches(steps, seed=5):
    """Per step MICRO micro batches of (x, label, target)."""
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(BATCH, D_IN, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g),
              torch.randn(BATCH, generator=g)) for _ in range(MICRO)] for _ in range(steps)]


class RelabelRun(AccumRun):
    """Gradient accumulation over a step's micro batches, one optimizer step each.
    `relabel` = (step, micro): the candidate's label of that micro batch's first sample
    is shifted by one class."""

    def __init__(self, *args, relabel=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.relabel = relabel

    def micro_loss(self, m, x, label, target):  # pylint: disable=arguments-differ
        if self.relabel == (self.step_no, m):
            label = label.clone()
            label[0] = (label[0] + 1) % CLASSES
        logits, reg = self.model(x)
        return nn.functional.cross_entropy(logits, label) + nn.functional.mse_loss(reg, target)


def heads_run(state, relabel=None):
    def make(endpoint, run, role, experiment):
        model = TwoHeads()
        model.load_state_dict(state)
        return RelabelRun(endpoint, run, role, experiment, model=model, relabel=relabel)
    return make


def same_as_compare(fd, col, exp):
    """The live alert is compare --json's first divergence of the same logs."""
    _, rep = compare_json(col, exp)
    cfd = rep["first_divergence"]
    assert cfd is not None, rep
    keys = ("step", "tensor", "kind", "cause", "micro_step", "message")
    assert {k: fd.get(k) for k in keys} == {k: cfd.get(k) for k in keys}
    return rep


@pytest.mark.parametrize("where", [(0, 0), (1, 1)], ids=["step0-micro0", "step1-micro1"])
def test_changed_label_is_data_not_a_sibling_head(tmp_path, where):
    state = seeded_state(TwoHeads)
    alerts, col, _, _ = collect_pair(tmp_path, "blame", heads_run(state), heads_run(state, relabel=where),
                                     [(mb,) for mb in micro_batches(STEPS)])
    text = fmt_alerts(alerts)
    print(text)
    fd = one_first_divergence(alerts, DRIFT_RULES | {"scalars"})  # the grad norm differs (torch 2.x)
    assert fd["step"] == where[0], text
    assert fd.get("micro_step", 0) == where[1], text
    assert "heads.reg" not in fd["tensor"], text
    assert "backward of heads.reg" not in fd["message"], text
    assert fd["cause"] == "data", text
    assert fd["kind"] == "act_grad" and fd["tensor"] == "heads.cls", text
    assert "label" in fd["message"], text
    same_as_compare(fd, col, exp="blame")


class ScaleGrad(torch.autograd.Function):
    """Identity forward; its backward scales the gradient (another backward kernel)."""

    @staticmethod
    def forward(ctx, x, scale):  # pylint: disable=arguments-differ
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # pylint: disable=arguments-differ
        return g * ctx.scale, None


class RegHead(nn.Module):
    """heads.reg with a custom backward in its own code (scale 1: the same math)."""

    def __init__(self, scale=1.0):
        super().__init__()
        self.lin = nn.Linear(D_H, 1)
        self.scale = scale

    def forward(self, h):
        return self.lin(ScaleGrad.apply(h, self.scale) if self.scale != 1.0 else h)


class TwoHeadsCustom(TwoHeads):
    def __init__(self, scale=1.0):
        super().__init__()
        self.heads.reg = RegHead(scale)


def test_a_backward_in_one_of_two_heads_blames_both_not_one(tmp_path):
    """heads.reg's backward hands trunk a different gradient; heads.cls received the same
    output. trunk's gradient is the sum of what both pass on: the cause names both (op),
    neither alone, and no birth point is claimed for a single head."""
    state = seeded_state(TwoHeadsCustom)

    def make(scale):
        def factory(endpoint, run, role, experiment):
            model = TwoHeadsCustom(scale)
            model.load_state_dict(state)
            return RelabelRun(endpoint, run, role, experiment, model=model)
        return factory

    alerts, col, _, _ = collect_pair(tmp_path, "shared", make(1.0), make(1.05),
                                     [(mb,) for mb in micro_batches(STEPS)])
    text = fmt_alerts(alerts)
    print(text)
    fd = one_first_divergence(alerts, DRIFT_RULES | {"scalars"})
    assert fd["step"] == 0, text
    assert fd["kind"] == "act_grad" and fd["tensor"].startswith("trunk"), text
    assert fd["cause"] == "op", text
    assert "the sum of what heads.cls (Linear) and heads.reg (RegHead) pass on" in fd["message"], text
    assert "born in" not in fd["message"], text
    same_as_compare(fd, col, exp="shared")


class Parent(nn.Module):
    """trunk -> (its own code: x * scale) -> frozen: the scale is the parent's."""

    def __init__(self, scale=1.0):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(D_IN, D_H), nn.Tanh())
        self.frozen = nn.Sequential(nn.Linear(D_H, D_H), nn.Tanh())
        self.scale = scale
        for p in self.frozen.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        h = self.trunk(x)
        if self.scale != 1.0:
            h = h * self.scale
        return self.frozen(h)


class Wrapped(nn.Module):
    """The same parent below the root, then a head (the parent is judged as an op)."""

    def __init__(self, scale=1.0):
        super().__init__()
        self.body = Parent(scale)
        self.head = nn.Linear(D_H, 1)

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


class RootParent(Parent):
    """The parent is the root: its output reduced to one value per sample."""

    def forward(self, x):
        return super().forward(x).sum(-1)


def plain_batches(steps, seed=9):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, D_IN, generator=g), torch.randn(BATCH, generator=g)) for _ in range(steps)]


# What the first divergence says: the root is no op (its inputs are the data), so the
# child's input is the first divergent tensor; a module parent is the op born in its own
# code, and the sentence names the child its code fed.
SAYS = {"root": "frozen (Sequential) receives a different input from its parent's own code: "
                "the computation of <root> (RootParent) between its children differs",
        "module": "the error is born in body (Parent)",
        }
FED = "body.frozen (Sequential) is the first to receive a different input from it"


@pytest.mark.parametrize("cls,parent", [(RootParent, "root"), (Wrapped, "module")], ids=["root", "module"])
def test_parent_code_before_frozen_child(tmp_path, cls, parent):
    state = seeded_state(cls)

    def make(scale):
        def factory(endpoint, run, role, experiment):
            model = cls(scale)
            model.load_state_dict(state)
            return Run(endpoint, run, role, experiment, model=model)
        return factory

    alerts, col, _, _ = collect_pair(tmp_path, "parent", make(1.0), make(1.01), plain_batches(STEPS))
    text = fmt_alerts(alerts)
    print(text)
    fd = one_first_divergence(alerts, DRIFT_RULES | {"scalars"})  # the grad norm differs too
    assert fd["step"] == 0, text
    assert fd["cause"] == "op", text
    assert "frozen (Sequential) computes differently" not in fd["message"], text
    assert "own code" in fd["message"], text
    assert SAYS[parent] in fd["message"], text
    if parent == "root":
        assert (fd["tensor"], fd["kind"]) == ("frozen", "act_in"), text
    else:
        assert (fd["tensor"], fd["kind"]) == ("body", "act"), text
        assert FED in fd["message"], text
    same_as_compare(fd, col, exp="parent")
