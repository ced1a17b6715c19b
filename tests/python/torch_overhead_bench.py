"""Overhead of the lockstep agent on a small CPU transformer training step.

One model and one optimizer train in this process; each round runs one step in each of
five configurations, in random order, with the hooks of that configuration attached
before the step and removed after it (outside the timed region):
  `plain`    no hooks;
  `floor`    the same hook points as lockstep (a forward hook per module that registers a
             tensor hook on each output, a hook per parameter) with empty bodies: what any
             hook-based tool pays at this model size before doing any work;
  `lockstep` Monitor.watch: every module output, every output gradient, every parameter
             gradient, every step, sending to a real `lockstep collect` when LOCKSTEP_BIN
             is set; the Monitor's defaults;
  `inline`   the same with host_stats_thread="off";
  `naive`    the msprobe-style statistics mode: in each hook, per-tensor torch ops, each
             read with .item().
One model for all four (not one model each): separately allocated copies of the same
model differed from each other by up to ~8% in step time, more than the effect measured.
Per-step times are wall times of forward + backward + optimizer step + Monitor.step();
each figure is the median over rounds of the per-round figure, so load drifting on a
shared machine hits all four alike.
The bench re-executes itself with glibc's malloc trim and mmap thresholds raised
(GLIBC_TUNABLES, unless already set): otherwise glibc hands freed activation memory back
to the kernel between steps and a random third of the steps re-fault 1000-2000 pages,
which on these VMs took a 28 ms step to 45-60 ms in every configuration alike and buried
the few-percent effect being measured.
It also sizes OpenBLAS's thread pool to the torch thread count (OPENBLAS_NUM_THREADS,
unless set): Debian's torch runs its matrix products in OpenBLAS, whose own pool
torch.set_num_threads() does not size, so with LOCKSTEP_BENCH_THREADS=1 the products
still ran on both cores and an idle OpenBLAS worker spun (sched_yield) on the second
core all the time, competing with the agent's and collector's threads (figures before
session 11 were taken that way: 1.10-1.13 where this gives ~1.06 without the host
statistics thread). Set OPENBLAS_NUM_THREADS=2 to measure that configuration; the
Monitor's host_stats_thread="auto" then stays off (no idle core).
The Monitor uses its defaults: with one compute thread on a machine with more cores,
host_stats_thread="auto" computes outputs' and output gradients' statistics on the
agent's thread, on the idle core, if its first 18 watched steps measure that faster than
inline (lockstep/_tune.py; the warm-up rounds cover them). The `inline` configuration
always computes on the training thread.

BENCH torch_overhead_ratio     median of lockstep step time / plain step time (target <= 1.05)
BENCH torch_overhead_ratio_inline  the same for a second Monitor with host_stats_thread
                               "off" (all statistics on the training thread), measured
                               in the same rounds
BENCH torch_overhead_ratio_inline_process_cpu  its whole-process CPU ratio
BENCH torch_overhead_ratio_without_act_in  the same for a third Monitor whose watch leaves
                               out "act_in" (modules' inputs, issue 14), same rounds
BENCH torch_act_in_added_ms    median of lockstep step time - that Monitor's: what
                               recording what each module received adds
BENCH torch_overhead_vs_naive  median(lockstep - plain) / median(naive - plain) (target <= 0.33)
BENCH torch_hooks_floor_ratio  median of floor step time / plain step time: the part of
                               torch_overhead_ratio that is torch's hook machinery
BENCH torch_overhead_ratio_cpu the same ratios in CPU time of the training thread
BENCH torch_overhead_vs_naive_cpu  (time.thread_time: torch runs single-threaded on it;
BENCH torch_hooks_floor_ratio_cpu  robust when other processes load the machine; excludes
                               the agent's sender and host statistics threads)
BENCH torch_overhead_ratio_process_cpu  the same ratio in CPU time of the whole process
                               (time.process_time: every thread, the agent's included;
                               what the agent costs in total, wherever it runs)
BENCH torch_step_ms            median plain step time, for context
BENCH torch_tensors_per_step   tensors lockstep records per step
BENCH torch_overhead_added_ms  median of lockstep step time - plain step time
BENCH torch_overhead_cxx_ms    median per-step time inside the C++ record_host_tensor
                               calls (stats kernel + enqueue on the training thread,
                               timed around each call in the loop); the rest of the
                               added time is the Python hooks and, with the host
                               statistics thread, handing tensors to it
BENCH torch_stats_mb_per_step  MB of tensor memory the kernel reads per step (both ways)
BENCH torch_stats_threaded_mb_per_step  of which on the host statistics thread
BENCH torch_stats_inloop_gbps  the training thread's bytes / torch_overhead_cxx_ms: the
                               kernel's in-training throughput (tensors warm in cache)
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
from bench_util import (TimedAgent, attach_hooks, naive_stats,  # noqa: E402
                        reexec_with_quiet_memory, start_collector)
from model_zoo import TinyTransformer  # noqa: E402

WARMUP = 20  # rounds not measured: includes host_stats_thread="auto"'s 18 tuning steps
STEPS = int(os.environ.get("LOCKSTEP_BENCH_STEPS", "60"))
THREADS = int(os.environ.get("LOCKSTEP_BENCH_THREADS", "1"))
SHAPE = dict(d_in=64, d_model=128, nhead=4, d_ff=512, layers=2)
BATCH, SEQ = 16, 64


def attach_naive(model):
    """Hooks `model` the naive way; returns the handles."""
    sink = []
    return attach_hooks(model, lambda t: sink.append(naive_stats(t)))


def attach_floor(model):
    """The hook points lockstep uses, doing nothing; returns the handles."""
    return attach_hooks(model)


def main():
    reexec_with_quiet_memory(THREADS)
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    model = TinyTransformer(**SHAPE)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tmp = tempfile.mkdtemp(prefix="lockstep-bench-")
    proc, endpoint = start_collector(tmp)
    mon = lockstep.Monitor(run="torch-overhead-bench", endpoint=endpoint)
    timed = TimedAgent(mon._rec)
    # The same, computing every statistic on the training thread.
    mon_inline = lockstep.Monitor(run="torch-overhead-bench-inline", endpoint=endpoint,
                                  host_stats_thread="off")
    # The defaults without "act_in" (what each module received, issue 14): what
    # recording modules' inputs adds, measured in the same rounds.
    mon_no_in = lockstep.Monitor(run="torch-overhead-bench-no-act-in", endpoint=endpoint)
    monitors = {"lockstep": mon, "inline": mon_inline, "no_act_in": mon_no_in}

    # The default kinds but "init": initial weights are recorded once per run (at the
    # first watch()), and this bench watches again every step, which would count every
    # parameter every step. Inputs ("input") are per step and stay in.
    per_step_kinds = tuple(k for k in _watch.DEFAULT_KINDS if k != "init")

    def attacher(m_, kinds=per_step_kinds):
        def attach_lockstep(m):
            m_.watch(m, kinds=kinds)
            w = m_._watches.pop()  # the bench removes it again after the step
            return [w]
        return attach_lockstep

    attach = {"plain": lambda m: [], "floor": attach_floor, "lockstep": attacher(mon),
              "inline": attacher(mon_inline), "naive": attach_naive,
              "no_act_in": attacher(mon_no_in, tuple(k for k in per_step_kinds if k != "act_in"))}
    kinds = list(attach)
    x = torch.randn(BATCH, SEQ, SHAPE["d_in"])
    y = torch.randn(BATCH, SEQ)
    times = {k: [] for k in kinds}
    cpu_times = {k: [] for k in kinds}
    proc_times = {k: [] for k in kinds}
    cxx_times = []
    step_bytes = step_threaded_bytes = 0

    def one_step(kind):
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if kind in monitors:
            monitors[kind].step(loss=loss)
        return (time.perf_counter() - t0, time.thread_time() - c0,
                time.process_time() - p0)

    # A fresh random order each round: with a rotation, each kind would always follow
    # the same other kind (plain right after naive's thousands of small ops, say).
    rng = random.Random(0)
    lockstep_steps = 0
    for i in range(WARMUP + STEPS):
        order = list(kinds)
        rng.shuffle(order)
        for kind in order:
            handles = attach[kind](model)
            before, before_bytes = timed.seconds, timed.bytes
            before_threaded = timed.threaded_bytes
            dt, dc, dp = one_step(kind)
            for h in handles:
                h.remove()
            lockstep_steps += kind == "lockstep"
            if i >= WARMUP:
                times[kind].append(dt)
                cpu_times[kind].append(dc)
                proc_times[kind].append(dp)
                if kind == "lockstep":
                    cxx_times.append(timed.seconds - before)
                    step_bytes = timed.bytes - before_bytes
                    step_threaded_bytes = timed.threaded_bytes - before_threaded
    counters = mon.counters()
    per_step = counters["tensors_recorded"] / lockstep_steps
    mon.close(timeout=5.0)
    mon_inline.close(timeout=5.0)
    mon_no_in.close(timeout=5.0)
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)
    cxx = statistics.median(cxx_times)

    def figures(t):
        """Per round (one step of each kind, back to back) so that load drifting on a
        shared machine cancels out; medians over the rounds."""
        rounds = list(zip(*(t[k] for k in kinds)))
        col = {k: i for i, k in enumerate(kinds)}
        pl, fl, lk, nv = (col[k] for k in ("plain", "floor", "lockstep", "naive"))
        il, ni = col["inline"], col["no_act_in"]
        ratio = statistics.median(r[lk] / r[pl] for r in rounds)
        no_in = statistics.median(r[ni] / r[pl] for r in rounds)
        in_added = statistics.median(r[lk] - r[ni] for r in rounds)
        inline = statistics.median(r[il] / r[pl] for r in rounds)
        floor = statistics.median(r[fl] / r[pl] for r in rounds)
        added = statistics.median(r[lk] - r[pl] for r in rounds)
        naive = statistics.median(r[nv] - r[pl] for r in rounds)
        return ratio, floor, added, added / max(1e-12, naive), inline, no_in, in_added

    ratio, floor, ours, vs_naive, inline_ratio, no_in_ratio, in_added = figures(times)
    cpu_ratio, cpu_floor, _, cpu_vs_naive, _, _, _ = figures(cpu_times)
    proc_ratio, _, _, _, inline_proc_ratio, _, _ = figures(proc_times)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("collector: %s; steps: %d; threads: %d; OPENBLAS_NUM_THREADS=%s; host statistics "
          "thread: %s (%d of %d records; measured ratio %s); GLIBC_TUNABLES=%s; "
          "wall medians ms: %s; "
          "thread-CPU medians ms: %s; agent: sent %d dropped %d"
          % ("real" if proc else "none (no LOCKSTEP_BIN)", STEPS, THREADS,
             os.environ.get("OPENBLAS_NUM_THREADS"),
             "on" if counters.get("host_stats_thread") else "off",
             counters["tensors_threaded"], counters["tensors_recorded"],
             counters.get("host_stats_thread_ratio"),
             os.environ.get("GLIBC_TUNABLES"),
             {k: round(v * 1e3, 3) for k, v in med.items()},
             {k: round(statistics.median(v) * 1e3, 3) for k, v in cpu_times.items()},
             counters.get("records_sent", 0), counters.get("records_dropped", 0)))
    print("BENCH torch_step_ms %.3f ms" % (med["plain"] * 1e3))
    print("BENCH torch_tensors_per_step %.0f count" % per_step)
    print("BENCH torch_overhead_added_ms %.3f ms" % (ours * 1e3))
    print("BENCH torch_overhead_cxx_ms %.3f ms" % (cxx * 1e3))
    print("BENCH torch_stats_mb_per_step %.2f MB" % ((step_bytes + step_threaded_bytes) / 1e6))
    print("BENCH torch_stats_threaded_mb_per_step %.2f MB" % (step_threaded_bytes / 1e6))
    print("BENCH torch_stats_inloop_gbps %.2f GB/s" % (step_bytes / max(cxx, 1e-12) / 1e9))
    print("BENCH torch_hooks_floor_ratio_cpu %.4f ratio" % cpu_floor)
    print("BENCH torch_overhead_ratio_cpu %.4f ratio" % cpu_ratio)
    print("BENCH torch_overhead_ratio_process_cpu %.4f ratio" % proc_ratio)
    print("BENCH torch_overhead_vs_naive_cpu %.4f ratio" % cpu_vs_naive)
    print("BENCH torch_hooks_floor_ratio %.4f ratio" % floor)
    print("BENCH torch_overhead_ratio_inline %.4f ratio" % inline_ratio)
    print("BENCH torch_overhead_ratio_inline_process_cpu %.4f ratio" % inline_proc_ratio)
    print("BENCH torch_overhead_ratio_without_act_in %.4f ratio" % no_in_ratio)
    print("BENCH torch_act_in_added_ms %.3f ms" % (in_added * 1e3))
    print("BENCH torch_overhead_ratio %.4f ratio" % ratio)
    print("BENCH torch_overhead_vs_naive %.4f ratio" % vs_naive)


if __name__ == "__main__":
    main()
