"""load bench: 32 agent processes x 1,000 tensors x 5 steps/s for 2 minutes into one
`lockstep collect` on loopback (issue 7, "Load"). Run by scripts/bench
(LOCKSTEP_BIN=build/lockstep; the loadgen is build/lockstep-loadgen beside it).

The load and the zero-loss check are load_lib.py's (read its docstring): two runs of
one experiment (baseline, candidate) of AGENTS/2 ranks each, every rank a real
lockstep-loadgen process (the C++ agent library) stepping at RATE steps/s on a common
schedule, TENSORS tensor records + 1 scalar record per step, for SECONDS seconds.

Figures (BENCH lines, last):
- load_records_per_s: records (tensor statistics + step scalars) in the collector's run
  logs, divided by the load's duration: SECONDS, or, if the collector held the last of
  them (and every Goodbye) only later, the time from the agents' common start to then.
  With zero loss and a collector that keeps up it is the offered rate
  (32 x 1,001 x 5 = 160,160/s); a collector that lags or loses shows below it.
- collector_rss_growth_pct: mean VmRSS of the collector over the last minute of the load
  against its mean over the first minute, in percent ("memory flat": near 0). Sampled
  every second from /proc; for a shorter run the windows are each half of it.
- load_lost_records: records attempted by the agents minus records in the run logs
  (must be 0; every other loss counter is checked too, see load_lib.check_zero_loss).
- collector_cpu_pct: the collector's CPU time over the load, percent of one core.
- collector_rss_peak_mib: the highest RSS sample.
- load_drain_s: from the last agent's exit (its Close() done) to the collector holding
  everything: how far behind the collector was at the end.
- load_late_steps: agent steps that began more than half a period after their slot
  (the generators themselves fell behind: the machine, not the collector, is the limit).
Context lines (not BENCH): the machine's busy share over the load, the worst step lag.

Environment: LOAD_AGENTS (32), LOAD_TENSORS (1000), LOAD_RATE (5), LOAD_SECONDS (120),
LOAD_KEEP=1 keeps the temp data dir (it holds ~50 MB/s of run logs; it is removed
otherwise). Exit status 1 when anything was lost.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load_lib  # noqa: E402

AGENTS = int(os.environ.get("LOAD_AGENTS", "32"))
TENSORS = int(os.environ.get("LOAD_TENSORS", "1000"))
RATE = float(os.environ.get("LOAD_RATE", "5"))
SECONDS = float(os.environ.get("LOAD_SECONDS", "120"))


def main():
    work = tempfile.mkdtemp(prefix="lockstep-load-")
    try:
        r = load_lib.run_load(AGENTS, TENSORS, RATE, SECONDS, work,
                              log=lambda s: print(s, file=sys.stderr))
    finally:
        if os.environ.get("LOAD_KEEP") != "1":
            load_lib.remove_work_dir(work)
        else:
            print(f"load: kept {work}", file=sys.stderr)
    t0 = r["t_start"]
    scrapes = r["scrapes"]
    for t, rss, cpu in r["samples"][:: max(1, len(r["samples"]) // 30)]:
        near = min(scrapes, key=lambda x: abs(x[0] - t), default=None)
        feed = (f"  records/s={near[1]:8.0f}  buffered steps={near[2]:4.0f}"
                if near and abs(near[0] - t) < 0.6 else "")
        print(f"  t={t - t0:7.1f} s  rss={rss / 1024:7.1f} MiB  cpu={cpu:7.1f} s{feed}", file=sys.stderr)
    print(f"load: {r['records_logged']} of {r['records_attempted']} records in the logs in "
          f"{r['load_s']:.1f} s (offered {r['offered_records_per_s']:.0f}/s); RSS first "
          f"{r['rss_first_mib']:.1f} MiB, last {r['rss_last_mib']:.1f} MiB; machine busy "
          f"{r['machine_busy_pct']:.0f}%; {r['late_steps']} late steps, worst lag "
          f"{r['max_lag_ms']:.0f} ms; aligner compared {r['pair_compared_steps']} (rank, step)s "
          f"of {AGENTS // 2 * int(round(RATE * SECONDS))}, evicted {r['pair_evicted_steps']}",
          file=sys.stderr)
    for p in r["problems"][:20]:
        print(f"load: LOSS: {p}", file=sys.stderr)
    if r["late_steps"]:
        print(f"load: the generators fell behind their schedule ({r['late_steps']} late steps): "
              f"the machine could not offer the full load", file=sys.stderr)
    print(f"BENCH load_records_per_s {r['records_per_s']:.0f} records/s")
    print(f"BENCH collector_rss_growth_pct {r['rss_growth_pct']:.1f} %")
    print(f"BENCH load_lost_records {r['lost_records']} records")
    print(f"BENCH collector_cpu_pct {r['collector_cpu_pct']:.0f} %")
    print(f"BENCH collector_rss_peak_mib {r['rss_peak_mib']:.1f} MiB")
    print(f"BENCH load_drain_s {r['drain_s']:.2f} s")
    print(f"BENCH load_late_steps {r['late_steps']} steps")
    return 1 if r["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
