"""Soak: the collector's memory over a long synthetic load (issue 28, "weeks-long runs").
Run by `scripts/bench --soak` (not by the plain `scripts/bench`: it takes an hour).

The load is load_lib.py's (real lockstep-loadgen processes, the C++ agent library, two
runs of one experiment on a common step schedule, zero loss checked at the end), lighter
than the load bench's so that an hour of it fits a laptop's disk: SOAK_AGENTS (8) ranks,
SOAK_TENSORS (300) tensors a step, SOAK_RATE (2) steps/s, for SOAK_SECONDS (3600).

Figures (BENCH lines, last):
- collector_rss_growth_pct_per_hour: the collector's mean VmRSS over the last tenth of
  the load against its mean over the second tenth (the first holds the warm-up: buffers,
  the aligner's windows and the report recorder filling), in percent, scaled to one hour
  ("memory flat": near 0).
- soak_collector_rss_mib_first / _last: those two means, MiB.
- soak_records: records in the run logs; soak_lost_records (must be 0).
Printed beside them: RSS every ~5 minutes, and the run logs' size.
Exit status 1 when anything was lost.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load_lib  # noqa: E402

AGENTS = int(os.environ.get("SOAK_AGENTS", "8"))
TENSORS = int(os.environ.get("SOAK_TENSORS", "300"))
RATE = float(os.environ.get("SOAK_RATE", "2"))
SECONDS = float(os.environ.get("SOAK_SECONDS", "3600"))


def mean_rss(samples, t0, t1):
    xs = [s[1] for s in samples if t0 <= s[0] <= t1]
    return sum(xs) / len(xs) if xs else float("nan")


def log_bytes(work):
    total = 0
    for root, _dirs, files in os.walk(work):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files if f.endswith(".lslog"))
    return total


def main():
    work = tempfile.mkdtemp(prefix="lockstep-soak-")
    size = 0
    try:
        r = load_lib.run_load(AGENTS, TENSORS, RATE, SECONDS, work,
                              log=lambda s: print(s, file=sys.stderr))
        size = log_bytes(work)
    finally:
        load_lib.remove_work_dir(work)
    t0, samples = r["t_start"], r["samples"]
    tenth = SECONDS / 10
    first = mean_rss(samples, t0 + tenth, t0 + 2 * tenth)
    last = mean_rss(samples, t0 + SECONDS - tenth, t0 + SECONDS)
    hours = (SECONDS - 1.5 * tenth) / 3600  # between the windows' middles
    growth = 100.0 * (last - first) / first / hours if first else float("nan")
    step = max(1, len(samples) // 12)
    for t, rss, cpu in samples[::step]:
        print(f"  t={t - t0:7.0f} s  rss={rss / 1024:7.1f} MiB  cpu={cpu:7.1f} s", file=sys.stderr)
    print(f"soak: {AGENTS} agents x {TENSORS} tensors x {RATE} steps/s for {SECONDS:.0f} s; "
          f"run logs {size / 1e9:.2f} GB; collector CPU {r['collector_cpu_pct']:.0f} % of a core",
          file=sys.stderr)
    print(f"BENCH collector_rss_growth_pct_per_hour {growth:.2f} %")
    print(f"BENCH soak_collector_rss_mib_first {first / 1024:.1f} MiB")
    print(f"BENCH soak_collector_rss_mib_last {last / 1024:.1f} MiB")
    print(f"BENCH soak_records {r['records_logged']} records")
    print(f"BENCH soak_lost_records {r['lost_records']} records")
    return 1 if r["lost_records"] else 0


if __name__ == "__main__":
    sys.exit(main())
