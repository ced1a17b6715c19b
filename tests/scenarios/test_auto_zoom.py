"""The control channel: the collector zooms and captures by itself (docs/design.md "The
control channel", docs/rules.md "Zoomed: the call", docs/python.md "Capture and replay").

The same model as test_zoom.py (attention and MLP written as functional calls in their
own forward), but nobody calls Monitor.zoom: the candidate's blocks.1.mlp computes a
tanh-GELU in its own code, the first divergence is "born in blocks.1.mlp's own code"
at step 0, and the collector asks both runs, over its control socket, to zoom into
blocks.1.mlp a few steps ahead. Both agents take the request, answer it on the wire
(ControlAck: received, then done with the steps), zoom the same steps, and the first
divergence is refined to the call, `blocks.1.mlp/gelu#0`, live and in `compare`. Then
the collector asks both runs to capture that call at the same step; both answer with
their file, a "capture" alert lists the two files, and `python -m lockstep replay` on
them says the runs compute different functions (cause config). Each agent also replays
its own capture on its writer thread and answers again with what it found; from the two
answers the collector gives the same verdict, live (a "replay" alert) and in `compare`.
A kernel that rounds through fp16 (test_capture_replay.py's model) is the candidate's
less accurate op, cause platform, live and in compare; a rounding-sized change whose
inputs have moved by the captured step is within rounding in each run, which one run
alone cannot tell from an error its inputs bring: the verdict needs both files.

When every call both runs make agrees, the calls only one run makes are named (the
demo's fp16 cast in a block's own code). Twins: nothing is asked of anybody. `--control-listen off`: no zoom, the container stays
the answer.
"""
import json
import os
import subprocess
import sys
import time

import torch

from scenario_lib import Collector, DRIFT_RULES, fmt_alerts, seeded_state
from test_zoom import Net, batches, zoom_run

STEPS = 14


def acks(col, run):
    out = subprocess.run([col.exe, "inspect", col.log_path(run)], capture_output=True, text=True,
                         timeout=60, check=True)
    msgs = [json.loads(line) for line in out.stdout.splitlines()]
    return [m["body"] for m in msgs if m["type"] == "ControlAck"]


def zoomed_steps(col, run):
    out = subprocess.run([col.exe, "inspect", col.log_path(run)], capture_output=True, text=True,
                         timeout=60, check=True)
    steps = set()
    for line in out.stdout.splitlines():
        msg = json.loads(line)
        if msg["type"] == "StepStats" and any("/" in (s.get("name") or "") for s in msg["body"]["stats"]):
            steps.add(msg["body"]["step"])
    return steps


def cast_run(state, monitor_kwargs):
    """The candidate of the demo's kind: blocks.1.mlp's own code rounds its output through
    fp16 (two calls the baseline does not make: to#0, to#1)."""
    def make(endpoint, run, role, experiment):
        r = zoom_run(state, monitor_kwargs=monitor_kwargs)(endpoint, run, role, experiment)
        mlp = r.model.blocks[1].mlp
        inner = type(mlp).forward

        def forward(x):
            return inner(mlp, x).to(torch.float16).to(torch.float32)
        mlp.forward = forward
        return r
    return make


def run_pair(tmp_path, exp, extra_args=(), cast=False, **change1):
    """Trains the pair for STEPS steps, 0.1 s apart (time for a request's round trip);
    after step 0 waits (up to 20 s) until both agents took a request, or 3 s when none
    should come (twins). Captures go to tmp_path/captures."""
    state = seeded_state(Net)
    kw = {"capture_dir": str(tmp_path / "captures")}
    make_c = cast_run(state, kw) if cast else zoom_run(state, monitor_kwargs=kw, **change1)
    return run_live(tmp_path, exp, zoom_run(state, monitor_kwargs=kw), make_c, batches(STEPS),
                    extra_args, asked=bool(change1 or cast))


def run_live(tmp_path, exp, make_b, make_c, batches_, extra_args=(), asked=True):
    """run_pair's loop for any pair of runs (test_capture_replay.py's models too). The
    collector's /metrics at the end: col.scrape."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    with Collector(tmp_path, list(extra_args), control="--control-listen" not in extra_args,
                   metrics=True) as col:
        b = make_b(col.endpoint, exp + "-base", "baseline", exp)
        c = make_c(col.endpoint, exp + "-cand", "candidate", exp)
        for s, batch in enumerate(batches_):
            b.train_step(*batch)
            c.train_step(*batch)
            if s == 0:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and not (
                        b.mon.counters()["requests_received"] and c.mon.counters()["requests_received"]):
                    if not asked and time.monotonic() > deadline - 17:
                        break  # twins: 3 s is plenty for a request that should not come
                    time.sleep(0.02)
            time.sleep(0.1)
        counters = (b.mon.counters(), c.mon.counters())
        assert b.close() and c.close()
        col.wait_goodbye([exp + "-base", exp + "-cand"])
        col.scrape = col.metrics_text()
    assert col.proc.returncode == 0, col.stderr()
    return col, col.alerts(), counters


def replay_alert(alerts):
    """The one "replay" alert: the verdict from both runs' own replays."""
    rep = [a for a in alerts if a["rule"] == "replay"]
    assert len(rep) == 1, fmt_alerts(alerts)
    return rep[0]


def same_offline(col, exp, live):
    """compare --json of the pair's logs rebuilds the live replay alert and verdict."""
    out = subprocess.run([col.exe, "compare", "--json", col.log_path(exp + "-base"),
                          col.log_path(exp + "-cand")], capture_output=True, text=True, timeout=60)
    rep = json.loads(out.stdout)
    offline = replay_alert(rep["alerts"])
    keys = ("rule", "severity", "metric", "tensor", "step", "message", "runs",
            "baseline_value", "candidate_value", "threshold")
    assert {k: offline[k] for k in keys} == {k: live[k] for k in keys}, (offline, live)
    assert offline.get("cause") == live.get("cause"), (offline, live)
    # the same id but for the experiment, which compare labels "compare"
    assert offline["id"] == live["id"].replace("/" + exp + "/", "/compare/", 1), (offline, live)
    assert [r["verdict"] for r in rep["replays"]] == [live["metric"]], rep["replays"]
    return rep


def test_the_collector_zooms_into_the_container_and_names_the_call(tmp_path):
    exp = "auto-zoom"
    col, alerts, counters = run_pair(tmp_path, exp, tanh_gelu=True)
    assert all(k["requests_received"] == 2 for k in counters), counters  # zoom, capture
    assert ("the error is born in blocks.1.mlp's own code: asked runs auto-zoom-base and "
            "auto-zoom-cand to zoom into it") in col.stderr()
    fd = [a for a in alerts if a["rule"] == "first_divergence"]
    assert [a["tensor"] for a in fd] == ["blocks.1.mlp", "blocks.1.mlp/gelu#0"], fmt_alerts(alerts)
    assert fd[1]["message"].startswith("zoomed into blocks.1.mlp: "), fd[1]["message"]
    # Both runs answered on the wire, and zoomed the same two steps.
    for run in (exp + "-base", exp + "-cand"):
        a = acks(col, run)
        assert [x["status"] for x in a] == ["Received", "Done", "Received", "Done", "Done"], a
        first = a[1]["step"]
        assert a[1]["detail"] == "zoom blocks.1.mlp steps %d..%d" % (first, first + 1), a
        assert a[3]["detail"].startswith("capture blocks.1.mlp/gelu#0 at step "), a
        assert first + 1 < a[3]["step"] in zoomed_steps(col, run), a  # the capture zooms its step
        # The second "done": the capture replayed on the job's writer thread, against
        # float64 of its own settings: within a few ULPs of fp32.
        assert a[4]["detail"] == a[3]["detail"] and "replay" not in a[3], a
        own = a[4]["replay"]
        assert own["row"] == "blocks.1.mlp/gelu#0" and own["error"] == "", own
        assert own["dtype"] == "float32" and own["ulps"] < 8 and own["file"] in a[3]["detail"], own
    assert fd[1]["step"] == first
    assert all(k["self_replays"] == 1 and k["self_replays_failed"] == 0 for k in counters), counters
    # /metrics: 4 requests (zoom, capture; each run), each received, done, and the
    # captures done again with their replays.
    for line in ("lockstep_collector_control_requests_total 4",
                 'lockstep_collector_control_answers_total{status="received"} 4',
                 'lockstep_collector_control_answers_total{status="done"} 6',
                 'lockstep_collector_control_answers_total{status="refused"} 0',
                 "lockstep_collector_control_replays_total 2"):
        assert "\n" + line + "\n" in col.scrape, (line, col.scrape)
    # The capture: one alert naming both files, which replay reads to a verdict.
    cap = [a for a in alerts if a["rule"] == "capture"]
    assert len(cap) == 1 and cap[0]["severity"] == "info", fmt_alerts(alerts)
    files = cap[0]["message"].split("python -m lockstep replay ")[1].split()
    assert len(files) == 2 and all(os.path.isfile(f) for f in files), cap[0]["message"]
    assert files[0].startswith(str(tmp_path / "captures")), files
    out = subprocess.run([sys.executable, "-m", "lockstep", "replay", "--json", *files],
                         capture_output=True, text=True, timeout=120)
    verdict = json.loads(out.stdout)
    assert verdict["verdict"] == "different_functions" and verdict["cause"] == "config", out.stdout
    # The same verdict live, from the two runs' own replays, in the alerts file.
    live = replay_alert(alerts)
    assert (live["metric"], live["cause"], live["tensor"]) == \
        ("different_functions", "config", "blocks.1.mlp/gelu#0"), live
    assert "approximate: 'none' (baseline) vs 'tanh' (candidate)" in live["message"], live["message"]
    same_offline(col, exp, live)
    # ... and in the HTML report, among its alerts.
    html = tmp_path / "report.html"
    subprocess.run([col.exe, "report", col.log_path(exp + "-base"), col.log_path(exp + "-cand"),
                    "-o", str(html)], capture_output=True, timeout=60, check=True)
    assert "on each run's host: different_functions (cause config)" in html.read_text(), html
    # compare reads the same logs to the same refined verdict.
    out = subprocess.run([col.exe, "compare", "--json", col.log_path(exp + "-base"),
                          col.log_path(exp + "-cand")], capture_output=True, text=True, timeout=60)
    rep = json.loads(out.stdout)
    offline = [(a["tensor"], a["step"]) for a in rep["alerts"] if a["rule"] == "first_divergence"]
    assert offline == [(a["tensor"], a["step"]) for a in fd], (offline, fmt_alerts(alerts))


def test_calls_only_one_run_makes_are_named_when_the_others_agree(tmp_path):
    """The demo's case: the candidate rounds blocks.1.mlp's output through fp16 in its own
    code. Zoomed, every call both runs make agrees; the candidate alone calls to#0 (fp16)
    and to#1: that is where the error is born, cause precision, live and in compare. No
    capture: the baseline has no such call to capture."""
    exp = "auto-zoom-cast"
    col, alerts, counters = run_pair(tmp_path, exp, cast=True)
    fd = [a for a in alerts if a["rule"] == "first_divergence"]
    assert [a["tensor"] for a in fd] == ["blocks.1.mlp", "blocks.1.mlp/to#0"], fmt_alerts(alerts)
    assert fd[1]["cause"] == "precision", fd[1]
    assert ("auto-zoom-cast-cand alone makes blocks.1.mlp/to#0 (fp16), blocks.1.mlp/to#1 (fp32)"
            in fd[1]["message"]), fd[1]["message"]
    assert not [a for a in alerts if a["rule"] == "capture"], fmt_alerts(alerts)
    assert all(k["requests_received"] == 1 for k in counters), counters
    out = subprocess.run([col.exe, "compare", "--json", col.log_path(exp + "-base"),
                          col.log_path(exp + "-cand")], capture_output=True, text=True, timeout=60)
    rep = json.loads(out.stdout)
    assert (rep["first_divergence"]["tensor"], rep["first_divergence"]["step"]) == \
        (fd[1]["tensor"], fd[1]["step"]), rep["first_divergence"]


def test_a_recorded_baseline_is_not_asked_and_its_candidate_neither(tmp_path):
    """Against a recorded baseline (--baseline LOG) only the candidate could zoom, and
    nothing would pair: the collector asks nobody."""
    state = seeded_state(Net)
    (tmp_path / "rec").mkdir()
    with Collector(tmp_path / "rec") as rec:
        b = zoom_run(state)(rec.endpoint, "rec-base", "baseline", "rec")
        for batch in batches(STEPS):
            b.train_step(*batch)
        assert b.close()
        rec.wait_goodbye(["rec-base"])
    (tmp_path / "live").mkdir()
    with Collector(tmp_path / "live", ["--baseline", rec.log_path("rec-base")], control=True) as col:
        c = zoom_run(state, tanh_gelu=True)(col.endpoint, "rec-cand", "candidate", "rec")
        for batch in batches(STEPS):
            c.train_step(*batch)
            time.sleep(0.05)
        counters = c.mon.counters()
        assert c.close()
        col.wait_goodbye(["rec-cand"])
    fd = [a["tensor"] for a in col.alerts() if a["rule"] == "first_divergence"]
    assert fd == ["blocks.1.mlp"], fmt_alerts(col.alerts())
    assert counters["requests_received"] == 0, counters
    assert "to zoom into" not in col.stderr() and "to capture" not in col.stderr()


def test_twins_are_asked_nothing(tmp_path):
    col, alerts, counters = run_pair(tmp_path, "auto-zoom-twins")
    assert not [a for a in alerts if a["rule"] in DRIFT_RULES], fmt_alerts(alerts)
    assert all(k["requests_received"] == 0 for k in counters), counters
    assert "to zoom into" not in col.stderr() and "to capture" not in col.stderr()
    assert not acks(col, "auto-zoom-twins-cand")
    assert not [a for a in alerts if a["rule"] in ("capture", "replay")], fmt_alerts(alerts)
    assert all(k["self_replays"] == 0 for k in counters), counters


def test_a_kernel_rounding_through_fp16_is_the_candidates_less_accurate_op_live(tmp_path):
    """test_capture_replay.py's model: the candidate's blocks.1.mlp.act (a GELU module)
    hands on its output rounded through fp16. The collector names it, asks both runs to
    capture it, and from their own replays says the candidate's op is less accurate,
    cause platform (nothing in its settings says why), naming its file."""
    import test_capture_replay as cr  # pylint: disable=import-outside-toplevel
    exp = "auto-kernel"
    state = seeded_state(cr.Net)
    cap = tmp_path / "captures"
    col, alerts, counters = run_live(tmp_path, exp, cr.run_factory(state, cap),
                                     cr.run_factory(state, cap, act_fp16=True), cr.batches(STEPS))
    live = replay_alert(alerts)
    assert live["tensor"] == "blocks.1.mlp.act", fmt_alerts(alerts)
    assert (live["metric"], live["cause"]) == ("less_accurate", "platform"), live
    cand_file = [f for f in counters[1]["capture_files"]]
    assert len(cand_file) == 1 and "report it with " + cand_file[0] in live["message"], live["message"]
    assert live["candidate_value"] > live["threshold"] >= live["baseline_value"], live
    rep = same_offline(col, exp, live)
    assert rep["replays"][0]["less_accurate"] == "candidate", rep["replays"]


def test_without_a_control_channel_the_container_stays_the_answer(tmp_path):
    col, alerts, counters = run_pair(tmp_path, "auto-zoom-off", ["--control-listen", "off"],
                                     tanh_gelu=True)
    assert all(k["requests_received"] == 0 for k in counters), counters
    fd = [a["tensor"] for a in alerts if a["rule"] == "first_divergence"]
    assert fd == ["blocks.1.mlp"], fmt_alerts(alerts)


def test_a_rounding_sized_change_live_needs_both_files_when_the_inputs_moved(tmp_path):
    """test_capture_replay.py's rounding-sized change (blocks.1.mlp.act's output times
    1 + 2e-7) with a budget tight enough to name it: by the step both runs capture, the
    change has moved the weights, so the op's inputs differ. Each run alone is within
    rounding of float64; whether the op or its inputs make the difference only both
    files can say: the live verdict says so and keeps the command, and compare agrees."""
    import test_capture_replay as cr  # pylint: disable=import-outside-toplevel
    exp = "auto-round"
    state = seeded_state(cr.Net)
    cap = tmp_path / "captures"
    col, alerts, _ = run_live(tmp_path, exp, cr.run_factory(state, cap),
                              cr.run_factory(state, cap, scale_act=True), cr.batches(STEPS),
                              ["--birth-ulps", "0.5"])
    live = replay_alert(alerts)
    assert (live["tensor"], live["metric"], live.get("cause")) == \
        ("blocks.1.mlp.act", "needs_both_files", None), live
    assert live["candidate_value"] <= live["threshold"] and live["baseline_value"] <= live["threshold"]
    assert "its inputs differ" in live["message"], live["message"]
    files = live["message"].split("python -m lockstep replay ")[1].split()
    assert len(files) == 2 and all(os.path.isfile(f) for f in files), live["message"]
    same_offline(col, exp, live)
