"""The C++ agent (driven by lockstep-loadgen) against a real `lockstep collect`, as
separate processes on loopback: exact sequence accounting with no loss, a collector
that starts late, and a collector that is SIGKILLed and restarted mid-stream.

Binaries come from LOCKSTEP_BIN / LOCKSTEP_LOADGEN (set by ctest)."""
import json
import os
import signal
import socket
import subprocess
import time

import pytest

LOCKSTEP = os.environ.get("LOCKSTEP_BIN", "lockstep")
LOADGEN = os.environ.get("LOCKSTEP_LOADGEN", "lockstep-loadgen")
# The sanitizer stages run slower binaries (docs/sanitizers.md); waits that give a
# process time to do something are stretched by this factor.
TIME_SCALE = max(1, int(os.environ.get("LOCKSTEP_TIME_SCALE", "1") or 1))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Collector:
    def __init__(self, tmp_path, listen="tcp://127.0.0.1:*"):
        self.data_dir = tmp_path / "data"
        self.ready = tmp_path / f"ready-{time.monotonic_ns()}.json"
        self.proc = subprocess.Popen(
            [LOCKSTEP, "collect", "--listen", listen, "--data-dir", str(self.data_dir),
             "--ready-file", str(self.ready), "--status-interval-s", "0", "--log-level", "warn",
             "--control-listen", "off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while not self.ready.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"collector exited: {self.proc.stderr.read()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError("collector did not write its ready file in 20 s")
            time.sleep(0.01)
        self.endpoint = json.loads(self.ready.read_text())["listen"][0]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=20) == 0, self.proc.stderr.read()

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=20)

    def log(self, run):
        return self.data_dir / f"{run}.lslog"


def loadgen(endpoint, run, *args):
    return subprocess.Popen([LOADGEN, "--endpoint", endpoint, "--run", run, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=60):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def summary(path):
    out = subprocess.run([LOCKSTEP, "inspect", "--summary", str(path)], check=True,
                         capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(rows) == 1, rows
    return rows[0]


def wait_for_goodbye(path, timeout=30):
    """The agent's Close() returns once its messages are in the kernel; the collector
    may still be reading them. Poll its log (never a fixed sleep) until the Goodbye is in."""
    deadline = time.monotonic() + timeout
    while True:
        if path.exists():
            res = subprocess.run([LOCKSTEP, "inspect", "--summary", str(path)],
                                 capture_output=True, text=True)
            if res.returncode == 0 and '"goodbye":true' in res.stdout:
                return
        assert time.monotonic() < deadline, f"no Goodbye in {path} after {timeout} s"
        time.sleep(0.05)


def records(path):
    res = subprocess.run([LOCKSTEP, "inspect", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def test_100k_records_arrive_with_exact_sequence_accounting(tmp_path):
    col = Collector(tmp_path)
    agent = finish(loadgen(col.endpoint, "e2e-100k", "--tensors", 100, "--steps", 1000,
                           "--backpressure", "--send-hwm", 100000))
    wait_for_goodbye(col.log("e2e-100k"))
    col.stop()
    assert agent["records_sent"] == 100_000 and agent["records_dropped"] == 0
    assert agent["messages_dropped"] == 0
    s = summary(col.log("e2e-100k"))
    assert s["stat_records"] == 100_000
    assert s["scalar_records"] == 1000
    assert s["messages"] == agent["messages_sent"]
    assert (s["first_seq"], s["last_seq"]) == (0, agent["messages_sent"] - 1)
    assert s["gaps"] == 0 and s["duplicates"] == 0 and s["bad_messages"] == 0
    assert s["agent_records_sent"] == 100_000 and s["agent_records_dropped"] == 0
    assert s["goodbye"] and s["last_step"] == 999


def test_collector_started_late_loses_nothing_within_hwm(tmp_path):
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    # 300 steps at 100/s: about 400 messages wait in the agent's socket (HWM 1000)
    # during the 2 s before the collector exists.
    proc = loadgen(endpoint, "e2e-late", "--tensors", 20, "--steps", 300, "--steps-per-s", 100,
                   "--close-timeout-ms", 10000)
    time.sleep(2.0)  # the scenario under test: no collector for 2 s
    assert proc.poll() is None, "the loadgen should still be running"
    col = Collector(tmp_path, listen=endpoint)
    agent = finish(proc)
    wait_for_goodbye(col.log("e2e-late"))
    col.stop()
    assert agent["messages_dropped"] == 0 and agent["records_dropped"] == 0
    s = summary(col.log("e2e-late"))
    assert s["first_seq"] == 0 and s["gaps"] == 0 and s["duplicates"] == 0
    assert s["messages"] == agent["messages_sent"]
    assert s["stat_records"] == 20 * 300 == agent["records_sent"]
    log = records(col.log("e2e-late"))
    assert log[0]["type"] == "Hello" and log[-1]["type"] == "Goodbye"


def test_collector_killed_and_restarted_counts_the_gap_exactly(tmp_path):
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    col = Collector(tmp_path, listen=endpoint)
    # Scaled: the run must outlast the kill and a (slower, sanitized) collector's restart.
    # A send HWM that outlasts the downtime (freeze, kill, a sanitized collector's restart
    # on a loaded 2-core machine: several seconds at ~600 messages/s), so what is lost is
    # only what sat in the kernel's socket buffers, never a refusal.
    proc = loadgen(endpoint, "e2e-kill", "--tensors", 20, "--steps", 600 * TIME_SCALE, "--steps-per-s", 200,
                   "--close-timeout-ms", 10000, "--send-hwm", 50000)
    log_path = col.log("e2e-kill")
    deadline = time.monotonic() + 20
    while not (log_path.exists() and log_path.stat().st_size > 50_000):
        assert time.monotonic() < deadline, "nothing reached the collector's log"
        time.sleep(0.02)
    # Freeze the collector so messages pile up in its socket buffers, then kill it:
    # whatever the kernel held for it is lost in transit, as in a real crash.
    col.proc.send_signal(signal.SIGSTOP)
    # Long enough for the loadgen to fill the frozen collector's socket buffers; a
    # TSan-built loadgen sends slowly enough that 0.3 s could pass with nothing in them.
    time.sleep(0.3 * TIME_SCALE)
    col.kill()
    before = records(log_path)
    col = Collector(tmp_path, listen=endpoint)
    agent = finish(proc)
    wait_for_goodbye(log_path)
    col.stop()
    assert agent["messages_dropped"] == 0, "the agent's socket never refused a message"
    assert agent["reconnects"] >= 1

    log = records(log_path)
    # The log before the crash is intact: the records read then are still there, unchanged.
    assert [(r["seq"], r["type"]) for r in log[:len(before)]] == [(r["seq"], r["type"]) for r in before]
    seqs = [r["seq"] for r in log]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    missing = set(range(agent["messages_sent"])) - set(seqs)
    assert len(missing) > 0, "SIGKILL after SIGSTOP should lose what sat in the socket buffers"
    # The missing numbers form one contiguous run, at the crash.
    assert max(missing) - min(missing) + 1 == len(missing)
    assert min(missing) > before[-1]["seq"]

    s = summary(log_path)
    assert s["gaps"] == len(missing)
    assert s["messages"] + s["gaps"] == agent["messages_sent"]
    assert s["last_seq"] == agent["messages_sent"] - 1 and s["duplicates"] == 0
    assert s["sessions"] == 1
    # After the reconnection the agent introduced itself again.
    after = [r for r in log if r["seq"] > max(missing)]
    assert any(r["type"] == "Hello" for r in after)
    assert any(r["type"] == "TensorDirectory" for r in after)
    assert log[-1]["type"] == "Goodbye"
