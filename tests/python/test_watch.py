"""Unit tests of Monitor.watch()/step(): which tensors are recorded, under which
names, kinds, steps, micro steps and execution order (with a recording fake agent
and the real C++ statistics kernel)."""
import math
import warnings

import pytest
import torch
from torch import nn

from conftest import TENSOR_KINDS, fake_monitor, plain_stats


def train_step(model, x, mon=None, opt=None, **step_kwargs):
    loss = model(x).pow(2).mean()
    loss.backward()
    if opt is not None:
        opt.step()
        opt.zero_grad()
    if mon is not None:
        mon.step(loss=loss, **step_kwargs)
    return loss


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_module_outputs_grads_and_param_grads_in_execution_order():
    mon, fake = fake_monitor()
    model = mlp()
    mon.watch(model, kinds=TENSOR_KINDS)
    x = torch.randn(3, 4)
    out = {}

    def keep(_m, _i, o):
        out["y"] = o.detach().clone()

    model[2].register_forward_hook(keep)
    train_step(model, x, mon)
    recs = [r for r in fake.records if r["step"] == 0]
    acts = [(r["name"], r["order"]) for r in recs if r["kind"] == "act"]
    assert acts == [("0", 0), ("1", 1), ("2", 2), ("<root>", 3)]
    grads = [r["name"] for r in recs if r["kind"] == "act_grad"]
    # backward runs in reverse; "2" and "<root>" are the same tensor, whose hooks run in
    # the order they were registered (the child's forward hook fires first)
    assert grads == ["2", "<root>", "1", "0"]
    assert sorted(r["name"] for r in recs if r["kind"] == "param_grad") == [
        "0.bias", "0.weight", "2.bias", "2.weight"]
    orders = [r["order"] for r in recs]
    assert orders == list(range(len(recs)))  # one index per tensor per step
    y = [r for r in recs if r["name"] == "2" and r["kind"] == "act"][0]["stats"]
    ref = out["y"].double()
    assert y["numel"] == 6
    assert y["l2"] == pytest.approx(ref.norm().item(), rel=1e-5)
    assert y["max"] == pytest.approx(ref.max().item(), rel=1e-6)
    assert [r["name"] for r in recs if r["kind"] == "loss"] == ["loss"]
    assert fake.ended == [0]


def test_param_grad_stats_and_global_grad_norm():
    mon, fake = fake_monitor()
    model = mlp()
    mon.watch(model)
    train_step(model, torch.randn(5, 4), mon)
    g = {n: p.grad.double() for n, p in model.named_parameters()}
    recs = {r["name"]: r["stats"] for r in fake.records if r["kind"] == "param_grad"}
    for name, grad in g.items():
        assert recs[name]["l2"] == pytest.approx(grad.norm().item(), rel=1e-5)
        assert recs[name]["mean"] == pytest.approx(grad.mean().item(), rel=1e-4, abs=1e-7)
    total = math.sqrt(sum(t.norm().item() ** 2 for t in g.values()))
    assert fake.scalars[0]["grad_norm"] == pytest.approx(total, rel=1e-5)
    assert fake.scalars[0]["step_time_s"] > 0


class Multi(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return y, None, [y * 2, 3, "text"], {"a": y + 1, "b": torch.ones(2, dtype=torch.long)}


class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.multi = Multi()

    def forward(self, x):
        y, _, lst, d = self.multi(x)
        return y + lst[0] + d["a"]


def test_tuple_list_dict_outputs_get_index_suffixes_and_non_tensors_are_ignored():
    mon, fake = fake_monitor()
    model = Wrapper()
    mon.watch(model)
    train_step(model, torch.randn(2, 4), mon)
    acts = fake.names("act")
    assert acts == ["multi.lin", "multi[0]", "multi[2][0]", "multi[3][a]", "<root>"]
    # the long tensor multi[3][b] is not floating point: not recorded
    assert set(fake.names("act_grad")) == {"multi.lin", "multi[0]", "multi[2][0]", "multi[3][a]",
                                           "<root>"}


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(torch.tanh(self.lin(x)))


def test_module_called_twice_gets_call_suffix():
    mon, fake = fake_monitor()
    model = Twice()
    mon.watch(model)
    for _ in range(2):
        train_step(model, torch.randn(2, 4), mon)
    for step in (0, 1):
        assert fake.names("act", step) == ["lin", "lin#1", "<root>"]
        assert fake.names("act_grad", step) == ["lin#1", "<root>", "lin"]
    # a shared parameter's gradient arrives once per backward, summed over the calls
    assert fake.names("param_grad", 0).count("lin.weight") == 1


def test_gradient_accumulation_records_micro_steps():
    mon, fake = fake_monitor()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon.watch(model, optimizer=opt)
    for _step in range(2):
        for _micro in range(3):
            model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        mon.step(loss=1.0)
    for step in (0, 1):
        recs = [r for r in fake.records if r["step"] == step]
        assert sorted({r["micro"] for r in recs}) == [0, 1, 2]
        for micro in range(3):
            m = [r for r in recs if r["micro"] == micro]
            assert [r["name"] for r in m if r["kind"] == "act"] == ["0", "1", "2", "<root>"]
            # order counts on across micro steps: this micro's records follow the last's
            first = sum(1 for r in recs if r["micro"] < micro)
            assert [r["order"] for r in m] == list(range(first, first + len(m)))
    assert [s["micro_steps"] for s in fake.scalars] == [3, 3]
    if hasattr(opt, "register_step_pre_hook"):  # torch >= 2.0: taken before the update
        assert all(s["grad_norm"] > 0 for s in fake.scalars)
    else:  # torch 1.13: the per-micro norms do not give it, so it is not guessed
        assert all(math.isnan(s["grad_norm"]) for s in fake.scalars)


def test_no_grad_and_eval_passes_are_not_training_steps():
    mon, fake = fake_monitor()
    model = mlp()
    mon.watch(model)
    train_step(model, torch.randn(2, 4), mon)
    n = len(fake.records)
    with torch.no_grad():
        model(torch.randn(2, 4))
    model.eval()
    model(torch.randn(2, 4))
    model.train()
    assert len(fake.records) == n
    train_step(model, torch.randn(2, 4), mon)
    assert {r["step"] for r in fake.records} == {0, 1}
    assert all(r["micro"] == 0 for r in fake.records)
    assert fake.names("act", 1) == ["0", "1", "2", "<root>"]


def test_every_n_steps_records_tensors_but_scalars_every_step():
    mon, fake = fake_monitor(start_step=10)
    model = mlp()
    mon.watch(model, every=3)
    for _ in range(7):
        train_step(model, torch.randn(2, 4), mon)
    assert sorted({r["step"] for r in fake.records}) == [12, 15]
    assert [s["step"] for s in fake.scalars] == list(range(10, 17))
    assert fake.ended == list(range(10, 17))


def test_include_exclude_and_kinds():
    mon, fake = fake_monitor()
    model = mlp()
    mon.watch(model, include=r"^[02]", exclude=r"bias", kinds=("act", "param_grad"))
    train_step(model, torch.randn(2, 4), mon)
    assert fake.names("act") == ["0", "2"]
    assert fake.names("act_grad") == []
    assert sorted(fake.names("param_grad")) == ["0.weight", "2.weight"]
    assert fake.names("loss") == []


def test_params_and_optimizer_state_after_the_update():
    mon, fake = fake_monitor()
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    mon.watch(model, optimizer=opt, params=True, optim_state=True, kinds=())
    train_step(model, torch.randn(2, 4), mon, opt)
    params = {r["name"]: r["stats"] for r in fake.records if r["kind"] == "param"}
    assert sorted(params) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert params["0.weight"]["l2"] == pytest.approx(model[0].weight.double().norm().item(),
                                                     rel=1e-5)
    optim = sorted(fake.names("optim"))
    assert "0.weight.exp_avg" in optim and "0.weight.exp_avg_sq" in optim
    assert not any(n.endswith(".step") for n in optim)  # scalar state is skipped


def test_scalars_lr_loss_scale_and_explicit_grad_norm():
    mon, fake = fake_monitor()
    model = mlp()
    mon.watch(model)
    loss = train_step(model, torch.randn(2, 4))
    mon.step(loss=loss, lr=torch.tensor(0.5), loss_scale=1024.0, grad_norm=3.0, samples=2)
    s = fake.scalars[0]
    assert s["loss"] == pytest.approx(loss.item())
    assert (s["lr"], s["loss_scale"], s["grad_norm"], s["samples"]) == (0.5, 1024.0, 3.0, 2)


HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")


def grad_scaler(**kwargs):
    """torch.amp.GradScaler("cuda") where it exists (torch.cuda.amp.GradScaler warns
    that it is deprecated there), else torch.cuda.amp.GradScaler (torch 1.13)."""
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        return amp.GradScaler("cuda", **kwargs)
    return torch.cuda.amp.GradScaler(**kwargs)


def test_loss_scale_from_a_grad_scaler():
    mon, fake = fake_monitor()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available": the scaler is disabled
        scaler = grad_scaler(init_scale=256.0, enabled=HAS_CUDA)
    mon.step(loss=1.0, loss_scale=scaler)
    expected = 256.0 if HAS_CUDA else 1.0  # a disabled scaler scales by 1
    assert fake.scalars[0]["loss_scale"] == expected
    if HAS_CUDA:  # once scale() has run, the scale is a CUDA tensor, read with the step's copy
        scaler.scale(torch.ones((), device="cuda"))
        scaler._scale.fill_(512.0)
        mon.step(loss=1.0, loss_scale=scaler)
        mon.flush(timeout=5.0)
        assert fake.scalars[1]["loss_scale"] == 512.0


def test_step_numbers_start_at_zero_or_start_step():
    mon, fake = fake_monitor()
    model = mlp()
    mon.watch(model)
    train_step(model, torch.randn(2, 4), mon)
    train_step(model, torch.randn(2, 4), mon)
    assert sorted({r["step"] for r in fake.records}) == [0, 1]
    mon2, fake2 = fake_monitor(start_step=500)
    mon2.watch(mlp())
    mon2.step(loss=0.0)
    assert fake2.ended == [500]


def test_close_ships_a_step_left_open_and_removes_hooks():
    mon, fake = fake_monitor()
    model = mlp()
    mon.watch(model)
    train_step(model, torch.randn(2, 4), mon)
    model(torch.randn(2, 4)).sum().backward()  # recorded, but no step() follows
    assert mon.close(timeout=1.0)
    assert fake.ended == [0, 1]
    n = len(fake.records)
    train_step(model, torch.randn(2, 4))
    assert len(fake.records) == n


def test_non_contiguous_and_half_precision_outputs():
    class T(nn.Module):
        def forward(self, x):
            return x.t(), x.half(), x.to(torch.bfloat16)

    mon, fake = fake_monitor()
    model = nn.Sequential(nn.Linear(3, 5), T())
    mon.watch(model, kinds=("act",))
    x = torch.randn(4, 3)
    with torch.enable_grad():
        out = model(x)
    recs = {r["name"]: r["stats"] for r in fake.records}
    ref = out[0].detach().double()
    assert recs["1[0]"]["l2"] == pytest.approx(ref.norm().item(), rel=1e-5)
    assert recs["1[1]"]["numel"] == 20 and recs["1[2]"]["numel"] == 20
    assert recs["1[1]"]["l2"] == pytest.approx(out[1].double().norm().item(), rel=1e-3)


def test_device_path_matches_host_path():
    """The batched device path (device_stats + one copy per step + record_packed),
    forced on CPU tensors, records what the C++ kernel records — with an optimizer,
    in-place zero_grad and gradient accumulation acting on the gradients after the
    hooks saw them."""
    pytest.importorskip("lockstep._torch_stats")
    torch.manual_seed(1)
    model = mlp()
    x = torch.randn(6, 4)
    results = []
    for force in (False, True):
        mon, fake = fake_monitor(_force_device_path=force)
        m = mlp()
        m.load_state_dict(model.state_dict())
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        mon.watch(m)
        for _ in range(2):
            for _micro in range(2):
                m(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=False)  # in place, after the hooks
            mon.step(loss=1.0)
        train_step(m, x, mon)
        mon.close(timeout=2.0)
        results.append(fake)
    host, dev = results
    key = lambda r: (r["step"], r["micro"], r["order"])  # noqa: E731
    host.records.sort(key=key)
    dev.records.sort(key=key)
    assert [(r["step"], r["micro"], r["name"], r["kind"], r["order"]) for r in host.records] \
        == [(r["step"], r["micro"], r["name"], r["kind"], r["order"]) for r in dev.records]
    for a, b in zip(host.records, dev.records):
        for k in ("numel", "nan_count", "inf_count", "zero_count"):
            assert a["stats"][k] == b["stats"][k], (a["name"], k)
        for k in ("min", "max", "mean", "std", "l2", "absmax"):
            assert b["stats"][k] == pytest.approx(a["stats"][k], rel=1e-5, abs=1e-7)
        assert b["stats"]["sketch"] == pytest.approx(a["stats"]["sketch"], rel=1e-4, abs=1e-6)
    assert all(r["stats"]["l2"] > 0 for r in dev.records if r["kind"] == "param_grad")
    assert [s["grad_norm"] for s in dev.scalars][2] == pytest.approx(
        host.scalars[2]["grad_norm"], rel=1e-5)
    assert dev.ended == [0, 1, 2]


def test_device_path_batches_gradients_at_the_end_of_backward(monkeypatch):
    ts = pytest.importorskip("lockstep._torch_stats")
    calls = []
    real = ts.device_stats

    def counting(tensors, k, bins):
        calls.append(len(tensors))
        return real(tensors, k, bins)

    monkeypatch.setattr(ts, "device_stats", counting)
    mon, fake = fake_monitor(_force_device_path=True)
    model = mlp()
    mon.watch(model, kinds=TENSOR_KINDS)
    model(torch.randn(2, 4)).sum().backward()
    # 4 outputs (copied in forward), 4 parameter gradients and 4 output gradients, less
    # the root's output and output gradient (those of "2", recorded again): one batch
    # when backward ended (before step(): none waits)
    assert calls == [10]
    assert mon._pipeline._deferred == []
    mon.step(loss=1.0)
    assert len(fake.records) == 4 + 8 and fake.ended == [0]  # a float loss: no loss record
    # the size bound launches a batch early
    from lockstep import _device
    monkeypatch.setattr(_device, "_DEFER_MAX_TENSORS", 5)
    calls.clear()
    model(torch.randn(2, 4)).sum().backward()
    mon.step(loss=torch.tensor(2.0))
    assert calls == [5, 5, 1] and sum(calls) == 11  # the last batch holds the loss, at step()


def test_device_path_records_an_output_before_an_inplace_op_changes_it():
    """An inplace activation after a watched module changes its output tensor after the
    hook: the device path records the values the module returned (it copies them)."""
    pytest.importorskip("lockstep._torch_stats")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(inplace=True), nn.Linear(16, 2))
    x = torch.randn(8, 4)
    with torch.no_grad():
        want = model[0](x).double()
    assert (want < 0).any()
    for force in (False, True):
        mon, fake = fake_monitor(_force_device_path=force)
        mon.watch(model, kinds=("act",))
        model(x).sum().backward()
        mon.step(loss=1.0)
        assert mon.close(timeout=2.0)
        rec = [r for r in fake.records if r["name"] == "0"][0]["stats"]
        assert rec["min"] == pytest.approx(want.min().item(), rel=1e-6), force
        assert rec["l2"] == pytest.approx(want.norm().item(), rel=1e-6), force


def test_micro_steps_are_found_when_only_parameter_gradients_are_watched():
    mon, fake = fake_monitor()
    model = mlp()
    mon.watch(model, kinds=("param_grad",))
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
    mon.step()
    assert sorted((r["micro"], r["name"]) for r in fake.records) == [
        (m, n) for m in (0, 1) for n in ("0.bias", "0.weight", "2.bias", "2.weight")]


class SGDWithPreHooks(torch.optim.SGD):
    """torch 2.x's Optimizer.register_step_pre_hook, for torch 1.13 (which lacks it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pre = []

    def register_step_pre_hook(self, hook):
        self._pre.append(hook)

        class Handle:
            def remove(_self):
                self._pre.remove(hook)
        return Handle()

    def step(self, closure=None):
        for hook in list(self._pre):
            hook(self, (), {})
        return super().step(closure)


def test_grad_norm_of_accumulated_gradients_from_the_optimizer_pre_step_hook():
    mon, fake = fake_monitor()
    model = mlp()
    opt = SGDWithPreHooks(model.parameters(), lr=0.1)
    mon.watch(model, optimizer=opt)
    for _micro in range(3):
        model(torch.randn(2, 4)).sum().backward()
    expected = math.sqrt(sum(p.grad.double().norm().item() ** 2 for p in model.parameters()))
    opt.step()
    opt.zero_grad()
    mon.step(loss=1.0)
    assert fake.scalars[0]["micro_steps"] == 3
    assert fake.scalars[0]["grad_norm"] == pytest.approx(expected, rel=1e-6)
    train_step(model, torch.randn(2, 4), mon, opt)  # no accumulation: per-tensor norms
    assert fake.scalars[1]["micro_steps"] == 1 and fake.scalars[1]["grad_norm"] > 0


class AddsInPlace(nn.Module):
    """Returns its child's output after changing it in place."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)

    def forward(self, x):
        y = self.lin(x)
        y.add_(1.0)
        return y


class Transposes(nn.Module):
    """Returns a view of its child's output: same memory, another element order."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)

    def forward(self, x):
        return self.lin(x).t()


def test_same_tensor_under_two_names_is_computed_once_and_recorded_twice():
    mon, fake = fake_monitor()
    model = mlp()
    mon.watch(model, kinds=TENSOR_KINDS)  # outputs' repeats only (act_in: below)
    for _ in range(2):
        train_step(model, torch.randn(3, 4), mon)
    recs = {(r["step"], r["name"], r["kind"]): r["stats"] for r in fake.records}
    for step in (0, 1):
        # "<root>"'s output is "2"'s output, and one gradient reaches both hooks
        for kind in ("act", "act_grad"):
            a, b = recs[(step, "<root>", kind)], recs[(step, "2", kind)]
            assert plain_stats(a) == plain_stats(b)
            assert a.get("repeat", False) != b.get("repeat", False)  # one of them is the repeat
    assert fake.repeats == 4
    assert mon.counters()["tensors_repeated"] == 4


def test_a_tensor_changed_in_place_between_two_hooks_is_computed_again():
    mon, fake = fake_monitor()
    model = AddsInPlace()
    mon.watch(model, kinds=("act",))
    seen = {}

    def keep(_m, _i, o):
        seen["lin"] = o.detach().clone()

    model.lin.register_forward_hook(keep)
    train_step(model, torch.randn(3, 4), mon)
    recs = {r["name"]: r["stats"] for r in fake.records if r["kind"] == "act"}
    assert fake.repeats == 0
    assert recs["lin"]["mean"] == pytest.approx(seen["lin"].double().mean().item(), rel=1e-5)
    assert recs["<root>"]["mean"] == pytest.approx(recs["lin"]["mean"] + 1.0, rel=1e-5)


def test_a_view_in_another_element_order_is_computed_again():
    mon, fake = fake_monitor()
    model = Transposes()
    mon.watch(model, kinds=("act",))
    train_step(model, torch.randn(3, 4), mon)
    recs = {r["name"]: r["stats"] for r in fake.records if r["kind"] == "act"}
    assert fake.repeats == 0
    assert recs["<root>"]["l2"] == pytest.approx(recs["lin"]["l2"], rel=1e-6)
    assert recs["<root>"]["sketch"] != recs["lin"]["sketch"]  # indexed in the view's order


def _records_key(fake):
    return [(r["step"], r["micro"], r["name"], r["kind"], r["order"])
            for r in sorted(fake.records, key=lambda r: (r["step"], r["micro"], r["order"]))]


@needs_cuda
def test_cuda_device_path_matches_the_host_kernel_on_cpu():
    """The same training on CUDA (the device pipeline: device_stats, one copy per step,
    one step late) and on CPU (the C++ kernel) records the same tensors under the same
    names, kinds, steps, micro steps and order, with the same statistics (up to the
    CPU/GPU difference of the model's own arithmetic), and the same grad norm."""
    pytest.importorskip("lockstep._torch_stats")
    torch.manual_seed(1)
    model = mlp()
    x = torch.randn(6, 4)
    results = []
    for device in ("cpu", "cuda"):
        mon, fake = fake_monitor()
        m = mlp().to(device)
        m.load_state_dict(model.state_dict())
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        mon.watch(m, optimizer=opt, params=True)
        xd = x.to(device)
        for _ in range(3):
            for _micro in range(2):
                m(xd).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                loss = m(xd).pow(2).mean()
            mon.step(loss=loss)
        train_step(m, xd, mon, opt)
        assert mon.close(timeout=5.0)
        c = mon.counters()
        assert c["python_errors"] == 0, c["last_python_error"]
        results.append(fake)
    host, dev = results
    assert _records_key(host) == _records_key(dev)
    key = lambda r: (r["step"], r["micro"], r["order"])  # noqa: E731
    for a, b in zip(sorted(host.records, key=key), sorted(dev.records, key=key)):
        for k in ("numel", "nan_count", "inf_count", "zero_count"):
            assert a["stats"][k] == b["stats"][k], (a["name"], k)
        for k in ("min", "max", "mean", "std", "l2", "absmax"):
            assert b["stats"][k] == pytest.approx(a["stats"][k], rel=1e-4, abs=1e-6), \
                (a["name"], a["kind"], k)
        assert b["stats"]["sketch"] == pytest.approx(a["stats"]["sketch"], rel=1e-3, abs=1e-5)
        assert sum(b["stats"]["hist"]) == sum(a["stats"]["hist"])
    for a, b in zip(host.scalars, dev.scalars):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        assert b["micro_steps"] == a["micro_steps"]
    assert dev.ended == host.ended == [0, 1, 2, 3]


@needs_cuda
@pytest.mark.skipif(not hasattr(torch.cuda, "set_sync_debug_mode"), reason="torch too old")
def test_cuda_watch_never_synchronizes_the_host():
    """Hooks, step(), the device pipeline and a GradScaler loss scale on CUDA with
    torch.cuda's sync debug mode set to "error": any host sync inside lockstep would
    raise there (and be counted as a python error)."""
    pytest.importorskip("lockstep._torch_stats")
    mon, fake = fake_monitor()
    m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.GELU(),
                      nn.Linear(256, 8)).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    mon.watch(m, optimizer=opt, params=True)
    x = torch.randn(32, 64, device="cuda")
    scale = torch.full((), 1024.0, device="cuda")
    torch.cuda.synchronize()
    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(8):
            for _micro in range(2):  # accumulation: the optimizer pre-step hook's norm too
                m(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                loss = m(x).pow(2).mean()
            mon.step(loss=loss, lr=torch.full((), 0.5, device="cuda"), loss_scale=scale)
    finally:
        torch.cuda.set_sync_debug_mode(old)
    assert mon.close(timeout=5.0)
    c = mon.counters()
    assert c["python_errors"] == 0, c["last_python_error"]
    assert c["device_steps_dropped"] == 0
    assert fake.ended == list(range(8))
    assert all(s["loss_scale"] == 1024.0 and s["lr"] == 0.5 for s in fake.scalars)
    assert all(s["grad_norm"] > 0 for s in fake.scalars)
    assert len(fake.records) == 8 * (2 * (6 + 6 + 6) + 6 + 1)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch < 2.0 has no torch.compile")
def test_a_compiled_model_is_watched_through_graph_breaks():
    """torch.compile'd model (Dynamo; the eager backend needs no compiler): lockstep's
    forward hooks run eagerly (a graph break each) instead of failing inside Dynamo, and
    record under the wrapper's `_orig_mod.` names (which the collector strips)."""
    mon, fake = fake_monitor()
    model = torch.compile(mlp(), backend="eager")
    mon.watch(model)
    for _ in range(2):
        train_step(model, torch.randn(2, 4), mon)
    c = mon.counters()
    assert c["python_errors"] == 0, c["last_python_error"]
    for step in (0, 1):
        acts = fake.names("act", step)
        assert acts[:3] == ["_orig_mod.0", "_orig_mod.1", "_orig_mod.2"], acts
        assert sorted(fake.names("param_grad", step)) == [
            "_orig_mod.0.bias", "_orig_mod.0.weight", "_orig_mod.2.bias", "_orig_mod.2.weight"]
        assert set(fake.names("act_grad", step)) >= {"_orig_mod.0", "_orig_mod.2"}


@pytest.mark.skipif(not hasattr(getattr(torch, "compiler", None), "is_exporting"),
                    reason="torch.export's tracing flag is torch >= 2.4")
def test_exporting_a_model_in_training_records_nothing_and_changes_no_name():
    """torch.export traces the model with fake tensors (non-strict mode: outside Dynamo),
    here in training mode between two steps: nothing of it is recorded, no error is
    counted (a fake tensor has no data to read), and the next step's rows are named as
    the first one's (the traced calls are not counted as calls of a micro step)."""
    mon, fake = fake_monitor()
    model = mlp()
    mon.watch(model)
    x = torch.randn(2, 4)
    train_step(model, x, mon)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        torch.export.export(model, (x,))
    train_step(model, x, mon)
    c = mon.counters()
    assert c["python_errors"] == 0, c["last_python_error"]
    rows = [sorted((r["name"], r["kind"]) for r in fake.records
                   if r["step"] == step and r["kind"] != "param") for step in (0, 1)]
    assert rows[1] == rows[0] and rows[0]


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch < 2.0 has no torch.compile")
@pytest.mark.parametrize("what", ["model", "submodule"])
def test_a_model_compiled_with_the_default_backend_gives_the_rows_of_eager(what):
    """torch.compile with its default backend (Inductor, which compiles C++ for the CPU),
    of the whole model or of one submodule: the same rows as the eager model (every
    default kind, act_in included), in the same order, under the wrapper's `_orig_mod.`
    prefix (which the collector strips; the wrapped module itself is not a row of its
    own), with the same statistics up to the compiled kernels' rounding. Every watched
    module is a graph break (its hooks run eagerly), so Inductor fuses nothing across a
    watched module's boundary."""
    def run(compiled):
        mon, fake = fake_monitor()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.LayerNorm(8),
                              nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        watched = model
        if compiled and what == "model":
            watched = torch.compile(model)
        elif compiled:
            model[2] = torch.compile(model[2])
        mon.watch(watched, optimizer=opt)
        gen = torch.Generator().manual_seed(1)
        for _ in range(3):
            train_step(watched, torch.randn(5, 4, generator=gen), mon, opt)
        c = mon.counters()
        assert c["python_errors"] == 0, c["last_python_error"]
        assert mon.close(timeout=5.0)
        return fake.records, dict(mon._rec.module_types)

    (eager, eager_types), (compiled, compiled_types) = run(False), run(True)
    key = lambda r: (r["step"], r["micro"], r["kind"], r["name"].replace("_orig_mod.", ""))  # noqa: E731
    assert {r["kind"] for r in eager} >= {"act", "act_in", "act_grad", "param_grad", "input"}
    # Module rows in the same order; a compiled module's backward is one graph, which may
    # hand its parameters' gradients over in another order (the collector pairs by name).
    assert sorted(map(key, eager)) == sorted(map(key, compiled))
    assert ([key(r) for r in eager if r["kind"] != "param_grad"]
            == [key(r) for r in compiled if r["kind"] != "param_grad"])
    eager, compiled = sorted(eager, key=key), sorted(compiled, key=key)
    for e, c in zip(eager, compiled):
        assert e["stats"]["numel"] == c["stats"]["numel"], (key(e), e["stats"], c["stats"])
        assert math.isclose(e["stats"]["l2"], c["stats"]["l2"], rel_tol=1e-4, abs_tol=1e-6), (
            key(e), e["stats"]["l2"], c["stats"]["l2"])
    assert {k.replace("_orig_mod.", ""): v for k, v in compiled_types.items()} == eager_types


def test_the_model_does_not_keep_its_monitor_alive_and_its_hooks_become_no_ops():
    """As torch's RemovableHandle: the hooks hold their Monitor weakly. A Monitor that is
    dropped without close() is collected while its model lives on, its hooks no longer
    record (nor fail), and they are taken out of the model."""
    import gc  # pylint: disable=import-outside-toplevel
    import weakref  # pylint: disable=import-outside-toplevel
    mon, fake = fake_monitor()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon.watch(model, optimizer=opt, kinds=TENSOR_KINDS)
    train_step(model, torch.randn(3, 4), mon, opt)
    recorded = len(fake.records)
    assert recorded > 0
    assert model[0]._forward_hooks and model[0].weight._backward_hooks
    param_hook = next(iter(model[0].weight._backward_hooks.values()))
    forward_hook = next(iter(model[0]._forward_hooks.values()))
    mon_ref, session_ref = weakref.ref(mon), mon._session.ref
    del mon
    gc.collect()
    assert mon_ref() is None and session_ref() is None
    # Its hooks are out of the model; a hook kept elsewhere does nothing.
    assert not model[0]._forward_hooks and not model[0].weight._backward_hooks
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert param_hook(torch.ones(8, 4)) is None
        assert forward_hook(model[0], (torch.randn(1, 4),), torch.randn(1, 8)) is None
        train_step(model, torch.randn(3, 4), None, opt)
    assert len(fake.records) == recorded


class _TwoInputs(nn.Module):
    """A module called with two tensors and an int: inputs (0) and (1)."""

    def forward(self, a, b, scale=1):
        return (a * b) * scale


class _WithTwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)  # changes its input: what it received is recorded first
        self.mul = _TwoInputs()

    def forward(self, x):
        h = self.act(self.lin(x))
        return self.mul(h, x + 1, scale=2) + self.mul(h, h)


def test_module_inputs_are_recorded_once_and_repeated_when_they_are_the_output_before():
    mon, fake = fake_monitor()
    model = _WithTwoInputs()
    mon.watch(model, kinds=("act", "act_in"))
    x = torch.randn(3, 4)
    train_step(model, x, mon)
    recs = [r for r in fake.records if r["step"] == 0]
    got = {(r["name"], r["kind"]): r for r in recs}
    # The root's inputs are kind "input", not act_in; every other module's are act_in.
    assert ("<root>", "act_in") not in got
    # Several inputs are named by position (mul(0)), never like an output element (mul[0]).
    assert {"lin", "act", "mul(0)", "mul(1)", "mul#1(0)", "mul#1(1)"} == \
        {n for n, k in got if k == "act_in"}, sorted(got)
    # What `act` received is lin's output (a repeat, computed once), recorded before the
    # in-place ReLU changed it; mul's first input is act's output (a repeat again).
    assert got[("act", "act_in")]["stats"].get("repeat") is True
    assert plain_stats(got[("act", "act_in")]["stats"]) == plain_stats(got[("lin", "act")]["stats"])
    assert got[("mul(0)", "act_in")]["stats"].get("repeat") is True
    # x + 1 is computed in the parent's code: a record of its own, with x + 1's statistics.
    assert not got[("mul(1)", "act_in")]["stats"].get("repeat", False)
    assert got[("mul(1)", "act_in")]["stats"]["mean"] == pytest.approx((x + 1).mean().item(), rel=1e-6)
    # Each module's inputs come before its output in execution order.
    assert got[("lin", "act_in")]["order"] < got[("lin", "act")]["order"]
    assert got[("mul#1(1)", "act_in")]["order"] < got[("mul#1", "act")]["order"]


def test_module_inputs_are_not_recorded_outside_training():
    mon, fake = fake_monitor()
    model = _WithTwoInputs()
    mon.watch(model, kinds=("act_in",))
    with torch.no_grad():
        model(torch.randn(3, 4))
    model.eval()
    model(torch.randn(3, 4))
    assert not fake.records
