"""`lockstep top` in tmux against a live `lockstep collect` fed by two lockstep-loadgen
runs (a baseline and a candidate that drifts from step 30 in layers.2/3): the screen
is read with capture-pane and every check polls with a deadline (no fixed sleeps)."""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

import pytest

LOCKSTEP = os.environ.get("LOCKSTEP_BIN", "lockstep")
LOADGEN = os.environ.get("LOCKSTEP_LOADGEN", "lockstep-loadgen")


def poll(fn, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


class Tmux:
    def __init__(self):
        self.sock = "lockstep-view-" + uuid.uuid4().hex[:8]

    def __call__(self, *args, check=True):
        return subprocess.run(["tmux", "-L", self.sock, "-f", "/dev/null", *args], check=check,
                              capture_output=True, text=True, timeout=10)

    def screen(self):
        return self("capture-pane", "-p", "-t", "top").stdout

    def kill(self):
        self("kill-server", check=False)


@pytest.fixture
def live(tmp_path):
    """A collector and two loadgens; yields the view endpoint and the collector process."""
    ready = tmp_path / "ready.json"
    args = [LOCKSTEP, "collect", "--listen", "tcp://127.0.0.1:*", "--view-listen", "tcp://127.0.0.1:*",
            "--ready-file", str(ready), "--data-dir", str(tmp_path / "data"), "--status-interval-s", "0",
            "--log-level", "warn", "--alerts-file", str(tmp_path / "alerts.jsonl")]
    helptext = subprocess.run([LOCKSTEP, "collect", "--help"], capture_output=True, text=True).stdout
    if "--metrics-listen" in helptext:
        args += ["--metrics-listen", "127.0.0.1:0"]  # never the fixed default port
    procs = []
    col = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "collect.log", "w"))
    procs.append(col)
    try:
        poll(lambda: ready.exists(), "the collector's ready file")
        info = json.loads(ready.read_text())
        assert info["view"].startswith("tcp://127.0.0.1:"), info
        ep = info["listen"][0]
        common = ["--endpoint", ep, "--experiment", "viewtest", "--tensors", "16", "--steps", "100000",
                  "--steps-per-s", "25", "--heartbeat-ms", "200"]
        for run, role in (("gpu-base", "baseline"), ("npu-cand", "candidate")):
            extra = ["--drift-after", "30"] if role == "candidate" else []
            procs.append(subprocess.Popen([LOADGEN, "--run", run, "--role", role, *common, *extra],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield info["view"], col
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def run_step(screen, run):
    m = re.search(rf"^{re.escape(run)}\s+\S+\s+\S+\s+\d+/\d+\s+(\d+)", screen, re.M)
    return int(m.group(1)) if m else None


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (scripts/setup installs it)")
def test_top_in_tmux(live):
    view_ep, collector = live
    tmux = Tmux()
    try:
        # The exit status goes to a file: tmux 3.3 can leave an exited pane unreaped (no
        # #{pane_dead_status}) for seconds, which made that route flaky.
        exit_file = tempfile.NamedTemporaryFile(prefix="top-exit-", delete=False).name
        os.unlink(exit_file)
        cmd = (f"sh -c 'env LANG=C.UTF-8 TERM=xterm-256color {LOCKSTEP} top --connect {view_ep} "
               f"--unreachable-after-s 1; echo $? > {exit_file}'")
        tmux("new-session", "-d", "-s", "top", "-x", "100", "-y", "30", cmd)
        tmux("set-option", "-t", "top", "remain-on-exit", "on")
        tmux("set-option", "-g", "window-size", "manual")

        # Both runs listed, and their steps advance.
        s = poll(lambda: (lambda t: t if run_step(t, "gpu-base") is not None and
                          run_step(t, "npu-cand") is not None else None)(tmux.screen()), "both runs on screen")
        first = run_step(s, "gpu-base")
        poll(lambda: (run_step(tmux.screen(), "gpu-base") or 0) > first, "the baseline's step to advance")

        # The injected layers (layers.2.*, layers.3.*) lead the drift table, and an alert shows.
        def drifting(t):
            rows = [l for l in t.splitlines() if re.match(r"^[> ]layers\.\d+\.op\d", l)]
            return t if rows and re.match(r"^[> ]layers\.[23]\.", rows[0]) and "drift" in rows[0] + t else None
        poll(lambda: drifting(tmux.screen()), "a drifting tensor of layers.2/3 at the top", timeout=15)
        s = poll(lambda: (lambda t: t if re.search(r"(warning|critical) (tensor_drift|first_divergence|loss_drift)",
                                                    t) else None)(tmux.screen()), "an alert in the feed")
        assert "first divergence: step 3" in s, s  # drift starts at step 30

        # Resize to 80x24: the screen follows and still shows every panel.
        tmux("resize-window", "-t", "top", "-x", "80", "-y", "24")
        def fits(t):
            lines = t.rstrip("\n").split("\n")
            ok = (len(lines) == 24 and max(len(l) for l in lines) <= 80 and "q quit" in lines[-1] and
                  "TENSORS" in t and "ALERTS" in t and "gpu-base" in t)
            return t if ok else None
        poll(lambda: fits(tmux.screen()), "the 80x24 layout")

        # Enter opens the selected tensor's history; Esc goes back.
        tmux("send-keys", "-t", "top", "Enter")
        poll(lambda: "drift/thr" in tmux.screen() and "TENSOR layers." in tmux.screen(), "the history view")
        tmux("send-keys", "-t", "top", "Escape")
        poll(lambda: "TENSORS" in tmux.screen(), "the main view again")

        # s cycles the sort key; / filters.
        tmux("send-keys", "-t", "top", "s")
        poll(lambda: "sort: rel_l2" in tmux.screen(), "sort by rel_l2")
        tmux("send-keys", "-t", "top", "/", "op3", "Enter")
        def filtered(t):
            rows = [l for l in t.splitlines() if re.match(r"^[> ]layers\.", l)]
            return t if rows and all(".op3" in r for r in rows) and "filter: op3" in t else None
        poll(lambda: filtered(tmux.screen()), "only op3 tensors listed")

        # ? shows the keys; any key closes it.
        tmux("send-keys", "-t", "top", "?")
        poll(lambda: "KEYS" in tmux.screen(), "the help screen")
        tmux("send-keys", "-t", "top", "x")
        poll(lambda: "TENSORS" in tmux.screen(), "help closed")

        # The collector goes away: top says so and keeps running.
        collector.send_signal(signal.SIGTERM)
        collector.wait(timeout=10)
        poll(lambda: f"collector not reachable at {view_ep} (retrying" in tmux.screen(), "the unreachable banner")

        # q quits.
        tmux("send-keys", "-t", "top", "q")
        def exited():
            try:
                with open(exit_file) as f:
                    return f.read().strip() or None
            except FileNotFoundError:
                return None
        assert poll(exited, "lockstep top to exit") == "0"
    finally:
        tmux.kill()


def test_top_once_prints_plain_snapshot(live):
    view_ep, _ = live
    def once():
        r = subprocess.run([LOCKSTEP, "top", "--once", "--connect", view_ep], capture_output=True, text=True,
                           timeout=20)
        assert r.returncode == 0, r.stderr
        return r.stdout if "npu-cand" in r.stdout and "PAIR viewtest: gpu-base vs npu-cand" in r.stdout else None
    out = poll(once, "a snapshot listing the pair")
    assert "RUNS" in out and "ALERTS" in out


def test_top_once_says_unreachable():
    r = subprocess.run([LOCKSTEP, "top", "--once", "--connect", "tcp://127.0.0.1:1", "--timeout-s", "0.3"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 4  # lockstep/common/exit_codes.h: runtime failure
    assert "collector not reachable at tcp://127.0.0.1:1" in r.stderr
