"""The collector is SIGKILLed in the middle of two real PyTorch runs (a baseline and a
candidate that diverges) and restarted on the same endpoint and data dir:

- the gap is counted exactly from sequence numbers (the live registry, `inspect
  --summary` and an independent count from the logged numbers agree, and match what
  the agents sent);
- state is rebuilt from the logs (every step compared before the crash is compared
  again by the replay, roles and pairs come back) and alignment resumes within 5 s of
  the restart;
- no alert is lost or sent twice: the alerts of the live collector across the crash
  are exactly those an offline `lockstep compare` of the same logs finds, each once,
  in the alerts file and at a real local webhook.

Timeline: identical twins until ONSET, where the candidate's encoder.layers.1.norm1
changes eps (first_divergence, tensor_drift, ... fire before the crash); the collector
is frozen at FREEZE_AT, the runs train LOST_STEPS steps into its socket buffers, it is
killed and restarted; at NAN_AT the candidate's embedding weights get a NaN (nonfinite
and nonfinite-mismatch alerts fire after the restart)."""
import json
import subprocess
import time

from fault_lib import (WebhookReceiver, identity, inspect_records, inspect_summary, metric,
                       missing_seqs, poll)
from scenario_lib import Collector, batches, fmt_alerts, free_port, make_pair

ONSET = 7
FREEZE_AT = 20
LOST_STEPS = 2
NAN_AT = 32
STEPS = 40


def compared_steps(col, exp):
    return metric(col, "lockstep_pair_compared_steps_total", default=-1.0, experiment=exp)


def test_collector_killed_mid_run_resumes_without_losing_or_repeating_alerts(tmp_path):
    exp = "restart"
    runs = [exp + "-base", exp + "-cand"]
    endpoint = "tcp://127.0.0.1:%d" % free_port()
    hook = WebhookReceiver()
    # No incidents, no rate limit and no dedup cooldown: every alert the detectors derive
    # is sent one by one, so
    # the test sees any alert derived twice (the restart's replay derives the whole
    # history again) and can compare with an offline analysis one for one. (The cooldown
    # across a restart: tests/alerting/sent_journal_test.cc.)
    flags = ["--webhook", hook.url, "--no-incidents", "--alert-rate-per-min", "0", "--alert-cooldown-s", "0",
             "--status-interval-s", "0"]
    col = Collector(tmp_path, flags, listen=endpoint, metrics=True)
    b, c = make_pair(col.endpoint, exp)
    figures = {}
    data = batches(STEPS)
    try:
        for s, (x, y) in enumerate(data):
            if s == FREEZE_AT:
                # Everything sent so far is in: the steps compared before the crash.
                poll("steps before the crash compared",
                     lambda: compared_steps(col, exp) >= FREEZE_AT - 1)
                before_crash = compared_steps(col, exp)
                alerts_before = col.alerts()
                # And delivered to the webhook (else the crash tests the spool's
                # at-least-once redelivery of a request in flight, not the replay).
                poll("alerts before the crash at the webhook",
                     lambda: {identity(a) for a in alerts_before} <=
                     {identity(a) for a in list(hook.alerts)})
                col.freeze()
            if s == FREEZE_AT + LOST_STEPS:
                col.kill()
                col = Collector(tmp_path, flags, listen=endpoint, metrics=True)
                restarted = col.started
                figures["ready_after_restart_s"] = col.ready_s
                replayed = compared_steps(col, exp)
                # The replay compared again every step compared before the crash.
                assert replayed >= before_crash, (replayed, before_crash)
            if s == ONSET:
                c.model.encoder.layers[1].norm1.eps = 1e-2
            if s == NAN_AT:
                with_nan = c.model.embed.weight.detach()
                with_nan[0, 0] = float("nan")
            b.train_step(x, y)
            c.train_step(x, y)
            if s == FREEZE_AT + LOST_STEPS:
                # The first step sent after the restart is compared: alignment resumed.
                poll("alignment after the restart", lambda: compared_steps(col, exp) > replayed,
                     timeout=10)
                figures["restart_to_alignment_s"] = time.monotonic() - restarted
        assert b.close() and c.close()
        col.wait_goodbye(runs)
        agents = {runs[0]: b.mon.counters(), runs[1]: c.mon.counters()}
        live_gaps = {r: metric(col, "lockstep_rank_missing_messages", run=r) for r in runs}
        live_compared = compared_steps(col, exp)
    finally:
        col.stop()
        hook.close()

    # --- the gap, counted exactly --------------------------------------------------
    total_missing = 0
    for r in runs:
        log = inspect_records(col.exe, col.log_path(r))
        missing = missing_seqs(log)
        total_missing += len(missing)
        summ = inspect_summary(col.exe, col.log_path(r))
        assert summ["gaps"] == len(missing) == live_gaps[r], (r, summ, len(missing), live_gaps[r])
        assert summ["messages"] + summ["gaps"] == agents[r]["messages_sent"], (r, summ, agents[r])
        assert summ["duplicates"] == 0 and summ["sessions"] == 1 and summ["goodbye"]
        if missing:  # lost with the frozen collector: one contiguous run of numbers
            assert max(missing) - min(missing) + 1 == len(missing), missing
        figures["gap_" + r] = len(missing)
    assert total_missing > 0, "the steps sent to the frozen collector should be lost with it"

    # --- alerts: each once, and the same as an offline analysis of the logs ----------
    alerts = col.alerts()
    text = fmt_alerts(alerts)
    ids = [identity(a) for a in alerts]
    dups = {i for i in ids if ids.count(i) > 1}
    assert not dups, "sent twice: %s\n%s" % (dups, text)
    keys = [(a["rule"], a["severity"], tuple(a["runs"]), a["tensor"], a["kind"]) for a in alerts]
    assert len(keys) == len(set(keys)), "an alert fired again after the restart:\n" + text
    # Alerts on both sides of the crash.
    assert any(a["rule"] == "first_divergence" and a["step"] == ONSET for a in alerts_before), \
        fmt_alerts(alerts_before)
    assert any(a["rule"] == "nonfinite" and a["step"] == NAN_AT for a in alerts), text
    # Nothing sent before the crash is missing from the file afterwards.
    assert {identity(a) for a in alerts_before} <= set(ids)

    offline_path = tmp_path / "offline.jsonl"
    res = subprocess.run([col.exe, "compare", col.log_path(runs[0]), col.log_path(runs[1]),
                          "--alerts-file", str(offline_path), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode in (0, 1), res.stderr
    report = json.loads(res.stdout)
    with open(offline_path, encoding="utf-8") as f:
        offline = [json.loads(line) for line in f if line.strip()]
    live_set = {identity(a) for a in alerts if a["rule"] != "stall"}
    offline_set = {identity(a) for a in offline if a["rule"] != "stall"}
    assert live_set == offline_set, "live only: %s\noffline only: %s" % (
        sorted(live_set - offline_set), sorted(offline_set - live_set))
    pair = report["pairs"][0] if "pairs" in report else report
    figures["steps_compared_live"] = live_compared
    figures["steps_compared_offline"] = pair.get("steps_compared")
    assert live_compared == pair.get("steps_compared"), (live_compared, pair.get("steps_compared"))

    # The webhook got every alert of the file. A repeat may only be at-least-once
    # delivery: the very same alert (id, dedup key, every field), sent again because the
    # crash came between the receiver's answer and the spool's removal of the alert.
    hooked = [identity(a) for a in hook.alerts]
    assert set(hooked) == set(ids), "file only: %s\nwebhook only: %s" % (
        sorted(set(ids) - set(hooked)), sorted(set(hooked) - set(ids)))
    repeats = {i for i in hooked if hooked.count(i) > 1}
    for i in repeats:
        copies = [json.dumps(a, sort_keys=True) for a in hook.alerts if identity(a) == i]
        assert len(set(copies)) == 1, copies
    figures["webhook_repeats"] = len(hooked) - len(set(hooked))
    assert figures["webhook_repeats"] <= 1, hook.alerts

    assert "replayed" in col.stderr()
    assert figures["restart_to_alignment_s"] < 5.0, figures
    figures["alerts"] = len(alerts)
    print("FIGURES", json.dumps(figures, sort_keys=True))
