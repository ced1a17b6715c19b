"""Mistakes in naming runs, against a real `lockstep collect`:
- a second agent claiming a live run id with another role is refused with one clear
  line (roles by name), and its data stays out of that run's log;
- a candidate whose experiment has no baseline (a typo) is logged and shown by
  `lockstep top` together with the experiments that do have a baseline;
- two live processes claiming one (run, rank) with the same role (a Monitor made before
  init_process_group on an older agent, a copied run id) are a `duplicate_rank` finding:
  one warning naming both, the second one's data not compared, and `compare` fails."""
import json
import os
import re
import subprocess
import time

import lockstep
from conftest import lockstep_bin, start_collector, stop_collector


def poll(fn, what, timeout=15.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError("timed out waiting for %s; last: %r" % (what, last))


def test_second_process_with_another_role_is_refused_and_kept_out(tmp_path):
    col, _ = start_collector(tmp_path)
    log = tmp_path / "collector.log"
    try:
        first = lockstep.Monitor(run="dup", role="baseline", experiment="e", endpoint=col.endpoint, strict=True)
        for _ in range(3):
            first.step(loss=1.0)
        # The first run's Hello is in (its log exists) before the second claims the id.
        poll(lambda: os.path.exists(col.log_path("dup")), "the first run's log")
        second = lockstep.Monitor(run="dup", role="candidate", experiment="e", endpoint=col.endpoint,
                                  strict=True)
        for _ in range(5):
            second.step(loss=2.0)
            first.step(loss=1.0)
        text = poll(lambda: (lambda t: t if "refused run 'dup'" in t else None)(log.read_text()),
                    "the refusal in the collector's log")
        assert second.close(timeout=5.0) and first.close(timeout=5.0)
    finally:
        stop_collector(col)
    line = next(l for l in text.splitlines() if "refused run 'dup'" in l)
    assert "(candidate, host" in line and "live as baseline" in line, line
    assert "own run id" in line, line
    assert text.count("refused run 'dup'") == 1, text  # once, not per message
    out = subprocess.run([lockstep_bin(), "inspect", col.log_path("dup")], capture_output=True, text=True,
                         timeout=30)
    records = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
    hellos = [r for r in records if r["type"] == "Hello"]
    assert hellos and all(h["body"]["role"] == "baseline" for h in hellos), hellos
    assert len({h["session"] for h in hellos}) == 1, hellos  # one agent session only
    losses = [r["body"]["loss"] for r in records if r["type"] == "StepScalars"]
    assert losses and all(x == 1.0 for x in losses), losses  # none of the second job's 2.0


def test_two_live_processes_on_one_rank_are_a_finding(tmp_path):
    col, _ = start_collector(tmp_path)
    log = tmp_path / "collector.log"
    try:
        kw = dict(experiment="e", endpoint=col.endpoint, strict=True, rank=0, world_size=1)
        base = lockstep.Monitor(run="b", role="baseline", **kw)
        first = lockstep.Monitor(run="c", role="candidate", **kw)
        for _ in range(3):
            base.step(loss=1.0)
            first.step(loss=1.0)
        second = lockstep.Monitor(run="c", role="candidate", **kw)  # the same (run, rank)
        second.step(loss=5.0)
        poll(lambda: len({r["session"] for r in col.inspect("c", deadline_s=0.2) if r["type"] == "Hello"}) == 2,
             "the second process's Hello")
        for _ in range(3):
            first.step(loss=1.0)  # heard again: both are live
            second.step(loss=5.0)
            base.step(loss=1.0)
        text = poll(lambda: (lambda t: t if "two live processes claim" in t else None)(log.read_text()),
                    "the duplicate warning in the collector's log")
        assert first.close(timeout=5.0) and second.close(timeout=5.0) and base.close(timeout=5.0)
    finally:
        stop_collector(col)
    line = next(l for l in text.splitlines() if "two live processes claim" in l)
    assert "run c rank 0" in line and line.count("pid %d" % os.getpid()) == 2, line
    assert text.count("two live processes claim") == 1, text
    out = subprocess.run([lockstep_bin(), "compare", col.log_path("b"), col.log_path("c")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0, out.stdout + out.stderr
    assert "duplicate_rank" in out.stdout + out.stderr, out.stdout + out.stderr


def test_unpaired_candidate_is_logged_and_shown_with_the_known_experiments(tmp_path):
    col, info = start_collector(tmp_path, "--view-listen", "tcp://127.0.0.1:*")
    log = tmp_path / "collector.log"
    try:
        base = lockstep.Monitor(run="gpt-base", role="baseline", experiment="gpt", endpoint=col.endpoint,
                                strict=True)
        base.step(loss=1.0)
        poll(lambda: "gpt-base" in subprocess.run(
            [lockstep_bin(), "top", "--once", "--connect", info["view"]], capture_output=True, text=True,
            timeout=30).stdout, "the baseline in the view")
        cand = lockstep.Monitor(run="gpt-cand", role="candidate", experiment="gtp", endpoint=col.endpoint,
                                strict=True)
        cand.step(loss=1.0)
        text = poll(lambda: (lambda t: t if "gpt-cand of experiment 'gtp' is not paired" in t else None)(
            log.read_text()), "the unpaired warning")
        line = next(l for l in text.splitlines() if "gpt-cand of experiment 'gtp'" in l)
        assert "'gpt' (gpt-base)" in line, line

        def shown():
            out = subprocess.run([lockstep_bin(), "top", "--once", "--width", "80", "--connect", info["view"]],
                                 capture_output=True, text=True, timeout=30).stdout
            assert all(len(l) <= 80 for l in out.splitlines()), out
            flat = " ".join(out.split())  # the note wraps at 80 columns
            return flat if re.search(r"candidate gpt-cand is not paired: no baseline of experiment 'gtp'", flat) \
                else None
        flat = poll(shown, "the unpaired candidate in top")
        assert "baselines: 'gpt' (gpt-base)" in flat, flat
        base.close(timeout=5.0)
        cand.close(timeout=5.0)
    finally:
        stop_collector(col)
