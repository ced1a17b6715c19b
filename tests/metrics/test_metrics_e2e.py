"""/metrics of a live `lockstep collect` fed by two lockstep-loadgen runs (a baseline
and a drifting candidate): the exposition format checked strictly (expfmt.py), the
figures checked against what the agents sent, then the real Prometheus from Debian
scraping it (skipped with a message when the binary is absent).

Binaries come from LOCKSTEP_BIN / LOCKSTEP_LOADGEN (set by ctest)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

import expfmt

LOCKSTEP = os.environ.get("LOCKSTEP_BIN", "lockstep")
LOADGEN = os.environ.get("LOCKSTEP_LOADGEN", "lockstep-loadgen")
# Quote, backslash and comma: exercises label escaping end to end.
EXPERIMENT = 'mig "a\\b",c'
STEPS, TENSORS = 40, 16


def http_get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def poll(what, fn, timeout=20):
    """fn() until it returns something truthy; never a fixed sleep for a thread."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics")
    ready = tmp / "ready.json"
    proc = subprocess.Popen(
        [LOCKSTEP, "collect", "--listen", "tcp://127.0.0.1:*", "--view-listen", "tcp://127.0.0.1:*",
         "--metrics-listen", "127.0.0.1:0", "--data-dir", str(tmp / "data"), "--ready-file", str(ready),
         "--status-interval-s", "0", "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        poll("the collector's ready file", lambda: ready.exists() or proc.poll() is not None)
        assert proc.poll() is None, proc.stderr.read()
        info = json.loads(ready.read_text())
        runs = {}
        gens = []
        for run, role, extra in (("base-0", "baseline", []), ("cand-0", "candidate", ["--drift-after", "10"])):
            gens.append((run, subprocess.Popen(
                [LOADGEN, "--endpoint", info["listen"][0], "--run", run, "--experiment", EXPERIMENT,
                 "--role", role, "--tensors", str(TENSORS), "--steps", str(STEPS), "--steps-per-s", "400",
                 "--heartbeat-ms", "50", *extra],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        for run, g in gens:
            out, err = g.communicate(timeout=60)
            assert g.returncode == 0, err
            runs[run] = json.loads(out.strip().splitlines()[-1])
        yield {"url": f"http://{info['metrics']}", "address": info["metrics"], "runs": runs, "tmp": tmp}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=20) == 0, proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()


def records(loadgen_counters):
    """Records the collector counts for one loadgen run: its tensor statistics (the
    agent's records_sent) plus one step-scalar record per step."""
    return loadgen_counters["records_sent"] + STEPS


def scrape(live):
    status, ctype, body = http_get(live["url"] + "/metrics")
    assert status == 200
    assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    return expfmt.parse(body)


def test_checker_refuses_what_prometheus_would():
    good = '# HELP a_total x\n# TYPE a_total counter\na_total{l="q\\"\\\\\\n"} 1\n'
    assert expfmt.value(expfmt.parse(good), "a_total", l='q"\\\n') == 1
    bad = [
        "a_total 1\n",                                                  # no HELP/TYPE
        "# HELP a x\n# TYPE a counter\na 1\n",                          # counter without _total
        "# HELP a x\n# TYPE a gauge\na{l=\"\\t\"} 1\n",                  # bad escape
        "# HELP a x\n# TYPE a gauge\n# HELP a x\n# TYPE a gauge\n",     # twice
        "# HELP a x\n# TYPE a gauge\na{l=\"1\",l=\"2\"} 1\n",             # label twice
        "# HELP a x\n# TYPE a gauge\na{1l=\"1\"} 1\n",                    # bad label name
        "# HELP a x\n# TYPE a gauge\na 1\na 2\n",                       # duplicate series
        "# HELP a x\n# TYPE a gauge\nb 1\n",                            # sample outside its family
        "# HELP a x\n# TYPE a gauge\na nan\n",                          # spelling of NaN
        "# HELP a x\n# TYPE a gauge\na 1",                              # no final newline
    ]
    for text in bad:
        with pytest.raises(expfmt.FormatError):
            expfmt.parse(text)


def test_exposition_is_strict_and_figures_match_the_agents(live):
    runs = live["runs"]

    def settled():
        f = scrape(live)
        done = all(expfmt.value(f, "lockstep_rank_records_total", run=r) == records(runs[r]) and
                   expfmt.value(f, "lockstep_rank_finished", run=r) == 1 for r in runs)
        compared = [v for _, l, v in f["lockstep_pair_compared_steps_total"]["samples"]]
        return f if done and compared and compared[0] >= STEPS - 2 else None

    f = poll("every record counted and the pair compared", settled)
    for run, r in runs.items():
        assert r["records_dropped"] == 0
        assert expfmt.value(f, "lockstep_rank_last_step", run=run, rank="0") == STEPS - 1
        assert expfmt.value(f, "lockstep_rank_messages_total", run=run) == r["messages_sent"]
        assert expfmt.value(f, "lockstep_rank_missing_messages", run=run) == 0
        assert expfmt.value(f, "lockstep_rank_agent_dropped_records_total", run=run) == 0
        assert 0 <= expfmt.value(f, "lockstep_rank_last_seen_age_seconds", run=run) < 60
        assert expfmt.value(f, "lockstep_rank_step_duration_seconds_count", run=run) == STEPS - 1 or \
            expfmt.value(f, "lockstep_rank_step_duration_seconds_count", run=run) == STEPS
        assert expfmt.value(f, "lockstep_rank_last_step_duration_seconds", run=run) > 0
    # Label escaping survived the round trip through the wire, the registry and the writer.
    assert expfmt.value(f, "lockstep_rank_info", run="cand-0")  == 1
    info = [l for _, l, _ in f["lockstep_rank_info"]["samples"] if l["run"] == "cand-0"][0]
    assert info["experiment"] == EXPERIMENT and info["role"] == "candidate"
    pair = dict(experiment=EXPERIMENT, baseline="base-0", candidate="cand-0")
    # The candidate drifts from step 10 in the second half of its tensors and its loss.
    assert expfmt.value(f, "lockstep_pair_matched_tensors", **pair) == TENSORS
    assert expfmt.value(f, "lockstep_pair_drifting_tensors", **pair) >= TENSORS // 2
    assert expfmt.value(f, "lockstep_pair_worst_drift_score", **pair) > 1
    assert expfmt.value(f, "lockstep_pair_loss_difference", **pair) > 0.1
    assert expfmt.value(f, "lockstep_pair_diverged", **pair) == 1
    assert expfmt.value(f, "lockstep_pair_first_divergence_step", **pair) >= 10
    alerts = f["lockstep_alerts_total"]["samples"]
    assert any(l["rule"] == "first_divergence" and l["experiment"] == EXPERIMENT for _, l, _ in alerts), alerts
    assert all(l["severity"] in ("info", "warning", "critical") for _, l, _ in alerts)
    total = sum(records(r) for r in runs.values())
    assert expfmt.value(f, "lockstep_collector_records_total") == total
    assert expfmt.value(f, "lockstep_collector_logged_bytes_total") > 0
    assert expfmt.value(f, "lockstep_collector_bad_messages_total", reason="malformed") == 0
    assert expfmt.value(f, "lockstep_collector_up") == 1
    assert expfmt.value(f, "lockstep_alert_sink_delivered_total", kind="log") >= 1
    for name, fam in f.items():
        assert name.startswith("lockstep_"), name
        assert fam["help"], name


def test_root_hint_and_404(live):
    status, _, body = http_get(live["url"] + "/")
    assert status == 200 and "/metrics" in body and body.count("\n") == 1
    status, _, _ = http_get(live["url"] + "/nope")
    assert status == 404
    req = urllib.request.Request(live["url"] + "/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 405


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_prometheus_scrapes_it(live):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (Debian package 'prometheus'); "
                    "the exposition format was still checked strictly above")
    tmp = live["tmp"]
    cfg = tmp / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                   "scrape_configs:\n  - job_name: lockstep\n    static_configs:\n"
                   f"      - targets: ['{live['address']}']\n")
    port = free_port()
    prom = subprocess.Popen(
        [binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    api = f"http://127.0.0.1:{port}/api/v1"

    def get_json(path):
        if prom.poll() is not None:
            raise AssertionError(f"prometheus exited: {prom.stderr.read()}")
        try:
            with urllib.request.urlopen(api + path, timeout=2) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, ConnectionError):
            return None

    try:
        def target_up():
            j = get_json("/targets")
            t = j and j["data"]["activeTargets"]
            return t and t[0]["health"] == "up" and t[0]
        target = poll("prometheus reports the target up", target_up, timeout=25)
        assert target["lastError"] == ""

        def series(query):
            j = get_json("/query?query=" + urllib.parse.quote(query))
            return j and j["status"] == "success" and j["data"]["result"]

        res = poll("lockstep_rank_records_total in prometheus", lambda: series("lockstep_rank_records_total"))
        got = {r["metric"]["run"]: float(r["value"][1]) for r in res}
        assert got == {run: records(r) for run, r in live["runs"].items()}
        res = poll("the pair series", lambda: series("lockstep_pair_drifting_tensors"))
        assert res[0]["metric"]["experiment"] == EXPERIMENT
        assert series("lockstep_alerts_total")
    finally:
        prom.send_signal(signal.SIGTERM)
        try:
            prom.wait(timeout=10)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()


def start_collector(tmp, *flags):
    ready = tmp / f"ready-{time.monotonic_ns()}.json"
    proc = subprocess.Popen(
        [LOCKSTEP, "collect", "--listen", "tcp://127.0.0.1:*", "--view-listen", "tcp://127.0.0.1:*",
         "--data-dir", str(tmp / f"data-{time.monotonic_ns()}"), "--ready-file", str(ready),
         "--status-interval-s", "0", "--log-level", "warn", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    poll("ready file or exit", lambda: ready.exists() or proc.poll() is not None)
    return proc, ready


def test_busy_metrics_port_is_one_clear_sentence_and_off_serves_none(live):
    proc, _ = start_collector(live["tmp"], "--metrics-listen", live["address"])
    assert proc.wait(timeout=20) == 2
    err = proc.stderr.read().strip().splitlines()
    assert len(err) == 1 and "--metrics-listen" in err[0] and live["address"] in err[0], err
    proc, ready = start_collector(live["tmp"], "--metrics-listen", "off")
    try:
        assert proc.poll() is None, proc.stderr.read()
        assert json.loads(ready.read_text())["metrics"] == ""
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


def test_retention_figures_match_the_data_dir(live):
    """A collector that closes 64K segments and thins them (--retain-steps 20
    --thin-every 10): once a solo run has ended, the retention figures of a scrape are
    what its passes did and what its data dir holds (docs/metrics.md "Retention")."""
    proc, ready = start_collector(live["tmp"], "--metrics-listen", "127.0.0.1:0", "--segment-size", "64K",
                                  "--retain-steps", "20", "--thin-every", "10")
    try:
        assert proc.poll() is None, proc.stderr.read()
        info = json.loads(ready.read_text())
        g = subprocess.run([LOADGEN, "--endpoint", info["listen"][0], "--run", "solo-0", "--tensors", "16",
                            "--steps", "300", "--backpressure", "--heartbeat-ms", "50"],
                           capture_output=True, text=True, timeout=60)
        assert g.returncode == 0, g.stderr
        data = info["data_dir"]

        def on_disk():
            try:
                return sum(os.path.getsize(os.path.join(data, n)) for n in os.listdir(data)
                           if ".lslog" in n)
            except FileNotFoundError:  # a pass renamed its .thin file meanwhile: ask again
                return -1

        def settled():
            f = expfmt.parse(http_get(f"http://{info['metrics']}/metrics")[2])
            done = (expfmt.value(f, "lockstep_retention_thinned_segments_total") > 0 and
                    expfmt.value(f, "lockstep_retention_log_bytes") == on_disk())
            return f if done else None

        f = poll("a retention pass after the run, over its thinned segments", settled)
        assert f["lockstep_retention_thinned_segments_total"]["type"] == "counter"
        assert f["lockstep_retention_log_bytes"]["type"] == "gauge"
        assert expfmt.value(f, "lockstep_retention_hollowed_messages_total") > 0
        assert expfmt.value(f, "lockstep_retention_reclaimed_bytes_total") > 0
        assert expfmt.value(f, "lockstep_retention_compaction_failures_total") == 0
        assert expfmt.value(f, "lockstep_retention_over_max_disk") == 0
        assert expfmt.value(f, "lockstep_retention_pass_duration_seconds_count") >= 1
        assert "lockstep_retention_max_disk_bytes" not in f  # no --max-disk
        assert any(".lslog.0" in n for n in os.listdir(data))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, proc.stderr.read()
