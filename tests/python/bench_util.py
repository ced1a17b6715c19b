"""What the Python overhead benches share: a real collector to send to, the naive
statistics baseline (msprobe's statistics mode: per-tensor torch ops, each read with
.item()), and hooks at the points lockstep hooks."""
import gc
import json
import os
import subprocess
import sys
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


def import_torchvision(bench):
    """torchvision, or None after saying on stderr that `bench` needs the torch 2.x stack,
    which has it."""
    try:
        import torchvision  # pylint: disable=import-outside-toplevel
    except ImportError:
        print("%s: torchvision is not installed in %s (it is in the torch 2.x stack: bash "
              "scripts/setup)" % (bench, sys.executable), file=sys.stderr)
        return None
    return torchvision


def collect_between_rounds(round_index, every=10):
    """For benches that watch anew every round and remove the watch after its step.
    Each watch leaves a few thousand objects in reference cycles (hooks and the modules
    that hold them) that only Python's cyclic collector frees, and left to itself the
    collector runs inside whichever timed step crosses its threshold: a cost a job that
    watches once never pays (a watched step adds about one tracked object). So the
    automatic collector is off while the rounds run, and this collects every `every`
    rounds, between steps; call it at the start of each round and gc.enable() after."""
    gc.disable()
    if round_index % every == 0:
        gc.collect()


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


class TimedAgent:
    """What the monitor's recorder spends in its C++ statistics calls on the training
    thread (the tensors hot in cache, as in training), and the bytes they read and hand
    to the host statistics thread: the recorder's own accounting (RecorderCore's
    kernel_timing, two clock reads a kernel call), turned on here."""

    def __init__(self, recorder):
        self._rec = recorder
        recorder.kernel_timing = True

    @property
    def seconds(self):
        return self._rec.kernel_seconds

    @property
    def bytes(self):  # read by the kernel on the training thread
        return self._rec.kernel_bytes

    @property
    def threaded_bytes(self):  # handed to the host statistics thread
        return self._rec.threaded_bytes


TUNABLES = "glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=1073741824"

RESNET_BATCH, RESNET_SIDE, RESNET_CLASSES = 16, 32, 10


def sgd(model):
    """The resnet benches' optimizer: SGD with momentum."""
    return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def resnet18_problem(torchvision, threads=1):
    """What the resnet benches train: torchvision's resnet18 on CIFAR-sized images
    (3x32x32, batch 16, 10 classes) on `threads` torch threads, seeded. Returns
    (model, its optimizer (sgd), x, y)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=RESNET_CLASSES)
    opt = sgd(model)
    x = torch.randn(RESNET_BATCH, 3, RESNET_SIDE, RESNET_SIDE)
    y = torch.randint(0, RESNET_CLASSES, (RESNET_BATCH,))
    return model, opt, x, y


def train_step(model, opt, x, y, monitor=None):
    """One training step of the resnet benches (cross entropy, backward, the optimizer,
    zero_grad), and `monitor.step(loss=...)` when given."""
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if monitor is not None:
        monitor.step(loss=loss)


def reexec_with_quiet_memory(threads):
    """Re-executes this script with glibc's malloc trim and mmap thresholds raised and
    OpenBLAS's pool sized to `threads` (unless the environment sets them), as the
    torch_overhead_bench docstring explains; returns when they are set."""
    if "GLIBC_TUNABLES" not in os.environ or "OPENBLAS_NUM_THREADS" not in os.environ:
        env = dict(os.environ)
        env.setdefault("GLIBC_TUNABLES", TUNABLES)
        env.setdefault("OPENBLAS_NUM_THREADS", str(threads))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)

