"""A real training loop (a small TransformerEncoder on synthetic data) watched by
lockstep and sending to a real `lockstep collect`: the collector's log (read with
`lockstep inspect`) holds the expected names, kinds, order, steps, scalars and
statistics, checked against a float64 reference computed here. On CPU (the C++ kernel,
and the device pipeline forced onto CPU tensors) everywhere; on CUDA (fp32, and AMP
with a GradScaler) where a GPU is present."""
import json
import math
import os
import subprocess
import warnings

import pytest
import torch

import lockstep
from conftest import lockstep_bin
from model_zoo import TinyTransformer, synthetic_batches

STEPS = 3

try:
    from lockstep import _torch_stats as torch_stats
except ImportError:  # the host kernel is still checked against the float64 reference
    torch_stats = None


def reference_stats(t):
    x = t.detach().double().reshape(-1)
    return dict(numel=x.numel(), min=x.min().item(), max=x.max().item(), mean=x.mean().item(),
                std=x.std(unbiased=False).item(), l2=x.norm().item(),
                absmax=x.abs().max().item(), zero_count=int((x == 0).sum()))


def close(a, b, rel=2e-5, abs_tol=1e-6):
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
# The platform in the Hello is the process's (detected), not the model's device.
PLATFORM = "cuda" if HAS_CUDA else "cpu"
WIRE_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class SyncWatch:
    """torch.cuda's sync debug mode ("warn") around a block; `lockstep_syncs` lists the
    host syncs whose warning points into the lockstep package (the training loop's own,
    e.g. GradScaler's .item(), are not lockstep's)."""

    def __enter__(self):
        self.old = torch.cuda.get_sync_debug_mode()
        self.rec = warnings.catch_warnings(record=True)
        self.caught = self.rec.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode(self.old)
        self.rec.__exit__(*exc)
        return False

    @property
    def lockstep_syncs(self):
        pkg = os.path.dirname(os.path.abspath(lockstep.__file__)) + os.sep
        return ["%s:%s: %s" % (w.filename, w.lineno, w.message) for w in self.caught
                if "synchroniz" in str(w.message)
                and os.path.abspath(w.filename).startswith(pkg)]


def grad_scaler(**kwargs):
    """torch.amp.GradScaler("cuda") where it exists (torch >= 2.3; torch.cuda.amp's is
    deprecated there), else torch.cuda.amp.GradScaler."""
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        return amp.GradScaler("cuda", **kwargs)
    return torch.cuda.amp.GradScaler(**kwargs)


@pytest.mark.parametrize("device_path,device", [
    (False, "cpu"), (True, "cpu"),
    pytest.param(False, "cuda", marks=needs_cuda)], ids=["host-kernel", "device-path", "cuda"])
def test_training_loop_lands_in_the_collector_log(collector, device_path, device):
    """device-path: the same loop with CPU tensors forced through the device pipeline
    (device_stats, one copy per step, record_packed), as CUDA/NPU tensors go. cuda: the
    model and data on the GPU (the device pipeline for real), with no host sync inside
    lockstep (torch.cuda's sync debug mode)."""
    if device_path or device == "cuda":
        pytest.importorskip("lockstep._torch_stats")
    torch.manual_seed(0)
    model = TinyTransformer().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    # The reference: every module output and parameter gradient, captured by the test's
    # own hooks, in call order.
    ref_acts = {s: [] for s in range(STEPS)}
    ref_grads = {s: {} for s in range(STEPS)}
    current = {"step": 0}

    def capture(name):
        def hook(_m, _i, out):
            if isinstance(out, tuple):
                out = out[0]
                name_ = name + "[0]"
            else:
                name_ = name
            ref_acts[current["step"]].append((name_ or "<root>", out.detach().clone()))
        return hook

    for name, module in model.named_modules():
        module.register_forward_hook(capture(name))

    mon = lockstep.Monitor(run="e2e-tiny", role="baseline", experiment="py-e2e",
                           endpoint=collector.endpoint, _force_device_path=device_path)
    assert mon.enabled
    mon.watch(model, optimizer=opt)
    losses = []
    syncs = []
    for step, (x, y) in enumerate(synthetic_batches(STEPS)):
        x, y = x.to(device), y.to(device)
        current["step"] = step
        if device == "cuda" and hasattr(torch.cuda, "set_sync_debug_mode"):
            with SyncWatch() as sw:
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                ref_grads[step] = {n: p.grad.detach().clone()
                                   for n, p in model.named_parameters()}
                opt.step()
                opt.zero_grad()
                mon.step(loss=loss, lr=opt.param_groups[0]["lr"])
            syncs += sw.lockstep_syncs
        else:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            ref_grads[step] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
            opt.step()
            opt.zero_grad()
            mon.step(loss=loss, lr=opt.param_groups[0]["lr"])
        losses.append(loss.item())
    assert syncs == [], syncs
    assert mon.close(timeout=10.0)
    counters = mon.counters()
    assert counters["python_errors"] == 0, counters["last_python_error"]
    assert counters["records_dropped"] == 0

    log = collector.inspect("e2e-tiny")
    types = [r["type"] for r in log]
    assert types[0] == "Hello" and types[-1] == "Goodbye"
    hello = log[0]["body"]
    assert (hello["role"], hello["experiment"], hello["platform"]) == ("baseline", "py-e2e",
                                                                        PLATFORM)

    stats = [dict(s, step=r["body"]["step"]) for r in log if r["type"] == "StepStats"
             for s in r["body"]["stats"]]
    assert sorted({s["step"] for s in stats}) == list(range(STEPS))
    scalars = {r["body"]["step"]: r["body"] for r in log if r["type"] == "StepScalars"}
    assert sorted(scalars) == list(range(STEPS))

    for step in range(STEPS):
        recs = sorted((s for s in stats if s["step"] == step), key=lambda s: s["order"])
        assert [s["order"] for s in recs] == list(range(len(recs)))
        acts = [s for s in recs if s["kind"] == "act"]
        # embed, 2 x (self_attn[0], linear1, linear2, dropout, dropout1, dropout2, norm1,
        # norm2, the layer), encoder, head, <root>
        assert len(acts) == 22
        # names and execution order of module outputs match the reference hooks
        assert [s["name"] for s in acts] == [n for n, _ in ref_acts[step]]
        for s, (name, t) in zip(acts, ref_acts[step]):
            ref = reference_stats(t)
            assert s["numel"] == ref["numel"] and s["dtype"] == "fp32"
            for key in ("min", "max", "mean", "std", "l2", "absmax"):
                assert close(s[key], ref[key]), (step, name, key, s[key], ref[key])
            assert s["nan_count"] == 0 and s["inf_count"] == 0
            assert len(s["sketch"]) == 32 and len(s["hist"]) == 16
            assert sum(s["hist"]) == s["numel"]
            if torch_stats is not None:  # the sketch against the independent torch code
                row = torch_stats.device_stats([t], 32, 16)[0]
                col = torch_stats.SKETCH_COL
                ref_sketch = row[col:col + 32]
                scale = float(ref_sketch.abs().max()) + 1e-30
                assert max(abs(a - float(b)) for a, b in zip(s["sketch"], ref_sketch)) \
                    <= 1e-4 * scale, (step, name)
        grads = {s["name"]: s for s in recs if s["kind"] == "param_grad"}
        assert set(grads) == set(ref_grads[step])
        for name, g in ref_grads[step].items():
            ref = reference_stats(g)
            # The mean is a sum of float32 partials of 16 elements (docs/statistics.md):
            # off by about 2^-23 x mean |x| at worst. A gradient whose mean cancels to ~0
            # (a softmax head's rows) is judged by that, not by its own size.
            mean_tol = max(1e-8, 4 * 2.0 ** -23 * float(g.detach().double().abs().mean()))
            for key in ("l2", "mean", "absmax"):
                assert close(grads[name][key], ref[key],
                             abs_tol=mean_tol if key == "mean" else 1e-8), (
                    step, name, key, grads[name][key], ref[key])
        act_grads = [s["name"] for s in recs if s["kind"] == "act_grad"]
        assert set(act_grads) == {n for n, _ in ref_acts[step]}
        assert [s["name"] for s in recs if s["kind"] == "loss"] == ["loss"]
        # every act comes before every act_grad: forward, then backward
        assert max(s["order"] for s in acts) < min(s["order"] for s in recs
                                                   if s["kind"] == "act_grad")
        sc = scalars[step]
        assert close(sc["loss"], losses[step], rel=1e-6)
        assert close(sc["lr"], 1e-3, rel=1e-12)
        total = math.sqrt(sum(g.double().norm().item() ** 2 for g in ref_grads[step].values()))
        assert close(sc["grad_norm"], total, rel=1e-5)
        assert sc["step_time_s"] > 0 and sc["micro_steps"] == 1

    out = subprocess.run([lockstep_bin(), "inspect", "--summary", collector.log_path("e2e-tiny")],
                         capture_output=True, text=True, timeout=30, check=True)
    summary = json.loads(out.stdout.splitlines()[0])
    assert summary["gaps"] == 0 and summary["role"] == "baseline"


AMP_STEPS = 30


@needs_cuda
def test_cuda_amp_training_loop_with_grad_scaler(collector):
    """A few dozen AMP steps on the GPU (autocast fp16, GradScaler): the log holds every
    step with fp16 and fp32 outputs under their own dtypes, statistics equal to a float64
    reference of the same CUDA tensors, the scaler's scale as loss_scale, and lockstep
    makes no host sync."""
    pytest.importorskip("lockstep._torch_stats")
    torch.manual_seed(0)
    model = TinyTransformer(d_model=64, d_ff=128).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = grad_scaler(init_scale=2.0 ** 12)
    checked = {"embed", "encoder.layers.0.linear1", "encoder.layers.1.norm2", "head"}
    ref_acts = {}
    ref_grads = {}
    current = {"step": 0}

    def capture(name):
        def hook(_m, _i, out):
            if name in checked and torch.is_grad_enabled():
                ref_acts[(current["step"], name)] = out.detach().clone()
        return hook

    for name, module in model.named_modules():
        module.register_forward_hook(capture(name))
    mon = lockstep.Monitor(run="e2e-amp", role="candidate", experiment="py-e2e",
                           endpoint=collector.endpoint)
    mon.watch(model, optimizer=opt)
    losses, scales, syncs = [], [], []
    for step, (x, y) in enumerate(synthetic_batches(AMP_STEPS)):
        x, y = x.cuda(), y.cuda()
        current["step"] = step
        with SyncWatch() as sw:
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            # what the hooks saw: gradients scaled by the loss scale, before unscale_
            ref_grads[step] = {n: p.grad.detach().double().norm().item()
                               for n, p in model.named_parameters()}
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            mon.step(loss=loss, lr=opt.param_groups[0]["lr"], loss_scale=scaler)
        syncs += sw.lockstep_syncs
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    assert syncs == [], syncs
    assert mon.close(timeout=10.0)
    counters = mon.counters()
    assert counters["python_errors"] == 0, counters["last_python_error"]
    assert counters["records_dropped"] == 0 and counters["device_steps_dropped"] == 0

    log = collector.inspect("e2e-amp")
    assert log[0]["type"] == "Hello" and log[-1]["type"] == "Goodbye"
    assert log[0]["body"]["platform"] == "cuda"
    stats = [dict(s, step=r["body"]["step"]) for r in log if r["type"] == "StepStats"
             for s in r["body"]["stats"]]
    assert sorted({s["step"] for s in stats}) == list(range(AMP_STEPS))
    scalars = {r["body"]["step"]: r["body"] for r in log if r["type"] == "StepScalars"}
    assert sorted(scalars) == list(range(AMP_STEPS))
    for step in range(AMP_STEPS):
        recs = sorted((s for s in stats if s["step"] == step), key=lambda s: s["order"])
        assert [s["order"] for s in recs] == list(range(len(recs)))
        kinds = {}
        for s in recs:
            kinds[s["kind"]] = kinds.get(s["kind"], 0) + 1
        assert kinds == {"act": 22, "act_grad": 22, "param_grad": 28, "loss": 1}, kinds
        acts = {s["name"]: s for s in recs if s["kind"] == "act"}
        for name in checked:
            t = ref_acts[(step, name)]
            s, ref = acts[name], reference_stats(t)
            assert s["dtype"] == WIRE_DTYPE[t.dtype], (name, s["dtype"], t.dtype)
            for key in ("min", "max", "mean", "std", "l2", "absmax"):
                assert close(s[key], ref[key]), (step, name, key, s[key], ref[key])
            assert s["zero_count"] == ref["zero_count"]
            assert s["nan_count"] == int(torch.isnan(t).sum())
        assert acts["embed"]["dtype"] == "fp16" and acts["encoder.layers.1.norm2"]["dtype"] == "fp32"
        grads = {s["name"]: s for s in recs if s["kind"] == "param_grad"}
        for name, l2 in ref_grads[step].items():
            if math.isfinite(l2):
                assert close(grads[name]["l2"], l2, rel=1e-5, abs_tol=1e-8), (step, name)
        sc = scalars[step]
        assert close(sc["loss"], losses[step], rel=1e-6)
        assert sc["loss_scale"] == scales[step]
        assert sc["step_time_s"] > 0 and sc["micro_steps"] == 1
