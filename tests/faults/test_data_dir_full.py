"""The collector's data dir fills up (a small tmpfs) while a baseline and a candidate
train, then space returns:

- one clear error line, and a `collector_disk` alert (critical) in the alerts file;
- ingest goes on: messages are still verified, counted (registry) and aligned (the
  pair's compared steps keep growing); what cannot be written is counted
  (log_lost_messages), exactly: it equals the sequence numbers missing from the logs;
- nothing already written is damaged: the records logged before the fault read back
  unchanged with `lockstep inspect` (exit 0, no corrupt record);
- recovery: once space returns, writing resumes with one clear line, and later
  messages are in the logs.

The tmpfs is mounted in a private mount namespace (`unshare --mount`, or as an
unprivileged user `unshare --user --map-root-user --mount`) that lives as long as the
collector; the test reads it through /proc/<collector pid>/root. Where neither works
the test is skipped, saying why."""
import errno
import json
import os
import subprocess

import pytest

from fault_lib import inspect_records, metric, missing_seqs, poll
from scenario_lib import Collector, free_port, make_pair, batches

TMPFS_MB = 4
MOUNT = 'mount -t tmpfs -o size=%dm lockstep-faults "$0" && exec "$@"' % TMPFS_MB


def namespace_prefix(mountpoint):
    """The command prefix that runs the collector with a tmpfs on `mountpoint`, or
    pytest.skip with the reason when this machine allows neither way."""
    tries = []
    if os.geteuid() == 0:
        tries.append(["unshare", "--mount", "--propagation", "private"])
    tries.append(["unshare", "--user", "--map-root-user", "--mount"])
    reasons = []
    for t in tries:
        cmd = [*t, "sh", "-c", MOUNT, str(mountpoint), "true"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as e:
            reasons.append("%s: %s" % (" ".join(t), e))
            continue
        if res.returncode == 0:
            return [*t, "sh", "-c", MOUNT, str(mountpoint)]
        reasons.append("%s: %s" % (" ".join(t), res.stderr.strip() or "exit %d" % res.returncode))
    pytest.skip("cannot mount a small tmpfs for the data dir (needs root, or unprivileged user "
                "namespaces): " + "; ".join(reasons))
    return None


def fill(path):
    """Writes `path` until the file system says it is full; returns the bytes written."""
    n = 0
    chunk = b"\0" * (64 << 10)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                n += f.write(chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
        try:  # the last partial chunk
            while f.write(b"\0" * 512):
                n += 512
        except OSError:
            pass
    return n


def log_state(col, runs):
    return {r: inspect_records(col.exe, col.log_path(r)) for r in runs}


def test_data_dir_full_and_back(tmp_path):
    mountpoint = tmp_path / "tmpfs"
    mountpoint.mkdir()
    prefix = namespace_prefix(mountpoint)
    exp = "diskfull"
    runs = [exp + "-base", exp + "-cand"]
    col = Collector(tmp_path, ["--status-interval-s", "0"], listen="tcp://127.0.0.1:%d" % free_port(),
                    metrics=True, prefix=prefix, data_dir=str(mountpoint))
    # The tmpfs exists only in the collector's mount namespace: read it from there.
    col.data_dir = "/proc/%d/root%s" % (col.proc.pid, mountpoint)
    filler = os.path.join(col.data_dir, "filler")
    b, c = make_pair(col.endpoint, exp)
    data = batches(36)
    figures = {}

    def train(steps):
        for x, y in steps:
            b.train_step(x, y)
            c.train_step(x, y)

    def compared():
        return metric(col, "lockstep_pair_compared_steps_total", default=0.0, experiment=exp)

    def accepted():
        return metric(col, "lockstep_collector_messages_total")

    try:
        train(data[:12])
        poll("steps before the fault logged", lambda: compared() >= 10)
        before = log_state(col, runs)
        figures["filler_bytes"] = fill(filler)
        compared_at_fault, accepted_at_fault = compared(), accepted()

        train(data[12:24])
        poll("a log write failing", lambda: metric(col, "lockstep_collector_log_errors_total") > 0)
        poll("ingest and alignment going on while the disk is full",
             lambda: compared() >= compared_at_fault + 10)
        assert accepted() > accepted_at_fault
        lost = metric(col, "lockstep_collector_log_lost_messages_total")
        assert lost > 0
        poll("the collector_disk alert",
             lambda: [a for a in col.alerts() if a["rule"] == "collector_disk"], timeout=10)
        # Nothing already written is damaged.
        during = log_state(col, runs)
        for r in runs:
            assert during[r][:len(before[r])] == before[r], r

        os.remove(filler)  # space returns
        train(data[24:])
        # Recovery is declared after 5 s of writes without a failure (a nearly full disk
        # lets small writes through between failures); heartbeats keep writing.
        poll("the recovery line", lambda: "writing the run logs in" in col.stderr(), timeout=20,
             interval=0.2)
        assert b.close() and c.close()
        col.wait_goodbye(runs)
        after = log_state(col, runs)
        figures.update(lost_messages=metric(col, "lockstep_collector_log_lost_messages_total"),
                       log_errors=metric(col, "lockstep_collector_log_errors_total"),
                       compared_steps=compared())
    finally:
        col.stop()

    err = col.stderr()
    lines = [line for line in err.splitlines() if "collector_disk" not in line]  # the log sink's
    full_lines = [line for line in lines if "cannot write the run logs in" in line]
    assert len(full_lines) == 1, err
    assert "No space left on device" in full_lines[0], full_lines
    back_lines = [line for line in lines if "writing the run logs in" in line]
    assert len(back_lines) == 1, err
    disk = [a for a in col.alerts() if a["rule"] == "collector_disk"]
    assert len(disk) == 1 and disk[0]["severity"] == "critical", disk
    figures["error_line"] = full_lines[0].split(" ", 3)[-1]
    figures["recovery_line"] = back_lines[0].split(" ", 3)[-1]

    missing = 0
    for r in runs:
        log = after[r]
        assert log[:len(before[r])] == before[r], r      # still intact at the end
        assert log[-1]["type"] == "Goodbye"             # written after the recovery
        gap = missing_seqs(log)
        assert gap and min(gap) > before[r][-1]["seq"], r  # lost only during the fault
        missing += len(gap)
    # Exactly what the collector counted as not written is missing from the logs.
    assert missing == figures["lost_messages"], (missing, figures)
    assert figures["compared_steps"] >= 34, figures  # every step aligned, full disk or not
    print("FIGURES", json.dumps(figures, sort_keys=True))
