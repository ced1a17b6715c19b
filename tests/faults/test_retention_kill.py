"""Retention survives a kill -9 in the middle of a compaction (issue 28 item 2; docs/runlog.md
"Segments and retention").

A long synthetic pair (two real lockstep-loadgen runs, 1,500 steps, the candidate drifting
from step 1,200) is recorded by a collector that closes segments but thins nothing
(--retain-steps beyond the run), and `lockstep compare` gives the verdict. A collector with
--retain-steps 200 --thin-every 10 is started on the same data dir with its compaction
paused half way through a segment's ".thin" file (the test hook
LOCKSTEP_TEST_RETENTION_PAUSE_MS) and SIGKILLed there. Another one restarts, finishes the
thinning, and then:

- the segment being thinned at the kill reads whole, the ".thin" leftover is gone;
- `compare` gives the same verdict (exit status, first divergence) as before thinning, and
  says what was thinned in each log;
- no sequence number is missing (`inspect --summary` counts no gap);
- the data dir shrank."""
import os
import re
import subprocess
import time

from fault_lib import poll
from scenario_lib import Collector

LOADGEN = os.environ.get("LOCKSTEP_LOADGEN", "lockstep-loadgen")
STEPS = 1500
DRIFT = 1200
COMMON = ["--segment-size", "64K", "--thin-every", "10", "--status-interval-s", "0"]


def compare(exe, data):
    out = subprocess.run([exe, "compare", os.path.join(data, "base.lslog"), os.path.join(data, "cand.lslog")],
                         capture_output=True, text=True, timeout=120, check=False)
    return out.returncode, out.stdout


def first_divergence(stdout):
    for line in stdout.splitlines():
        if line.strip().startswith("first divergence"):
            return line.strip()
    return None


def log_bytes(data):
    return sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data) if ".lslog" in f)


def thinned_lines(col):
    return col.stderr().count("retention: thinned ")


def test_kill_in_the_middle_of_a_compaction_loses_nothing_kept(tmp_path, monkeypatch):
    col = Collector(tmp_path, COMMON + ["--retain-steps", "1000000000"])
    data = col.data_dir
    gens = [subprocess.Popen([LOADGEN, "--endpoint", col.endpoint, "--run", run, "--experiment", "retention",
                              "--role", role, "--tensors", "20", "--steps", str(STEPS), "--sketch-k", "8",
                              "--steps-per-s", "400", "--backpressure"] + extra,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for run, role, extra in (("base", "baseline", []), ("cand", "candidate", ["--drift-after", str(DRIFT)]))]
    for g in gens:
        assert g.wait(timeout=120) == 0
    col.wait_goodbye(["base", "cand"])
    col.proc.terminate()
    col.proc.wait(timeout=30)
    assert "retention: thinned" not in col.stderr()
    segments = sorted(f for f in os.listdir(data) if f.startswith("cand.lslog."))
    assert len(segments) >= 10, segments
    rc_before, out_before = compare(col.exe, data)
    fd_before = first_divergence(out_before)
    at = re.search(r"at step (\d+)", fd_before or "")
    assert at and DRIFT <= int(at.group(1)) <= DRIFT + 10, out_before
    assert "thinned by retention" not in out_before
    bytes_before = log_bytes(data)

    # Killed in the middle of a compaction: a ".thin" file half written.
    monkeypatch.setenv("LOCKSTEP_TEST_RETENTION_PAUSE_MS", "5000")
    col = Collector(tmp_path, COMMON + ["--retain-steps", "200"])
    poll("a compaction paused half way", lambda: "test pause" in col.stderr(), timeout=60)
    thin = [f for f in os.listdir(data) if f.endswith(".thin")]
    assert len(thin) == 1, thin
    col.kill()
    monkeypatch.delenv("LOCKSTEP_TEST_RETENTION_PAUSE_MS")
    segment = os.path.join(data, thin[0][:-len(".thin")])
    out = subprocess.run([col.exe, "inspect", segment], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr  # the old segment, whole
    assert out.stdout.count("\n") > 50

    # Restarted: the thinning finishes (no new segment thinned for 3 passes).
    col = Collector(tmp_path, COMMON + ["--retain-steps", "200"])
    poll("the first segments thinned", lambda: thinned_lines(col) > 0, timeout=60)
    last = (thinned_lines(col), time.monotonic())
    while time.monotonic() - last[1] < 6.5:
        time.sleep(0.5)
        n = thinned_lines(col)
        if n != last[0]:
            last = (n, time.monotonic())
    col.proc.terminate()
    col.proc.wait(timeout=30)
    assert not [f for f in os.listdir(data) if f.endswith(".thin")]

    rc_after, out_after = compare(col.exe, data)
    assert rc_after == rc_before, (out_before, out_after)
    assert first_divergence(out_after) == fd_before, (out_before, out_after)
    said = [line.strip() for line in out_after.splitlines() if "thinned by retention" in line]
    assert [s.split(":")[0] for s in said] == ["baseline log", "candidate log"], out_after
    assert all("steps 0-" in s and "every 10th step" in s for s in said), said
    # The thinned steps' statistics messages are emptied, not removed: no gap.
    summary = subprocess.run([col.exe, "inspect", "--summary", os.path.join(data, "cand.lslog")],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    assert '"gaps":0' in summary, summary
    bytes_after = log_bytes(data)
    assert bytes_after < 0.6 * bytes_before, (bytes_before, bytes_after)
    print("retention: %d -> %d log bytes; %s" % (bytes_before, bytes_after, said[1]))
