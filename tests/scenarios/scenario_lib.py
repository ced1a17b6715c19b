"""Shared pieces of the end-to-end scenarios: a real `lockstep collect` with an alerts
file, a small TransformerEncoder on synthetic data, and a loop that trains a baseline
and a candidate model side by side in one process, each watched by its own Monitor.

Both runs are real training loops through the real agent and collector; they run in
one process (alternating steps) so a test pays for one torch import, and the baseline's
step s reaches the collector before the candidate's.
"""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

import torch
from torch import nn

torch.set_num_threads(1)

import lockstep  # noqa: E402  (after set_num_threads)

D_IN, D_MODEL, NHEAD, D_FF, LAYERS, SEQ, BATCH = 16, 32, 4, 64, 2, 16, 8


def lockstep_bin():
    path = os.environ.get("LOCKSTEP_BIN", "")
    return path if path and os.access(path, os.X_OK) else None


def free_port():
    """A loopback TCP port that was free a moment ago (for a collector that must come
    back on the same endpoint after a restart)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Collector:
    """`lockstep collect` on an ephemeral loopback port, writing alerts to a JSON-lines
    file. Use as a context manager; stop() sends SIGTERM and waits, which drains the
    alert dispatcher, so every alert is in the file afterwards.

    Another Collector on the same tmp_dir (a restart) keeps the data dir and the alerts
    file and appends to the same stderr file. `listen` fixes the endpoint, `metrics`
    serves /metrics on a free port (metrics_url), `prefix` runs the command through a
    wrapper (e.g. `unshare ... sh -c '...; exec "$@"' sh`), `data_dir` overrides where
    the logs go."""

    def __init__(self, tmp_dir, extra_args=(), listen="tcp://127.0.0.1:*", metrics=False,
                 prefix=(), data_dir=None):
        exe = lockstep_bin()
        if exe is None:
            raise RuntimeError("LOCKSTEP_BIN does not name the built lockstep binary")
        self.exe = exe
        self.data_dir = data_dir or os.path.join(str(tmp_dir), "data")
        self.alerts_path = os.path.join(str(tmp_dir), "alerts.jsonl")
        ready = os.path.join(str(tmp_dir), "ready.json")
        if os.path.exists(ready):
            os.remove(ready)  # left by a collector that was killed
        self.stderr_path = os.path.join(str(tmp_dir), "collect.stderr")
        self._stderr = open(self.stderr_path, "ab")  # a file: a full pipe would block it
        args = list(extra_args)
        if metrics:
            args += ["--metrics-listen", "127.0.0.1:0"]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [*prefix, exe, "collect", "--listen", listen, "--ready-file", ready,
             "--data-dir", self.data_dir, "--alerts-file", self.alerts_path, *args],
            stdout=subprocess.DEVNULL, stderr=self._stderr)
        deadline = time.monotonic() + 30
        self.endpoint = None
        while self.endpoint is None:
            if self.proc.poll() is not None:
                raise RuntimeError("lockstep collect exited: " + self.stderr())
            try:
                with open(ready, encoding="utf-8") as f:
                    info = json.load(f)
                self.endpoint = info["listen"][0]
            except (OSError, ValueError, KeyError, IndexError):
                if time.monotonic() > deadline:
                    raise RuntimeError("lockstep collect wrote no ready file within 30 s")
                time.sleep(0.01)
        self.ready_s = time.monotonic() - self.started
        self.metrics_url = "http://%s/metrics" % info["metrics"] if info.get("metrics") else None

    def metrics_text(self):
        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            return r.read().decode("utf-8")

    def freeze(self):
        """SIGSTOP: what the agents send from now on piles up in its socket buffers (and
        is lost with it if it is then killed, as in a real crash)."""
        self.proc.send_signal(signal.SIGSTOP)

    def kill(self):
        """SIGKILL, as a crash (no flush, no shutdown)."""
        self.proc.kill()
        self.proc.wait(timeout=20)
        self._stderr.close()

    def stderr(self):
        with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def log_path(self, run):
        return os.path.join(self.data_dir, run + ".lslog")

    def wait_goodbye(self, runs, deadline_s=30.0):
        """Polls the run logs until each run's Goodbye is logged: the collector has then
        handed every message of those runs to the analyzer (it analyzes right after
        logging, on the same thread)."""
        deadline = time.monotonic() + deadline_s
        pending = list(runs)
        while pending:
            run = pending[0]
            if os.path.exists(self.log_path(run)):
                out = subprocess.run([self.exe, "inspect", "--summary", self.log_path(run)],
                                     capture_output=True, text=True, timeout=30, check=False)
                lines = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
                if lines and all(x.get("goodbye") for x in lines):
                    pending.pop(0)
                    continue
            if time.monotonic() > deadline:
                raise AssertionError("no Goodbye of run %s logged within %.0f s" % (run, deadline_s))
            time.sleep(0.02)

    def alerts(self):
        if not os.path.exists(self.alerts_path):
            return []
        with open(self.alerts_path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


class Fp32LayerNorm(nn.LayerNorm):
    """LayerNorm computed in fp32 (the usual mixed-precision pattern). A no-op cast in an
    fp32 run; under CPU bf16 autocast it is what makes torch 1.13 run at all (its CPU
    layer_norm refuses a bf16 input with fp32 weights)."""

    def forward(self, x):
        return super().forward(x.float())


class TinyTransformer(nn.Module):
    """Linear embedding -> TransformerEncoder (post-norm, GELU as a module so it is
    recorded, fp32 LayerNorms) -> linear head, on synthetic float input."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(D_IN, D_MODEL)
        layer = nn.TransformerEncoderLayer(d_model=D_MODEL, nhead=NHEAD, dim_feedforward=D_FF,
                                           dropout=0.0, activation=nn.GELU(), batch_first=True)
        layer.norm1 = Fp32LayerNorm(D_MODEL, eps=layer.norm1.eps)
        layer.norm2 = Fp32LayerNorm(D_MODEL, eps=layer.norm2.eps)
        kwargs = {"enable_nested_tensor": False} if "enable_nested_tensor" in \
            nn.TransformerEncoder.__init__.__code__.co_varnames else {}
        self.encoder = nn.TransformerEncoder(layer, num_layers=LAYERS, **kwargs)
        self.head = nn.Linear(D_MODEL, 1)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x))).squeeze(-1)


def batches(n, seed=7):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(D_IN, generator=g)
    out = []
    for _ in range(n):
        x = torch.randn(BATCH, SEQ, D_IN, generator=g)
        out.append((x, (x @ w).tanh()))
    return out


class Run:
    """One watched training run: model, optimizer, Monitor."""

    def __init__(self, endpoint, run, role, experiment, state=None, prepare=None, autocast=None,
                 monitor_kwargs=None):
        self.model = TinyTransformer()
        if state is not None:
            self.model.load_state_dict(state)
        if prepare is not None:
            prepare(self)  # e.g. fault-injection hooks that lockstep must see (before watch)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.autocast = autocast
        self.step_no = 0
        self.losses = []
        self.mon = lockstep.Monitor(run=run, role=role, experiment=experiment, endpoint=endpoint,
                                    strict=True, **(monitor_kwargs or {}))
        assert self.mon.enabled
        self.mon.watch(self.model, optimizer=self.opt)

    def train_step(self, x, y):
        if self.autocast is not None:
            with torch.autocast("cpu", dtype=self.autocast):
                out = self.model(x)
            loss = nn.functional.mse_loss(out.float(), y)
        else:
            loss = nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.mon.step(loss=loss, lr=self.opt.param_groups[0]["lr"])
        self.losses.append(loss.item())
        self.step_no += 1

    def close(self):
        ok = self.mon.close(timeout=10.0)
        counters = self.mon.counters()
        assert counters["python_errors"] == 0, counters["last_python_error"]
        assert counters["records_dropped"] == 0, counters
        return ok


def make_pair(endpoint, experiment, baseline_kwargs=None, candidate_kwargs=None, seed=1234):
    """A baseline and a candidate that start from the same weights."""
    lockstep.seed_all(seed, deterministic=True)
    state = TinyTransformer().state_dict()
    b = Run(endpoint, experiment + "-base", "baseline", experiment, state=state,
            **(baseline_kwargs or {}))
    c = Run(endpoint, experiment + "-cand", "candidate", experiment, state=state,
            **(candidate_kwargs or {}))
    return b, c


def train_pair(b, c, steps, before_candidate_step=None):
    """Alternating steps: baseline step s, then candidate step s, on the same batch."""
    for s, (x, y) in enumerate(batches(steps)):
        b.train_step(x, y)
        if before_candidate_step is not None:
            before_candidate_step(s)
        c.train_step(x, y)


def run_of(alert):
    """The run an alert is about: a per-run rule's run, a pair rule's candidate (the
    alerting JSON lists `runs`: [run] or [baseline, candidate])."""
    runs = alert.get("runs") or [""]
    return runs[-1]


def fmt_alerts(alerts):
    return "\n".join("%s %s step=%s run=%s tensor=%s kind=%s: %s" % (
        a.get("rule"), a.get("severity"), a.get("step"), run_of(a), a.get("tensor"),
        a.get("kind"), a.get("message")) for a in alerts)
