"""What --sample-quiet K saves and what it costs (docs/rules.md "Sampling that follows the
runs' state"): the pair of test_sample_quiet.py (scenario_lib's TinyTransformer, both runs
in one process, 0.05 s a step) through a real collector.

- Saves: twins for STEPS steps with K = 0 (every step) and K: tensor records per step
  and the run log's bytes per step (zstd blocks, as collect writes them), per run.
- Costs: a candidate whose encoder.layers.1.linear2 output is scaled from step S on
  (x 1.0005: no loss alert; x 1.01: the loss, recorded every step, moves at once): the
  step of the first alert, of the first divergence and where it is named, and the step
  from which both runs record every step again.

    cd tests/scenarios && PYTHONPATH=../../build/python LOCKSTEP_BIN=../../build/lockstep \\
      OMP_NUM_THREADS=1 /usr/bin/python3 measure_sample_quiet.py [K]
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import test_sample_quiet as tq

STEPS = 100


def summary(col, run):
    out = subprocess.run([col.exe, "inspect", "--summary", col.log_path(run)], capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def records(col, run):
    return sum(len(m["body"]["stats"]) for m in tq.log_messages(col, run) if m["type"] == "StepStats")


def main():
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    tq.K = k
    base = tempfile.mkdtemp(prefix="sample-quiet-")
    print("K = %d, %d steps, TinyTransformer (one rank)" % (k, STEPS))
    for label, kk in (("every step", 0), ("--sample-quiet %d" % k, k)):
        tq.K = kk
        tmp = pathlib.Path(base) / ("twins%d" % kk)
        tmp.mkdir()
        col, alerts, _ = tq.run_pair(tmp, "tw%d" % kk, STEPS)  # --sample-quiet 0: off
        run = "tw%d-base" % kk
        n = records(col, run)
        size = os.path.getsize(col.log_path(run))
        print("  twins, %-18s %6d records (%.1f a step), log %8d bytes (%.0f a step), alerts %d" % (
            label, n, n / STEPS, size, size / STEPS, len(alerts)))
    for factor in (1.0005, 1.01):
        for kk, start in ((0, 21), (k, 21), (k, 25), (k, 29)):
            tq.K, tq.CHANGE = kk, start
            tmp = pathlib.Path(base) / ("c%g-%d-%d" % (factor, kk, start))
            tmp.mkdir()
            col, alerts, logs = tq.run_pair(tmp, "ch", 60, prepare_cand=tq.scale_from_change(factor))
            fd = [a for a in alerts if a["rule"] == "first_divergence"]
            acks = tq.sample_acks(logs[0])
            loud = [s for s, d in acks if d.startswith("sample every 1 ")]
            first = min((a["step"] for a in alerts), default=None)
            print("  K=%-2d x%g from step %d: first alert at %s (%s), first divergence at %s (%s), every step "
                  "from %s" % (kk, factor, start, first,
                               min(alerts, key=lambda a: a["step"])["rule"] if alerts else "-",
                               fd[0]["step"] if fd else None, fd[0]["tensor"] if fd else "-",
                               loud[0] if loud else "-"))


if __name__ == "__main__":
    main()
