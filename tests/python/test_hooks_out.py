"""The hooks are out of torch's tables on the steps lockstep does not record
(watch(every=N), the collector's sampling) and back, in their places, on those it does
(_watch.HookSwitch, Watch.set_in); not under torch.compile."""
import sys
import warnings

import pytest
import torch
from torch import nn

from conftest import fake_monitor


@pytest.fixture(autouse=True)
def nothing_compiled():
    """Each test starts as in a fresh process, with nothing compiled: once Dynamo has
    compiled anything, HookSwitch keeps the hooks in, so a torch.compile test run
    earlier in the same pytest process (test_watch's) would keep them in here."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
        dynamo.utils.counters.clear()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def step(model, mon, opt=None):
    loss = model(torch.randn(3, 4)).pow(2).mean()
    loss.backward()
    if opt is not None:
        opt.step()
        opt.zero_grad()
    mon.step(loss=loss)


def hook_counts(model):
    """Hooks of every module and parameter, in torch's own tables."""
    mods = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    params = sum(len(p._backward_hooks or {}) for p in model.parameters())
    return mods, params


def test_hooks_are_out_on_unrecorded_steps_and_records_are_unchanged():
    model = mlp()
    mon, fake = fake_monitor()
    mon.watch(model, every=3)
    assert hook_counts(model)[0] > 0
    counts = []
    for _ in range(7):
        step(model, mon)
        counts.append(hook_counts(model))  # for the step about to run
    # steps 1, 2, 4, 5 are not recorded: nothing of lockstep's is left for them
    assert [c == (0, 0) for c in counts] == [True, True, False, True, True, False, True]
    assert counts[2][0] > 0 and counts[2][1] == 4
    steps = sorted({r["step"] for r in fake.records if r["kind"] == "act"})
    assert steps == [0, 3, 6]
    per_step = {s: sorted((r["name"], r["kind"]) for r in fake.records if r["step"] == s)
                for s in steps}
    # nothing lost by taking them out (step 0 also has the initial weights)
    assert [k for k in per_step[0] if k[1] != "param"] == per_step[3] == per_step[6]
    assert fake.ended == list(range(7))  # scalars every step
    mon.close()
    assert hook_counts(model) == (0, 0)


def test_hooks_go_back_in_their_places_among_the_users():
    model = mlp()
    order = []
    first = model[0].register_forward_hook(lambda *_: order.append("before"))
    mon, fake = fake_monitor()
    mon.watch(model, every=2)
    model[0].register_forward_hook(lambda *_: order.append("after"))
    ours = [k for k in model[0]._forward_hooks if k not in (first.id,)][0]
    step(model, mon)  # step 1 is not recorded: ours go out
    assert list(model[0]._forward_hooks)[0] == first.id and ours not in model[0]._forward_hooks
    late = model[0].register_forward_hook(lambda *_: order.append("late"))
    step(model, mon)  # step 2 is: back between the user's two, the late one last
    keys = list(model[0]._forward_hooks)
    assert keys[0] == first.id and keys[1] == ours and keys[-1] == late.id
    assert len(keys) == 4
    order.clear()
    model(torch.randn(3, 4))
    assert order == ["before", "after", "late"]
    mon.close()
    assert list(model[0]._forward_hooks) == [first.id, keys[2], late.id]


def test_the_optimizer_hook_stays_in():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if not hasattr(opt, "register_step_pre_hook"):
        pytest.skip("torch < 2.0: no optimizer hooks")
    mon, _ = fake_monitor()
    mon.watch(model, opt, every=2)
    step(model, mon, opt)
    assert hook_counts(model) == (0, 0)
    assert len(opt._optimizer_step_pre_hooks) == 1
    mon.close()
    assert len(opt._optimizer_step_pre_hooks) == 0


def _compile(model):
    return torch.compile(model, backend="eager")


def _fresh_dynamo():
    if getattr(torch, "compile", None) is None:
        pytest.skip("torch < 2.0: no torch.compile")
    # as in a fresh process: nothing compiled yet (HookSwitch reads Dynamo's counters)
    torch._dynamo.reset()  # pylint: disable=protected-access
    torch._dynamo.utils.counters.clear()  # pylint: disable=protected-access


def test_a_model_compiled_at_its_first_call_keeps_the_hooks_in():
    _fresh_dynamo()
    model = mlp()
    compiled = _compile(model)
    mon, fake = fake_monitor()
    mon.watch(model, every=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            step(compiled, mon)
    # nothing was compiled without the hooks: no reset
    assert not [w for w in caught if "lockstep" in str(w.message)]
    assert hook_counts(model)[0] > 0  # step 4 is not recorded, and they are in
    steps = sorted({r["step"] for r in fake.records if r["kind"] == "act"})
    assert steps == [0, 3]
    mon.close()


def test_a_model_compiled_while_the_hooks_are_out_is_compiled_again_with_them():
    _fresh_dynamo()
    model = mlp()
    mon, fake = fake_monitor()
    mon.watch(model, every=3)
    step(model, mon)  # step 0, eager
    assert hook_counts(model) == (0, 0)
    compiled = _compile(model)
    with pytest.warns(RuntimeWarning, match="reset torch.compile's cache"):
        step(compiled, mon)  # step 1: compiled without lockstep's hooks
    for _ in range(2):
        step(compiled, mon)  # steps 2 and 3: compiled again, with them
    assert hook_counts(model)[0] > 0
    acts = sorted({r["name"] for r in fake.records if r["step"] == 3 and r["kind"] == "act"})
    assert acts == sorted({r["name"] for r in fake.records
                           if r["step"] == 0 and r["kind"] == "act"})
    mon.close()
