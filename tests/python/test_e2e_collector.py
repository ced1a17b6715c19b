"""A real training loop (a small TransformerEncoder on synthetic data) watched by
lockstep and sending to a real `lockstep collect`: the collector's log (read with
`lockstep inspect`) holds the expected names, kinds, order, steps, scalars and
statistics, checked against a float64 reference computed here."""
import json
import math
import subprocess

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


@pytest.mark.parametrize("device_path", [False, True], ids=["host-kernel", "device-path"])
def test_training_loop_lands_in_the_collector_log(collector, device_path):
    """device-path: the same loop with CPU tensors forced through the device pipeline
    (device_stats, one copy per step, record_packed), as CUDA/NPU tensors go."""
    if device_path:
        pytest.importorskip("lockstep._torch_stats")
    torch.manual_seed(0)
    model = TinyTransformer()
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
    for step, (x, y) in enumerate(synthetic_batches(STEPS)):
        current["step"] = step
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        ref_grads[step] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        mon.step(loss=loss, lr=opt.param_groups[0]["lr"])
        losses.append(loss.item())
    assert mon.close(timeout=10.0)
    counters = mon.counters()
    assert counters["python_errors"] == 0, counters["last_python_error"]
    assert counters["records_dropped"] == 0

    log = collector.inspect("e2e-tiny")
    types = [r["type"] for r in log]
    assert types[0] == "Hello" and types[-1] == "Goodbye"
    hello = log[0]["body"]
    assert (hello["role"], hello["experiment"], hello["platform"]) == ("baseline", "py-e2e", "cpu")

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
            assert s["numel"] == ref["numel"] and s["dtype"] == "f32"
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
            for key in ("l2", "mean", "absmax"):
                assert close(grads[name][key], ref[key], abs_tol=1e-8), (step, name, key)
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
