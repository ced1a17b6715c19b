# lockstep-bench-stack: torch2  (scripts/bench runs it with the torch 2.x stack: torchvision)
"""Where the agent's time goes on torchvision's resnet18: by kind and by training phase.

resnet_overhead_bench.py says how much a watched step costs; this says which kinds of
records cost it, and in which phase of the step (docs/python.md "The per-tensor cost").
The same model, data and settings as there (3x32x32, batch 16, one torch thread, SGD
with momentum), and one Monitor per configuration:
  `plain`          no hooks;
  `act`, `act_in`, `act_grad`, `param_grad`, `loss`
                   that kind alone, statistics on the host thread;
  `defaults`       Monitor.watch's default kinds, statistics on the host thread;
  `defaults_inline` the same, statistics on the training thread.
The thread is "on", not "auto": the tuner's choice must not differ between
configurations. Each round runs one step of every configuration in a fresh random order,
watch() before the step and the watch removed after it; each step is split into forward,
backward, optimizer (step and zero_grad) and Monitor.step, timed in the training
thread's CPU time. A figure is the median over rounds of the configuration's time minus
the same round's plain time, per phase, so this VM's drift between rounds cancels.

BENCH resnet18_cost_ms_<configuration>  median of (configuration - plain) training-thread
                                         CPU time a step, ms (the four phases summed
                                         before the median)
"""
import os
import random
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lockstep  # noqa: E402
from lockstep import _watch  # noqa: E402
from bench_util import reexec_with_quiet_memory, start_collector  # noqa: E402

WARMUP = 20  # rounds not measured: the first records of each name are computed inline
ROUNDS = int(os.environ.get("LOCKSTEP_BENCH_STEPS", "50"))
BATCH, SIDE, CLASSES = 16, 32, 10
PHASES = ("forward", "backward", "optimizer", "Monitor.step")


def configurations():
    """name -> (kinds, host_stats_thread); plain is (None, None)."""
    defaults = tuple(k for k in _watch.DEFAULT_KINDS if k != "init")
    out = {"plain": (None, None)}
    for kind in ("act", "act_in", "act_grad", "param_grad", "loss"):
        out[kind] = ((kind,), "on")
    out["defaults"] = (defaults, "on")
    out["defaults_inline"] = (defaults, "off")
    return out


def main():
    reexec_with_quiet_memory(1)
    try:
        import torchvision  # pylint: disable=import-outside-toplevel
    except ImportError:
        print("resnet_breakdown_bench: torchvision is not installed in %s (it is in the "
              "torch 2.x stack: bash scripts/setup)" % sys.executable, file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(BATCH, 3, SIDE, SIDE)
    y = torch.randint(0, CLASSES, (BATCH,))
    proc, endpoint = start_collector(tempfile.mkdtemp(prefix="lockstep-breakdown-"))
    configs = configurations()
    monitors = {name: lockstep.Monitor(run="breakdown-" + name, endpoint=endpoint,
                                       host_stats_thread=thread)
                for name, (kinds, thread) in configs.items() if kinds is not None}
    times = {name: [] for name in configs}  # per round: the four phases' seconds
    rng = random.Random(0)
    try:
        for i in range(WARMUP + ROUNDS):
            order = list(configs)
            rng.shuffle(order)
            for name in order:
                mon = monitors.get(name)
                if mon is not None:
                    mon.watch(model, kinds=configs[name][0])
                t0 = time.thread_time()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                t1 = time.thread_time()
                loss.backward()
                t2 = time.thread_time()
                opt.step()
                opt.zero_grad()
                t3 = time.thread_time()
                if mon is not None:
                    mon.step(loss=loss)
                t4 = time.thread_time()
                if mon is not None:
                    mon._watches.pop().remove()  # pylint: disable=protected-access
                if i >= WARMUP:
                    times[name].append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
    finally:
        for mon in monitors.values():
            mon.close(timeout=5.0)
        if proc is not None:
            proc.terminate()
            proc.wait()

    plain = times["plain"]
    print("plain step, training-thread CPU ms (median): " + ", ".join(
        "%s %.2f" % (p, statistics.median(r[j] for r in plain) * 1e3)
        for j, p in enumerate(PHASES)))
    print("%-16s %s %9s" % ("added ms", " ".join("%12s" % p for p in PHASES), "step"))
    for name in configs:
        if name == "plain":
            continue
        rows = times[name]
        phase = [statistics.median(a[j] - b[j] for a, b in zip(rows, plain)) * 1e3
                 for j in range(len(PHASES))]
        total = statistics.median(sum(a) - sum(b) for a, b in zip(rows, plain)) * 1e3
        print("%-16s %s %+9.3f" % (name, " ".join("%+12.3f" % v for v in phase), total))
        print("BENCH resnet18_cost_ms_%s %.3f ms" % (name, total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
