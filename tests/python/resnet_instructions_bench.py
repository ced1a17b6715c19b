# lockstep-bench-stack: torch2  (scripts/bench runs it with the torch 2.x stack: torchvision)
"""Instructions the agent adds to a resnet18 step, counted by valgrind's callgrind.

resnet_overhead_bench times steps, and on a shared VM a step's time moves by more than
what is being measured: two Monitors with identical settings in one process differ by
~1 ms of a ~5 ms cost, and the same configuration by up to 4 ms between runs
(docs/python.md "Where a recorded step's time is not"). An instruction count does not
move: this bench runs one process under callgrind, alternating a plain step and a
watched step (the same model and data as resnet_overhead_bench: torchvision's resnet18,
3x32x32, batch 16, SGD with momentum, one torch thread; Monitor.watch's defaults, the
statistics on the host thread), and has callgrind dump its counts at every step
boundary (the process calls sched_yield there: --dump-before and --zero-before; such a
dump holds the thread that called it, the training thread). It counts instructions, not
time: what the agent costs in cache misses or in waiting is not in it, and a step's time
is not its instruction count.

Slow: importing torch under callgrind takes minutes; the whole bench ~20 minutes on the
2-core build VM. Needs valgrind (scripts/setup installs it); without it, one line and no
figures. A failed run leaves callgrind's files in the folder it names.

BENCH resnet18_instructions_ratio        median over rounds of watched / plain step,
                                         training thread's instructions
BENCH resnet18_agent_instructions_per_record  median of (watched - plain) per record
BENCH resnet18_agent_instructions_per_record_besides_kernel  the same less the statistics
                                         kernel's instructions on the training thread
                                         (the tensors computed inline), per record: the
                                         hooks, the recorder, torch's and CPython's work
                                         for them (callgrind_annotate --inclusive)
BENCH resnet18_plain_instructions_per_step  plain step, training thread, millions
"""
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

WARMUP = 3   # steps of each before counting: the first records of each name are inline
ROUNDS = int(os.environ.get("LOCKSTEP_BENCH_STEPS", "4"))


def child(out_dir):
    """Runs under callgrind: the steps, a sched_yield at each boundary."""
    import copy  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import lockstep  # pylint: disable=import-outside-toplevel
    from bench_util import (NO_COLLECTOR, import_torchvision,  # pylint: disable=import-outside-toplevel
                            resnet18_problem, sgd, train_step)
    torchvision = import_torchvision("resnet_instructions_bench")
    if torchvision is None:
        return 1
    plain, opt, x, y = resnet18_problem(torchvision)
    watched = copy.deepcopy(plain)
    opts = {id(plain): opt, id(watched): sgd(watched)}
    mon = lockstep.Monitor(run="instructions", endpoint=NO_COLLECTOR, host_stats_thread="on")
    mon.watch(watched)

    def step(model, monitor):
        train_step(model, opts[id(model)], x, y, monitor)

    for _ in range(WARMUP):
        step(plain, None)
        step(watched, mon)
    records0 = mon.counters().get("tensors_recorded", 0)
    os.sched_yield()  # dump 1: everything before the rounds
    for _ in range(ROUNDS):
        step(plain, None)
        os.sched_yield()  # dump 2 + 2r: plain
        step(watched, mon)
        os.sched_yield()  # dump 3 + 2r: watched
    records = (mon.counters().get("tensors_recorded", 0) - records0) / ROUNDS
    mon.close(timeout=5.0)
    with open(os.path.join(out_dir, "child.json"), "w") as f:
        json.dump({"records_per_step": records}, f)
    return 0


def count(path):
    """The instructions (Ir) of one callgrind dump, or None."""
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("summary:"):
                return int(line.split()[1])
    return None


# A function's own summary line in `callgrind_annotate --inclusive=yes` (not a call site).
KERNEL_LINE = re.compile(r"^\s*([\d,]+) \([^)]*\)\s+[^=\s].*lockstep::ComputeHostStats(Strided)?\(")


def kernel_instructions(path):
    """Instructions inside the statistics kernel's entry points in one dump (inclusive);
    None when callgrind_annotate is missing or fails."""
    annotate = shutil.which("callgrind_annotate")
    if annotate is None:
        return None
    r = subprocess.run([annotate, "--inclusive=yes", "--auto=no", "--threshold=100", path],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                       check=False)
    if r.returncode != 0:
        return None
    # A function may be listed twice, under its absolute and its relative file name.
    found = {}
    for m in map(KERNEL_LINE.match, r.stdout.splitlines()):
        if m:
            found[m.group(2) or ""] = max(found.get(m.group(2) or "", 0),
                                          int(m.group(1).replace(",", "")))
    return sum(found.values())


def parent():
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("resnet_instructions_bench: valgrind is not installed (bash scripts/setup "
              "installs it); no figures", file=sys.stderr)
        return 0
    out_dir = tempfile.mkdtemp(prefix="lockstep-instructions-")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_util import TUNABLES  # pylint: disable=import-outside-toplevel
    env = dict(os.environ)
    # As torch_overhead_bench: no mmap/trim churn in the allocator, OpenBLAS on one thread.
    env.setdefault("GLIBC_TUNABLES", TUNABLES)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    cmd = [valgrind, "--tool=callgrind", "--dump-before=sched_yield",
           "--zero-before=sched_yield", "--separate-threads=yes",
           "--callgrind-out-file=" + os.path.join(out_dir, "cg.%p"),
           sys.executable, os.path.abspath(__file__), "--child", out_dir]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)
    if proc.returncode != 0 or not os.path.exists(os.path.join(out_dir, "child.json")):
        print(proc.stdout[-3000:], file=sys.stderr)
        print("resnet_instructions_bench: the run under callgrind failed (exit %d); its "
              "files are in %s" % (proc.returncode, out_dir), file=sys.stderr)
        return 1
    with open(os.path.join(out_dir, "child.json")) as f:
        records = json.load(f)["records_per_step"]
    # Files cg.<pid>.<dump>-<thread>: dump 1 is the prefix, then plain and watched
    # steps alternate; thread 01 is the training (main) thread, the one that dumps.
    train, paths = {}, {}
    for path in glob.glob(os.path.join(out_dir, "cg.*.*-01")):
        m = re.search(r"\.(\d+)-01$", path)
        ir = count(path) if m is not None else None
        if ir is not None:
            train[int(m.group(1))] = ir
            paths[int(m.group(1))] = path
    plain = [train[2 + 2 * r] for r in range(ROUNDS) if 2 + 2 * r in train]
    watched = [train[3 + 2 * r] for r in range(ROUNDS) if 3 + 2 * r in train]
    if len(plain) != ROUNDS or len(watched) != ROUNDS:
        print("resnet_instructions_bench: expected %d dumps of each step in %s, found %d "
              "plain and %d watched" % (ROUNDS, out_dir, len(plain), len(watched)),
              file=sys.stderr)
        return 1
    print("training thread, instructions a step: plain %s; watched %s; records a step %.0f"
          % (plain, watched, records))
    ratios = [w / p for p, w in zip(plain, watched)]
    per_record = [(w - p) / records for p, w in zip(plain, watched)] if records else [0]
    print("BENCH resnet18_instructions_ratio %.4f ratio" % statistics.median(ratios))
    print("BENCH resnet18_agent_instructions_per_record %.0f instructions"
          % statistics.median(per_record))
    kernel = [kernel_instructions(paths[3 + 2 * r]) for r in range(ROUNDS)]
    if records and None not in kernel:
        print("BENCH resnet18_agent_instructions_per_record_besides_kernel %.0f instructions"
              % statistics.median((w - p - k) / records
                                  for p, w, k in zip(plain, watched, kernel)))
    print("BENCH resnet18_plain_instructions_per_step %.1f M" % (statistics.median(plain) / 1e6))
    shutil.rmtree(out_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2]))
    sys.exit(parent())
