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
  `defaults_inline` the same, statistics on the training thread;
  `defaults-<kind>` the defaults without that kind (`defaults-act_in`): measured only
                   when LOCKSTEP_BREAKDOWN_CONFIGS names it;
  `defaults_python` `defaults` with the torch bridge off for that step (tensors read
                   through their Python attributes, the gradient hooks in Python dicts:
                   lockstep._bridge); only where a bridge is built for this torch, and
                   every other configuration then runs with it.
LOCKSTEP_BREAKDOWN_CONFIGS=defaults,defaults,param_grad (say) measures only those, a name
given twice twice (`defaults_2`): their difference is the harness's spread, and fewer
Monitors spread less. The thread is "on", not "auto": the tuner's choice must not differ
between configurations. Each round runs one step of every configuration in a fresh random order,
watch() before the step and the watch removed after it; each step is split into forward,
backward, optimizer (step and zero_grad) and Monitor.step, timed in the training
thread's CPU time. A figure is the median over rounds of the configuration's time minus
the same round's plain time, per phase, so this VM's drift between rounds cancels.

BENCH resnet18_cost_ms_<configuration>  median of (configuration - plain) training-thread
                                         CPU time a step, ms (the four phases summed
                                         before the median)
BENCH resnet18_bridge_saves_ms           median of (defaults_python - defaults), the same
                                         round's steps: what the torch bridge saves a step

Which code the added time is in (perf's samples, each step's attributed to its
configuration by time):
  LOCKSTEP_BREAKDOWN_RANGES=ranges.json perf record -k CLOCK_MONOTONIC -F 3999 -o p.data \
      python resnet_breakdown_bench.py
  perf script --no-inline -i p.data -F comm,tid,time,ip,sym,dso > p.txt
  python resnet_breakdown_bench.py --attribute ranges.json p.txt [dso|sym] [configuration]
prints samples a step per thread and shared object (or symbol) for plain and the
configuration (default `defaults`), largest difference first: means over steps (one
slow step moves them; use the default rounds, not fewer). perf's sampling slows the job,
so compare samples within one perf run only, never with another run's.
"""
import bisect
import collections
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lockstep  # noqa: E402
from lockstep import _bridge, _core, _watch  # noqa: E402
from bench_util import (collect_between_rounds, import_torchvision,  # noqa: E402
                        reexec_with_quiet_memory, resnet18_problem, start_collector)

WARMUP = 20  # rounds not measured: the first records of each name are computed inline
ROUNDS = int(os.environ.get("LOCKSTEP_BENCH_STEPS", "50"))
PHASES = ("forward", "backward", "optimizer", "Monitor.step")


def configurations():
    """name -> (kinds, host_stats_thread, torch bridge on); plain is (None, None, True)."""
    defaults = tuple(k for k in _watch.DEFAULT_KINDS if k != "init")
    out = {"plain": (None, None, True)}
    for kind in ("act", "act_in", "act_grad", "param_grad", "loss"):
        out[kind] = ((kind,), "on", True)
    out["defaults"] = (defaults, "on", True)
    out["defaults_inline"] = (defaults, "off", True)
    for kind in defaults:  # what one kind adds on top of the others
        out["defaults-" + kind] = (tuple(k for k in defaults if k != kind), "on", True)
    if _bridge.install() is not None:
        out["defaults_python"] = (defaults, "on", False)
    return chosen(out)


def chosen(configs):
    """The configurations LOCKSTEP_BREAKDOWN_CONFIGS names (comma-separated), and plain;
    all of them when it is unset. A name given twice is measured twice (the second as
    name_2, with a Monitor of its own): the two figures' difference is this harness's
    spread on this machine. Fewer Monitors also spread less (docs/python.md, "Waking the
    thread less")."""
    want = os.environ.get("LOCKSTEP_BREAKDOWN_CONFIGS", "").strip()
    if not want:
        return {k: v for k, v in configs.items() if not k.startswith("defaults-")}
    out = {"plain": configs["plain"]}
    for name in (w.strip() for w in want.split(",")):
        if name not in configs or name == "plain":
            sys.exit("resnet_breakdown_bench: LOCKSTEP_BREAKDOWN_CONFIGS names %r; give some "
                     "of: %s" % (name, ", ".join(k for k in configs if k != "plain")))
        key, n = name, 2
        while key in out:
            key, n = "%s_%d" % (name, n), n + 1
        out[key] = configs[name]
    return out


def main():
    reexec_with_quiet_memory(1)
    torchvision = import_torchvision("resnet_breakdown_bench")
    if torchvision is None:
        return 1
    model, opt, x, y = resnet18_problem(torchvision)
    ranges_file = os.environ.get("LOCKSTEP_BREAKDOWN_RANGES")
    ranges = []  # (configuration, start, end) of each measured step, CLOCK_MONOTONIC
    proc, endpoint = start_collector(tempfile.mkdtemp(prefix="lockstep-breakdown-"))
    configs = configurations()
    monitors = {name: lockstep.Monitor(run="breakdown-" + name, endpoint=endpoint,
                                       host_stats_thread=thread)
                for name, (kinds, thread, _) in configs.items() if kinds is not None}
    times = {name: [] for name in configs}  # per round: the four phases' seconds
    rng = random.Random(0)
    try:
        for i in range(WARMUP + ROUNDS):
            collect_between_rounds(i)
            order = list(configs)
            rng.shuffle(order)
            for name in order:
                mon = monitors.get(name)
                if not configs[name][2]:
                    _core.set_torch_bridge(None)  # for this step (hooks and recorder read it per call)
                if mon is not None:
                    mon.watch(model, kinds=configs[name][0])
                m0, t0 = time.monotonic(), time.thread_time()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                t1 = time.thread_time()
                loss.backward()
                t2 = time.thread_time()
                opt.step()
                opt.zero_grad()
                t3 = time.thread_time()
                if mon is not None:
                    mon.step(loss=loss)
                t4, m4 = time.thread_time(), time.monotonic()
                if mon is not None:
                    mon._watches.pop().remove()  # pylint: disable=protected-access
                if not configs[name][2]:
                    _bridge.install()
                if i >= WARMUP:
                    times[name].append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
                    ranges.append((name, m0, m4))
    finally:
        gc.enable()
        for mon in monitors.values():
            mon.close(timeout=5.0)
        if proc is not None:
            proc.terminate()
            proc.wait()

    if ranges_file:
        with open(ranges_file, "w") as f:
            json.dump(ranges, f)
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
    if "defaults_python" in times and "defaults" in times:
        # The same round's two steps against each other, without plain's noise.
        saved = [statistics.median(a[j] - b[j] for a, b in
                                   zip(times["defaults_python"], times["defaults"])) * 1e3
                 for j in range(len(PHASES))]
        total = statistics.median(sum(a) - sum(b) for a, b in
                                  zip(times["defaults_python"], times["defaults"])) * 1e3
        print("%-16s %s %+9.3f" % ("bridge saves", " ".join("%+12.3f" % v for v in saved),
                                   total))
        print("BENCH resnet18_bridge_saves_ms %.3f ms" % total)
    return 0


def attribute(ranges_path, script_path, key="dso", config="defaults"):
    """The --attribute mode: see the module doc."""
    with open(ranges_path) as f:
        ranges = sorted(json.load(f), key=lambda r: r[1])
    starts = [r[1] for r in ranges]
    steps = collections.Counter(r[0] for r in ranges)
    if steps["plain"] == 0 or steps[config] == 0:
        print("resnet_breakdown_bench: %s has no steps of plain or %s" % (ranges_path, config),
              file=sys.stderr)
        return 1
    samples = []  # (configuration, tid, thread name, code)
    with open(script_path) as f:
        for line in f:
            # `comm tid time: ip sym (dso)`; a thread's name may hold spaces
            head, sep, rest = line.partition(": ")
            parts = head.split()
            if not sep or len(parts) < 3:
                continue
            try:
                tid, stamp = int(parts[-2]), float(parts[-1])
            except ValueError:
                continue
            i = bisect.bisect_right(starts, stamp) - 1
            if i < 0 or stamp > ranges[i][2] or ranges[i][0] not in ("plain", config):
                continue
            fields = rest.strip().split(" ", 1)
            where = fields[1] if len(fields) > 1 else "?"
            sym, _, dso = where.rpartition(" (")
            dso = os.path.basename(dso.rstrip(")"))
            name = dso if key == "dso" else "%s [%s]" % (sym[:80], dso)
            samples.append((ranges[i][0], tid, " ".join(parts[:-2]), name))
    # The training thread: the one with most samples inside the steps.
    main_tid = collections.Counter(s[1] for s in samples).most_common(1)[0][0] if samples else 0
    counts = {"plain": collections.Counter(), config: collections.Counter()}
    for conf, tid, thread, name in samples:
        counts[conf][("training" if tid == main_tid else thread) + "  " + name] += 1
    rows = []
    for name in set(counts["plain"]) | set(counts[config]):
        a = counts["plain"][name] / steps["plain"]
        b = counts[config][name] / steps[config]
        rows.append((b - a, a, b, name))
    rows.sort(reverse=True)
    print("samples a step: plain %.1f, %s %.1f (%d and %d steps)" % (
        sum(counts["plain"].values()) / steps["plain"],
        config, sum(counts[config].values()) / steps[config], steps["plain"], steps[config]))
    print("%9s %9s %9s  thread  code" % ("added", "plain", config[:9]))
    for d, a, b, name in rows[:40]:
        print("%+9.2f %9.2f %9.2f  %s" % (d, a, b, name))
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--attribute":
        sys.exit(attribute(*sys.argv[2:6]))
    sys.exit(main())
