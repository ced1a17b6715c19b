"""`lockstep zoom EXPERIMENT MODULE`: a zoom asked by hand of a running collector
(docs/python.md "Zoom", docs/design.md "The control channel").

test_zoom.py's model and candidate (a tanh-GELU in blocks.1.mlp's own code), with the
collector's own zoom off (`--zoom-steps 0`): the first divergence stays the container,
blocks.1.mlp. After a few steps the user runs `lockstep zoom` against the collector's HTTP
port; the collector asks both runs over the control channel, both zoom the same steps,
and the first divergence is refined to `blocks.1.mlp/gelu#0`, live and in `compare`.
The refined birth point is then captured and replayed as after the collector's own zoom
(test_auto_zoom.py). What the command says for an experiment the collector does not know, a module the runs
do not have (they refuse it, on the wire), and a bad --steps; and the HTTP port refuses a
POST it does not know.
"""
import json
import subprocess
import time
import urllib.error
import urllib.request

from scenario_lib import Collector, compare_json, fmt_alerts, seeded_state
from test_zoom import Net, batches, zoom_run

STEPS = 10
ASK_AFTER = 3  # steps trained before `lockstep zoom`


def zoom_cmd(col, *args):
    addr = col.metrics_url.split("//")[1].split("/")[0]
    return subprocess.run([col.exe, "zoom", "--collector", addr, *args], capture_output=True,
                          text=True, timeout=60)


def acks(col, run):
    out = subprocess.run([col.exe, "inspect", col.log_path(run)], capture_output=True, text=True,
                         timeout=60, check=True)
    msgs = [json.loads(line) for line in out.stdout.splitlines()]
    return [m["body"] for m in msgs if m["type"] == "ControlAck"]


def train_pair(tmp_path, exp, module):
    """The pair, `lockstep zoom EXP MODULE --steps 2` after ASK_AFTER steps (then waits
    until both agents took the request); returns the collector, its alerts, the zoom
    command's result and the two runs' answers."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    state = seeded_state(Net)
    with Collector(tmp_path, ["--zoom-steps", "0"], control=True, metrics=True) as col:
        kw = {"capture_dir": str(tmp_path / "captures")}  # the capture that follows the zoom
        b = zoom_run(state, monitor_kwargs=kw)(col.endpoint, exp + "-base", "baseline", exp)
        c = zoom_run(state, monitor_kwargs=kw, tanh_gelu=True)(col.endpoint, exp + "-cand",
                                                                "candidate", exp)
        res = None
        for s, batch in enumerate(batches(STEPS)):
            b.train_step(*batch)
            c.train_step(*batch)
            if s == ASK_AFTER - 1:
                time.sleep(0.3)  # both runs' last steps reach the collector
                res = zoom_cmd(col, exp, module, "--steps", "2")
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and not (
                        b.mon.counters()["requests_received"] and c.mon.counters()["requests_received"]):
                    time.sleep(0.02)
            time.sleep(0.1)
        assert b.close() and c.close()
        col.wait_goodbye([exp + "-base", exp + "-cand"])
        unknown = zoom_cmd(col, "no-such-experiment", module)
    assert col.proc.returncode == 0, col.stderr()
    return col, col.alerts(), res, unknown


def test_lockstep_zoom_refines_the_first_divergence_to_the_call(tmp_path):
    exp = "zoom-cmd"
    col, alerts, res, unknown = train_pair(tmp_path, exp, "blocks.1.mlp")
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert res.stdout.startswith("asked runs %s-base, %s-cand to zoom into blocks.1.mlp from step "
                                 % (exp, exp)), res.stdout
    at = int(res.stdout.split(" from step ")[1].split()[0])
    assert ASK_AFTER <= at <= ASK_AFTER + 3, res.stdout
    fd = [a for a in alerts if a["rule"] == "first_divergence"]
    assert [a["tensor"] for a in fd] == ["blocks.1.mlp", "blocks.1.mlp/gelu#0"], fmt_alerts(alerts)
    assert fd[0]["step"] == 0 and fd[1]["step"] == at, fmt_alerts(alerts)
    for run in (exp + "-base", exp + "-cand"):
        a = acks(col, run)  # the zoom's, then the capture's that the refined birth point asks
        assert [x["status"] for x in a[:2]] == ["Received", "Done"], a
        assert a[1]["detail"] == "zoom blocks.1.mlp steps %d..%d" % (at, at + 1), a
    offline = [a for a in compare_json(col, exp)[1]["alerts"] if a["rule"] == "first_divergence"]
    assert [(a["tensor"], a["step"]) for a in offline] == [(a["tensor"], a["step"]) for a in fd]
    # an experiment the collector never heard of: one line, exit 4
    assert unknown.returncode == 4, (unknown.stdout, unknown.stderr)
    assert unknown.stderr.strip().endswith(
        "said: no run of experiment 'no-such-experiment' has spoken to this collector"), unknown.stderr


def test_a_module_the_runs_do_not_have_is_refused_on_the_wire(tmp_path):
    exp = "zoom-cmd-bad"
    col, alerts, res, _ = train_pair(tmp_path, exp, "blocks.7.mlp")
    assert res.returncode == 0, (res.stdout, res.stderr)  # the collector asked
    for run in (exp + "-base", exp + "-cand"):
        a = acks(col, run)
        assert [x["status"] for x in a] == ["Received", "Refused"], a
        assert "blocks.7.mlp" in a[1]["detail"], a
    fd = [a for a in alerts if a["rule"] == "first_divergence"]
    assert [a["tensor"] for a in fd] == ["blocks.1.mlp"], fmt_alerts(alerts)


def test_bad_steps_and_unknown_posts(tmp_path):
    with Collector(tmp_path, control=True, metrics=True) as col:
        r = zoom_cmd(col, "x", "m", "--steps", "0")
        assert r.returncode == 2 and "--steps must be between 1 and 10000" in r.stderr, r.stderr
        r = zoom_cmd(col, "x")
        assert r.returncode == 2 and "give EXPERIMENT and MODULE" in r.stderr, r.stderr
        base = col.metrics_url.rsplit("/", 1)[0]
        for path, code in (("/nothing", 404), ("/zoom?experiment=x", 400),
                           ("/zoom?experiment=x&module=m&steps=abc", 400)):
            req = urllib.request.Request(base + path, data=b"", method="POST")
            try:
                urllib.request.urlopen(req, timeout=5)
                raise AssertionError("POST %s was accepted" % path)
            except urllib.error.HTTPError as e:
                assert e.code == code, (path, e.code, e.read())
