"""What the Python overhead benches share: a real collector to send to, the naive
statistics baseline (msprobe's statistics mode: per-tensor torch ops, each read with
.item()), and hooks at the points lockstep hooks."""
import json
import os
import subprocess
import time

import torch

NO_COLLECTOR = "tcp://127.0.0.1:9"  # nobody listens: the agent keeps (and then drops) it


def start_collector(tmp):
    """Starts `lockstep collect` ($LOCKSTEP_BIN) on a free loopback port; returns
    (process, endpoint), or (None, NO_COLLECTOR) without LOCKSTEP_BIN."""
    exe = os.environ.get("LOCKSTEP_BIN", "")
    if not exe or not os.access(exe, os.X_OK):
        return None, NO_COLLECTOR
    ready = os.path.join(tmp, "ready.json")
    proc = subprocess.Popen([exe, "collect", "--listen", "tcp://127.0.0.1:*", "--data-dir",
                             os.path.join(tmp, "data"), "--ready-file", ready],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with open(ready) as f:
                return proc, json.load(f)["listen"][0]
        except (OSError, ValueError, KeyError, IndexError):
            time.sleep(0.02)
    proc.kill()
    return None, NO_COLLECTOR


def naive_stats(t):
    """What a tool without a kernel does: one op and one host read per statistic."""
    t = t.detach().float()
    return (t.min().item(), t.max().item(), t.mean().item(), t.std().item(), t.norm().item(),
            t.abs().max().item(), torch.isnan(t).sum().item(), torch.isinf(t).sum().item(),
            (t == 0).sum().item())


def attach_hooks(model, on_tensor=None):
    """Hooks `model` where lockstep does: a forward hook per module that hands each
    floating output to `on_tensor` (when given) and registers a gradient hook on it, and
    a hook per parameter; the gradient hooks hand the gradient to `on_tensor` too.
    Returns the handles. With on_tensor=None the hooks do nothing: the cost of torch's
    hook machinery alone."""
    handles = []

    def on_grad(g):
        if on_tensor is not None:
            on_tensor(g)

    def fwd(_m, _i, out):
        if not torch.is_grad_enabled():
            return
        for o in out if isinstance(out, tuple) else (out,):
            if isinstance(o, torch.Tensor) and o.is_floating_point():
                if on_tensor is not None:
                    on_tensor(o)
                if o.requires_grad:
                    o.register_hook(on_grad)

    for _, m in model.named_modules():
        handles.append(m.register_forward_hook(fwd))
    for p in model.parameters():
        handles.append(p.register_hook(on_grad))
    return handles


# CUDA runtime / driver calls that launch a kernel (Triton launches through the driver).
LAUNCH_EVENTS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                 "cuLaunchKernelEx")


def launches_per_step(step, steps=2):
    """Kernel launches per call of `step()` on a CUDA device, counted by torch.profiler
    from the runtime/driver launch events (0 without CUDA)."""
    if not torch.cuda.is_available():
        return 0.0
    from torch.profiler import ProfilerActivity, profile  # pylint: disable=import-outside-toplevel
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return sum(ev.count for ev in prof.key_averages() if ev.key in LAUNCH_EVENTS) / steps
