"""Scale figure (issue 20): many ranks into one `lockstep collect` — a measurement, not a
unit test (scripts/bench style; not in ctest).

Runs load_lib's harness (real collector, real lockstep-loadgen processes, the same
zero-loss accounting as load.smoke) with RANKS ranks in each of two runs (baseline and
candidate: 2 x RANKS agent processes), first at the base load, then at rising step
rates until one collector no longer holds it, and prints per load:

- zero loss (load_lib.check_zero_loss) and whether the aligner compared every
  (rank, step) of the pair with nothing evicted;
- the collector's CPU (percent of one core) and CPU per rank, its peak RSS and RSS per
  rank (peak minus the RSS of an idle collector, over the agents);
- the rate it held: ranks x tensors x steps/s, and records/s in its logs;
- drain: how long after the last agent closed the collector still took to hold
  everything (a collector that keeps up drains in well under a second).

"Holds" = zero loss, every (rank, step) compared, none evicted, drain < 2 s, and the
records logged per second at least 98 % of those offered. The generators share the
machine with the collector: the sweep stops, saying so, when they fall behind their
own schedule (then the machine, not the collector, is the limit).

Environment: LOCKSTEP_BIN (the built lockstep; the loadgen beside it), SCALE_RANKS (64),
SCALE_TENSORS (100), SCALE_RATE (1, steps/s of the base load), SCALE_SECONDS (20),
SCALE_MAX_RATE (64; 0 = the base load only). Exit 1 if the base load lost anything.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load_lib  # noqa: E402

RANKS = int(os.environ.get("SCALE_RANKS", "64"))
TENSORS = int(os.environ.get("SCALE_TENSORS", "100"))
RATE = float(os.environ.get("SCALE_RATE", "1"))
SECONDS = float(os.environ.get("SCALE_SECONDS", "20"))
MAX_RATE = float(os.environ.get("SCALE_MAX_RATE", "64"))


def one(rate):
    work = tempfile.mkdtemp(prefix="lockstep-scale-")
    try:
        r = load_lib.run_load(2 * RANKS, TENSORS, rate, SECONDS, work,
                              log=lambda s: print(s, file=sys.stderr))
    finally:
        load_lib.remove_work_dir(work)
    steps = int(round(rate * SECONDS))
    agents = 2 * RANKS
    idle_rss = r["samples"][0][1] / 1024 if r["samples"] else 0.0
    compared_all = r["pair_compared_steps"] == RANKS * steps and r["pair_evicted_steps"] == 0
    keeps_up = r["records_per_s"] >= 0.98 * r["offered_records_per_s"] and r["drain_s"] < 2.0
    holds = not r["problems"] and compared_all and keeps_up
    print(f"scale: {RANKS} ranks x 2 runs x {TENSORS} tensors x {rate:g} steps/s = "
          f"{agents * TENSORS * rate:,.0f} tensor records/s offered "
          f"({r['offered_records_per_s']:,.0f} records/s with the scalars): "
          f"{'HOLDS' if holds else 'FALLS BEHIND'}; lost {r['lost_records']}, "
          f"compared {r['pair_compared_steps']} of {RANKS * steps} (rank, step)s, evicted "
          f"{r['pair_evicted_steps']}; logged {r['records_per_s']:,.0f} records/s; drain "
          f"{r['drain_s']:.2f} s; collector CPU {r['collector_cpu_pct']:.0f} % of a core "
          f"({r['collector_cpu_pct'] / agents:.2f} % per rank); RSS peak "
          f"{r['rss_peak_mib']:.1f} MiB (idle {idle_rss:.1f}; "
          f"{1024 * (r['rss_peak_mib'] - idle_rss) / agents:.0f} KiB per rank); machine busy "
          f"{r['machine_busy_pct']:.0f} %; generators' late steps {r['late_steps']}")
    for p in r["problems"][:10]:
        print(f"scale: LOSS: {p}")
    return r, holds


def main():
    base, holds = one(RATE)
    if base["problems"]:
        return 1
    rate = RATE
    last_held = RATE if holds else None
    while holds and MAX_RATE > 0 and rate * 2 <= MAX_RATE:
        rate *= 2
        r, holds = one(rate)
        if r["late_steps"] > 0.05 * 2 * RANKS * rate * SECONDS:
            print("scale: the generators fell behind their own schedule: the machine, not the "
                  "collector, is the limit here")
            break
        if holds:
            last_held = rate
    if last_held is not None:
        print(f"BENCH scale_held_tensor_records_per_s {2 * RANKS * TENSORS * last_held:.0f} "
              f"({RANKS} ranks x 2 runs x {TENSORS} tensors x {last_held:g} steps/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
