"""Identical deterministic runs (lockstep.seed_all, same weights, same data, CPU, one
thread) over 200 steps: the collector compares every step and raises no alert at all."""
import json
import subprocess

from scenario_lib import Collector, fmt_alerts, make_pair, train_pair

STEPS = 200


def test_identical_runs_raise_no_alert(tmp_path):
    with Collector(tmp_path) as col:
        b, c = make_pair(col.endpoint, "twins")
        train_pair(b, c, STEPS)
        assert b.losses == c.losses  # bit-identical runs, or the premise is wrong
        assert b.close() and c.close()
        col.wait_goodbye(["twins-base", "twins-cand"])
    assert col.proc.returncode == 0, col.stderr()
    alerts = col.alerts()
    assert alerts == [], fmt_alerts(alerts)
    # Zero alerts because every step was compared and matched, not because nothing was:
    # the offline compare over the same two logs sees all 200 steps, every tensor "ok".
    out = subprocess.run([col.exe, "compare", "--json", col.log_path("twins-base"),
                          col.log_path("twins-cand")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["steps_compared"] == STEPS, report["steps_compared"]
    assert report["steps_only_baseline"] == 0 and report["steps_only_candidate"] == 0
    assert report["unmatched"] == [] and report["first_divergence"] is None
    assert len(report["tensors"]) > 50
    # Initial weights (kind param) are recorded once, at step 0; inputs every step.
    assert report["setup"] == {"known": True, "differences": []}
    assert all(t["status"] == "ok" and t["rel_err_l2"] == 0
               and t["steps"] == (1 if t["kind"] == "param" else STEPS)
               for t in report["tensors"]), [t for t in report["tensors"] if t["status"] != "ok"]
