"""Recorded run pairs for the report tests: a real `lockstep collect` and two
`lockstep-loadgen`s (baseline, candidate drifting from a step on), no torch."""
import json
import os
import signal
import subprocess
import time

# The sanitizer stages run slower binaries (docs/sanitizers.md): scripts/test sets this
# factor, and every wait here that gives a process time to work is stretched by it.
TIME_SCALE = max(1, int(os.environ.get("LOCKSTEP_TIME_SCALE", "1") or 1))


def binaries():
    exe, gen = os.environ.get("LOCKSTEP_BIN", ""), os.environ.get("LOCKSTEP_LOADGEN", "")
    if not (exe and os.access(exe, os.X_OK) and gen and os.access(gen, os.X_OK)):
        raise RuntimeError("LOCKSTEP_BIN and LOCKSTEP_LOADGEN must name the built binaries")
    return exe, gen


class Collector:
    """`lockstep collect` on an ephemeral loopback port; `metrics=True` also serves
    HTTP (/metrics, /report) on a free loopback port (self.http)."""

    def __init__(self, tmp, metrics=False):
        self.exe, self.gen = binaries()
        self.data_dir = os.path.join(str(tmp), "data")
        ready = os.path.join(str(tmp), "ready.json")
        self.stderr_path = os.path.join(str(tmp), "collect.stderr")
        self._err = open(self.stderr_path, "ab")
        args = [self.exe, "collect", "--listen", "tcp://127.0.0.1:*", "--ready-file", ready,
                "--data-dir", self.data_dir, "--view-listen", "off",
                "--metrics-listen", "127.0.0.1:0" if metrics else "off"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self._err)
        deadline = time.monotonic() + 30 * TIME_SCALE
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("lockstep collect exited: " + open(self.stderr_path).read())
            try:
                with open(ready, encoding="utf-8") as f:
                    info = json.load(f)
                self.endpoint = info["listen"][0]
                self.http = info.get("metrics")
                break
            except (OSError, ValueError, KeyError, IndexError):
                if time.monotonic() > deadline:
                    raise RuntimeError("lockstep collect wrote no ready file within %d s" % (30 * TIME_SCALE))
                time.sleep(0.01)

    def run_pair(self, experiment, tensors, steps, drift_after, init_tensors=0):
        """Runs a baseline and a candidate loadgen side by side; returns their log paths.
        `init_tensors`: tensors of kind param recorded at step 0 only."""
        procs = []
        for run, role in (("%s-base" % experiment, "baseline"), ("%s-cand" % experiment, "candidate")):
            procs.append(subprocess.Popen(
                [self.gen, "--endpoint", self.endpoint, "--run", run, "--experiment", experiment,
                 "--role", role, "--tensors", str(tensors), "--steps", str(steps), "--backpressure",
                 "--drift-after", str(drift_after), "--sketch-k", "16",
                 "--init-tensors", str(init_tensors)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for p in procs:
            out, err = p.communicate(timeout=120 * TIME_SCALE)
            assert p.returncode == 0, out + err
            counters = json.loads(out.strip().splitlines()[-1])
            assert counters["records_dropped"] == 0 and counters["messages_dropped"] == 0, out
        return [self.log_path("%s-base" % experiment), self.log_path("%s-cand" % experiment)]

    def log_path(self, run):
        return os.path.join(self.data_dir, run + ".lslog")

    def wait_goodbye(self, runs, deadline_s=60.0):
        deadline = time.monotonic() + deadline_s * TIME_SCALE
        for run in runs:
            while True:
                out = subprocess.run([self.exe, "inspect", "--summary", self.log_path(run)],
                                     capture_output=True, text=True, timeout=60 * TIME_SCALE, check=False)
                lines = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
                if lines and all(x.get("goodbye") for x in lines):
                    break
                if time.monotonic() > deadline:
                    raise AssertionError("no Goodbye of %s within %.0f s" % (run, deadline_s * TIME_SCALE))
                time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._err.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
