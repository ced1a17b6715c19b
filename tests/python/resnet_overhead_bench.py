# lockstep-bench-stack: torch2  (scripts/bench runs it with the torch 2.x stack: torchvision)
"""Overhead of the lockstep agent on torchvision's resnet18: many small tensors.

torch_overhead_bench's transformer has few, large tensors, and hides what each record
costs beyond the statistics kernel (the Python hooks, name lookups, the calls into
C++). resnet18 records about 290 tensors a step, most of them small (BatchNorm
parameters' gradients: 64-512 elements), on CIFAR-sized images (3x32x32, batch 16,
10 classes; torchvision's own model code, SGD with momentum), on one torch thread.

Four configurations, one step each per round, in a fresh random order each round, the
hooks attached before the step and removed after it (as torch_overhead_bench; see its
docstring for the memory and OpenBLAS settings this re-executes itself with; Python's
cyclic collector runs between rounds, not inside them: bench_util.collect_between_rounds):
  `plain`    no hooks;
  `floor`    empty hooks at lockstep's hook points (torch's own hook machinery);
  `lockstep` Monitor.watch with the defaults (host_stats_thread="auto");
  `inline`   the same with host_stats_thread="off": everything on the training thread.

BENCH torch_overhead_ratio_resnet18         median of lockstep / plain step time (target <= 1.03)
BENCH torch_overhead_ratio_resnet18_inline  the same for `inline`
BENCH torch_hooks_floor_ratio_resnet18      median of floor / plain: torch's hook machinery
BENCH agent_hook_us_per_tensor   what the agent costs per recorded tensor beyond torch's
                                 own hook machinery, where the statistics kernel costs
                                 nothing: a stack of 30 x (Linear(8, 8), BatchNorm1d, ReLU),
                                 batch 4 (tensors of 8-32 elements, ~390 records a step);
                                 the median over 300 rounds (one step of each, alternating)
                                 of (inline - floor) in the training thread's CPU time, per
                                 record (a few us per tensor is below the noise of a
                                 wall-time median). Everything the agent does per tensor is in it:
                                 hook bodies, names, the recorder, the call into C++ and
                                 its fixed cost (target <= 5 us)
BENCH agent_hook_share_tiny       the same rounds' median (inline - floor) over the floor's
                                 median step time: the agent's time as a share of the
                                 step. This VM's speed drifts between runs by more than a
                                 cut of the per-tensor cost; this ratio does not, and is
                                 what to compare two builds by (run them alternately)
BENCH agent_hook_us_per_tensor_resnet18  the same estimated on resnet18 itself: median over
                                 rounds of (inline - floor - the inline Monitor's time in
                                 its C++ record calls) / records, in thread CPU time; it
                                 also holds what reading tensors for the statistics costs
                                 the training's own ops afterwards (caches)
BENCH resnet18_stats_ms_per_step  median time inside the inline Monitor's C++ record calls
                                 (the statistics kernel) per step
BENCH torch_overhead_ratio_resnet18_unrecorded  a step watch(every=N) does not record,
                                 against a plain step: median over rounds of their ratio in
                                 thread CPU time (two copies of the model, one step each a
                                 round; a wall-time ratio is as noisy here as the figure is
                                 small). watch(every=10)'s mean is about (the recorded step's
                                 ratio + 9 x this) / 10
BENCH resnet18_step_ms           median plain step time, for context
BENCH resnet18_tensors_per_step  tensors lockstep records per step
"""
import copy
import gc
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
from bench_util import (TimedAgent, attach_hooks, collect_between_rounds,  # noqa: E402
                        import_torchvision, reexec_with_quiet_memory, resnet18_problem, sgd,
                        start_collector, train_step)

WARMUP = 20  # rounds not measured: includes host_stats_thread="auto"'s tuning steps
STEPS = int(os.environ.get("LOCKSTEP_BENCH_STEPS", "40"))
THREADS = int(os.environ.get("LOCKSTEP_BENCH_THREADS", "1"))
TINY_STEPS = 300
UNRECORDED_ROUNDS = int(os.environ.get("LOCKSTEP_BENCH_UNRECORDED_ROUNDS", "150"))


def tiny_per_tensor_us(endpoint):
    """agent_hook_us_per_tensor: see the module doc."""
    torch.manual_seed(0)
    layers = []
    for _ in range(30):
        layers += [torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8)
    mon = lockstep.Monitor(run="tiny-bench", endpoint=endpoint, host_stats_thread="off")
    kinds = tuple(k for k in _watch.DEFAULT_KINDS if k != "init")

    def step(m):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if m is not None:
            m.step(loss=loss)

    # One watch for the whole run, its hooks out of torch's tables (Watch.set_in) for
    # the floor's steps: the two alternate step by step, and each round's difference
    # is taken (separate phases drifted apart by more than the figure on this VM).
    mon.watch(model, kinds=kinds)
    watch = mon._watches[-1]
    diffs, floors, records = [], [], []
    for i in range(20 + TINY_STEPS):  # 20 rounds of warm-up
        times = {}
        for kind in (("floor", "lockstep") if i % 2 else ("lockstep", "floor")):
            watch.set_in(kind == "lockstep")
            handles = attach_hooks(model) if kind == "floor" else []
            before = mon.counters()["tensors_recorded"]
            c0 = time.thread_time()
            step(mon if kind == "lockstep" else None)
            times[kind] = time.thread_time() - c0
            for h in handles:
                h.remove()
            if kind == "lockstep":
                records.append(mon.counters()["tensors_recorded"] - before)
        if i >= 20:
            diffs.append(times["lockstep"] - times["floor"])
            floors.append(times["floor"])
    mon.close(timeout=5.0)
    per_step = statistics.median(records)
    return (statistics.median(diffs) / per_step * 1e6, per_step,
            statistics.median(diffs) / statistics.median(floors))


def unrecorded_ratio(model, x, y, endpoint, kinds, rounds=UNRECORDED_ROUNDS):
    """torch_overhead_ratio_resnet18_unrecorded: see the module doc. Two copies of the
    model train side by side, one step each per round (in alternating order), the second
    watched with every=10**9: every step after its first is one the watch does not
    record."""
    plain, watched = copy.deepcopy(model), copy.deepcopy(model)
    opts = {id(m): sgd(m) for m in (plain, watched)}
    mon = lockstep.Monitor(run="resnet-bench-unrecorded", endpoint=endpoint)
    mon.watch(watched, kinds=kinds, every=10**9)

    def step(m, monitor):
        t0 = time.thread_time()
        train_step(m, opts[id(m)], x, y, monitor)
        return time.thread_time() - t0

    ratios = []
    for r in range(rounds + 10):  # ten rounds of warm-up (the first step is recorded)
        if r % 2:
            a, b = step(plain, None), step(watched, mon)
        else:
            b, a = step(watched, mon), step(plain, None)
        if r >= 10:
            ratios.append(b / a)
    mon.close(timeout=5.0)
    return statistics.median(ratios)


def main():
    reexec_with_quiet_memory(THREADS)
    torchvision = import_torchvision("resnet_overhead_bench")
    if torchvision is None:
        return 1
    model, opt, x, y = resnet18_problem(torchvision, THREADS)
    tmp = tempfile.mkdtemp(prefix="lockstep-bench-")
    proc, endpoint = start_collector(tmp)
    mon = lockstep.Monitor(run="resnet-bench", endpoint=endpoint)
    mon_inline = lockstep.Monitor(run="resnet-bench-inline", endpoint=endpoint,
                                  host_stats_thread="off")
    timed_inline = TimedAgent(mon_inline._rec)
    monitors = {"lockstep": mon, "inline": mon_inline}
    # "init" (every parameter once, at the first watch) is left out: this bench watches
    # anew every step.
    kinds = tuple(k for k in _watch.DEFAULT_KINDS if k != "init")

    def attacher(m_):
        def attach(m):
            m_.watch(m, kinds=kinds)
            return [m_._watches.pop()]  # removed again after the step
        return attach

    attach = {"plain": lambda m: [], "floor": attach_hooks, "lockstep": attacher(mon),
              "inline": attacher(mon_inline)}
    names = list(attach)
    times = {k: [] for k in names}
    cpu_times = {k: [] for k in names}
    inline_cxx = []

    def one_step(kind):
        t0, c0 = time.perf_counter(), time.thread_time()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if kind in monitors:
            monitors[kind].step(loss=loss)
        return time.perf_counter() - t0, time.thread_time() - c0

    tiny_us, tiny_records, tiny_share = tiny_per_tensor_us(endpoint)
    rng = random.Random(0)
    for i in range(WARMUP + STEPS):
        collect_between_rounds(i)
        order = list(names)
        rng.shuffle(order)
        for kind in order:
            handles = attach[kind](model)
            before = timed_inline.seconds
            dt, dc = one_step(kind)
            for h in handles:
                h.remove()
            if i >= WARMUP:
                times[kind].append(dt)
                cpu_times[kind].append(dc)
                if kind == "inline":
                    inline_cxx.append(timed_inline.seconds - before)
    gc.enable()
    unrecorded = unrecorded_ratio(model, x, y, endpoint, kinds)
    counters = mon.counters()
    per_step = mon_inline.counters()["tensors_recorded"] / (WARMUP + STEPS)
    mon.close(timeout=5.0)
    mon_inline.close(timeout=5.0)
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)

    rounds = list(zip(*(times[k] for k in names)))
    col = {k: i for i, k in enumerate(names)}
    pl, fl, lk, il = (col[k] for k in ("plain", "floor", "lockstep", "inline"))
    ratio = statistics.median(r[lk] / r[pl] for r in rounds)
    inline = statistics.median(r[il] / r[pl] for r in rounds)
    floor = statistics.median(r[fl] / r[pl] for r in rounds)
    cpu_rounds = list(zip(*(cpu_times[k] for k in names)))
    hook_us = statistics.median((r[il] - r[fl] - c) / per_step * 1e6
                                for r, c in zip(cpu_rounds, inline_cxx))
    print("collector: %s; steps: %d; threads: %d; host statistics thread: %s (%d of %d "
          "records; measured ratio %s); wall medians ms: %s"
          % ("real" if proc else "none (no LOCKSTEP_BIN)", STEPS, THREADS,
             "on" if counters.get("host_stats_thread") else "off",
             counters["tensors_threaded"], counters["tensors_recorded"],
             counters.get("host_stats_thread_ratio"),
             {k: round(statistics.median(v) * 1e3, 3) for k, v in times.items()}))
    print("BENCH resnet18_step_ms %.3f ms" % (statistics.median(times["plain"]) * 1e3))
    print("BENCH resnet18_tensors_per_step %.0f count" % per_step)
    print("BENCH resnet18_stats_ms_per_step %.3f ms" % (statistics.median(inline_cxx) * 1e3))
    print("BENCH torch_hooks_floor_ratio_resnet18 %.4f ratio" % floor)
    print("BENCH torch_overhead_ratio_resnet18_inline %.4f ratio" % inline)
    print("tiny-tensor stack: %.0f records a step" % tiny_records)
    print("BENCH agent_hook_us_per_tensor_resnet18 %.2f us" % hook_us)
    print("BENCH agent_hook_us_per_tensor %.2f us" % tiny_us)
    print("BENCH agent_hook_share_tiny %.3f ratio" % tiny_share)
    print("BENCH torch_overhead_ratio_resnet18_unrecorded %.4f ratio" % unrecorded)
    print("BENCH torch_overhead_ratio_resnet18 %.4f ratio" % ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
