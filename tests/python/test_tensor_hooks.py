"""The gradient hooks lockstep puts on module outputs (_watch._add_hook): on a plain
tensor they go straight into its hook dict, as Tensor.register_hook would put them
(without the handle we never use); a tensor subclass or an active TorchFunctionMode
still gets Tensor.register_hook. Either way the user's hooks and ours run in the order
they were registered, and the records are the same."""
import pytest
import torch
from torch import nn

from conftest import TENSOR_KINDS, fake_monitor, plain_stats
from lockstep import _watch


def test_the_shortcut_is_taken_on_this_torch():
    # Both stacks the package supports pass the import-time check; were it to fail on
    # a future torch, every hook would go through Tensor.register_hook (slower, right).
    assert _watch._ADD_TENSOR_HOOK is not None


def test_hooks_run_in_registration_order_with_the_users():
    leaf = torch.ones(3, requires_grad=True)
    y = leaf * 2
    seen = []
    first = y.register_hook(lambda g: seen.append("user-before"))
    _watch._add_hook(y, lambda g: seen.append(("ours", g.tolist())))
    last = y.register_hook(lambda g: seen.append("user-after"))
    removed = y.register_hook(lambda g: seen.append("removed"))
    removed.remove()
    y.sum().backward()
    assert seen == ["user-before", ("ours", [1.0, 1.0, 1.0]), "user-after"]
    first.remove()
    last.remove()
    assert len(y._backward_hooks) == 1  # ours stays: it goes with the tensor


def test_a_hook_on_a_fresh_output_sees_its_gradient():
    leaf = torch.arange(4.0, requires_grad=True)
    y = leaf.exp()
    got = []
    _watch._add_hook(y, got.append)  # first hook: makes the dict, ties it to the node
    (y * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    assert got[0].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert torch.allclose(leaf.grad, torch.tensor([1.0, 2.0, 3.0, 4.0]) * y.detach())


class Tagged(torch.Tensor):
    """A tensor subclass that notes register_hook calls."""
    calls = 0

    def register_hook(self, hook):
        Tagged.calls += 1
        return super().register_hook(hook)


def test_a_subclass_gets_tensor_register_hook():
    leaf = torch.ones(2, requires_grad=True)
    y = (leaf * 3).as_subclass(Tagged)
    got = []
    Tagged.calls = 0
    _watch._add_hook(y, got.append)
    y.sum().backward()
    assert Tagged.calls == 1 and len(got) == 1


def test_an_active_torch_function_mode_sees_register_hook():
    mode_cls = getattr(torch.overrides, "TorchFunctionMode", None)
    if mode_cls is None:
        pytest.skip("this torch has no TorchFunctionMode")
    names = []

    class Watching(mode_cls):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            names.append(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))

    leaf = torch.ones(2, requires_grad=True)
    y = leaf * 2
    got = []
    with Watching():
        _watch._add_hook(y, got.append)
    y.sum().backward()
    assert "register_hook" in names and len(got) == 1


def records_of_a_step(monkeypatch, shortcut):
    if not shortcut:
        monkeypatch.setattr(_watch, "_ADD_TENSOR_HOOK", None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(),
                          nn.Linear(8, 2))
    mon, fake = fake_monitor()
    mon.watch(model, kinds=TENSOR_KINDS)
    x = torch.randn(3, 4)
    seen = []

    def user_hook(_m, _i, o):  # a user's gradient hook, registered after lockstep's
        o.register_hook(lambda g: seen.append("user"))

    model[2].register_forward_hook(user_hook)
    for _ in range(2):
        loss = model(x).pow(2).mean()
        loss.backward()
        mon.step(loss=loss)
    mon.close()
    return [(r["step"], r["name"], r["kind"], r["order"], plain_stats(r["stats"]))
            for r in fake.records], seen


def test_records_are_the_same_with_and_without_the_shortcut(monkeypatch):
    fast, seen_fast = records_of_a_step(monkeypatch, True)
    slow, seen_slow = records_of_a_step(monkeypatch, False)
    assert [r[2] for r in fast].count("act_grad") == 2 * 6  # 5 modules and the root
    assert fast == slow
    assert seen_fast == seen_slow == ["user", "user"]
