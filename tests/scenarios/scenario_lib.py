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
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

torch.set_num_threads(1)

import lockstep  # noqa: E402  (after set_num_threads)

D_IN, D_MODEL, NHEAD, D_FF, LAYERS, SEQ, BATCH = 16, 32, 4, 64, 2, 16, 8
# The rules that judge two runs' numbers apart (a change in a model may raise any of
# them); every other rule (nonfinite, overflow, ...) firing means something else broke.
DRIFT_RULES = {"first_divergence", "tensor_drift", "trend", "loss_drift"}


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
    the logs go, `control` serves the control channel (off otherwise)."""

    def __init__(self, tmp_dir, extra_args=(), listen="tcp://127.0.0.1:*", metrics=False,
                 prefix=(), data_dir=None, control=False):
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
        if not control:
            # No control channel unless a test asks for one: a zoom or capture the
            # collector asks for lands wherever the runs are when it arrives, and the
            # scenarios of other features must not depend on that timing.
            args += ["--control-listen", "off"]
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
    """One watched training run: model, AdamW (lr 1e-3), Monitor (strict), watched as
    README.md shows it. The model is a TinyTransformer unless `model` is given (then it is
    built, hooked and seeded by the caller: whatever must be seen by lockstep, such as
    fault or noise hooks, is registered before this watch()). train_step's arguments are
    passed to loss(); a run of another kind of model overrides loss()."""

    def __init__(self, endpoint, run, role, experiment, state=None, prepare=None, autocast=None,
                 monitor_kwargs=None, model=None):
        self.model = TinyTransformer() if model is None else model
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

    def loss(self, x, y):
        """MSE of the model's output against y, the forward under CPU autocast if set."""
        if self.autocast is not None:
            with torch.autocast("cpu", dtype=self.autocast):
                out = self.model(x)
            return nn.functional.mse_loss(out.float(), y)
        return nn.functional.mse_loss(self.model(x), y)

    def train_step(self, *batch):
        loss = self.loss(*batch)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.mon.step(loss=loss, lr=self.opt.param_groups[0]["lr"])
        self.losses.append(loss.item())
        self.step_no += 1

    def close(self):
        return close_checked(self.mon)


class AccumRun(Run):
    """Gradient accumulation: train_step(micro) runs backward on each micro batch of the
    step (micro_loss(m, *micro[m]) / len(micro)), then one optimizer step and one
    mon.step with the summed loss. A subclass gives only micro_loss."""

    def micro_loss(self, m, *batch):
        raise NotImplementedError

    def train_step(self, micro):  # pylint: disable=arguments-differ
        total = 0.0
        for m, batch in enumerate(micro):
            loss = self.micro_loss(m, *batch) / len(micro)
            loss.backward()
            total += loss.item()
        self.opt.step()
        self.opt.zero_grad()
        self.mon.step(loss=torch.tensor(total), lr=self.opt.param_groups[0]["lr"])
        self.losses.append(total)
        self.step_no += 1


class Heads(nn.Module):
    """Two heads over one hidden size: `cls` (classes logits) and `reg` (one value)."""

    def __init__(self, d_h, classes):
        super().__init__()
        self.cls = nn.Linear(d_h, classes)
        self.reg = nn.Linear(d_h, 1)


class LMRun(Run):
    """A run of a causal language model (transformers' *ForCausalLM, or one wrapped in
    DistributedDataParallel): train_step(ids) with `loss = model(input_ids=ids,
    labels=ids).loss`, exactly as README.md writes it."""

    def loss(self, ids):  # pylint: disable=arguments-differ
        return self.model(input_ids=ids, labels=ids).loss


def close_checked(mon):
    """Closes a Monitor (10 s to flush) and asserts the agent made no Python error and
    dropped no record: a test's alerts then come from every record. Returns close()'s
    result (True when everything was sent)."""
    ok = mon.close(timeout=10.0)
    counters = mon.counters()
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


def collect_pair(tmp_path, exp, make_base, make_cand, batches_, extra_args=()):
    """Runs <exp>-base (role baseline) and <exp>-cand (candidate), built by
    make_base / make_cand(endpoint, run, role) in that order, side by side on the same
    batches (baseline step s, then candidate step s; each batch a tuple of train_step's
    arguments) into a real collector (`extra_args` for `lockstep collect`); closes both
    and waits until the collector has analyzed every message. Returns (alerts, collector,
    baseline, candidate); the collector is stopped, its logs kept (col.log_path(run))."""
    with Collector(tmp_path, list(extra_args)) as col:
        b = make_base(col.endpoint, exp + "-base", "baseline", exp)
        c = make_cand(col.endpoint, exp + "-cand", "candidate", exp)
        for batch in batches_:
            b.train_step(*batch)
            c.train_step(*batch)
        assert b.close() and c.close()
        col.wait_goodbye([exp + "-base", exp + "-cand"])
    assert col.proc.returncode == 0, col.stderr()
    return col.alerts(), col, b, c


def compare_json(col, exp):
    """`lockstep compare --json` of <exp>-base and <exp>-cand's logs: (exit code, report).
    Exit 0 means nothing critical, 1 a finding; anything else fails the test."""
    out = subprocess.run([col.exe, "compare", "--json", col.log_path(exp + "-base"),
                          col.log_path(exp + "-cand")], capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 1), out.stdout + out.stderr
    return out.returncode, json.loads(out.stdout)


def births_at(rep, step=0):
    """compare --json's ranked ops ("births") at one step of rank 0; [] if none."""
    rows = [b for b in rep.get("births", []) if b["step"] == step and b["rank"] == 0]
    assert len(rows) <= 1, rows
    return rows[0]["ops"] if rows else []


def show_births(label, ops):
    """Prints the first 8 ranked ops (seen with pytest -s): the figures a test file's
    header quotes as measured."""
    print("\n%s (torch %s):" % (label, torch.__version__))
    for o in ops[:8]:
        print("  %-22s %-8s born=%-5s ratio %.3g  in %.3g  out %.3g" % (
            o["name"], o["pass"], o["born"], o["ratio"], o["input_error"], o["output_error"]))


def _rank_main(rank, world, port, errors, worker, args):
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                                world_size=world)
        worker(rank, *args)
        dist.destroy_process_group()
    except BaseException as e:  # reported to the parent, which fails the test
        errors.put("rank %d: %s: %s" % (rank, type(e).__name__, e))
        raise


def collect_ranks(tmp_path, monkeypatch, world, worker, runs):
    """Starts a real collector, then runs worker(rank, endpoint) in `world` spawned
    processes (torch.multiprocessing), each in a gloo process group over a free loopback
    port, one thread each, and waits until the collector has analyzed every message of
    `runs` (run names). The launcher's rank variables are cleared first, so each Monitor
    takes its rank from the group. An exception in a worker fails the test with its rank
    and text. `worker` must be a module-level function (spawn pickles it by name).
    Returns (alerts, collector); the collector is stopped, its logs kept."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCKSTEP_RANK", "LOCKSTEP_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with Collector(tmp_path) as col:
        errors = mp.get_context("spawn").SimpleQueue()
        mp.spawn(_rank_main, args=(world, free_port(), errors, worker, (col.endpoint,)),
                 nprocs=world, join=True)
        assert errors.empty()
        col.wait_goodbye(runs)
    assert col.proc.returncode == 0, col.stderr()
    return col.alerts(), col


def seeded_state(new_model, seed=1234):
    """Seeds everything (lockstep.seed_all, deterministic) and returns the weights of the
    model new_model() builds then: the one start a baseline and a candidate both load."""
    lockstep.seed_all(seed, deterministic=True)
    return new_model().state_dict()


def step0_births(tmp_path, exp, new_model, make_run, batches_, label, **cand):
    """A pair from one seeded start (seeded_state(new_model)): make_run(state) is the
    baseline's factory for collect_pair, make_run(state, **cand) the candidate's. Prints
    compare --json's ranked ops at step 0 under `label` (pytest -s: the figures a test
    file's header quotes). Returns (alerts, those ops)."""
    state = seeded_state(new_model)
    alerts, col, _, _ = collect_pair(tmp_path, exp, make_run(state), make_run(state, **cand),
                                     batches_)
    ops = births_at(compare_json(col, exp)[1], 0)
    show_births(label, ops)
    return alerts, ops


def one_first_divergence(alerts, rules=DRIFT_RULES):
    """Asserts that only `rules` fired and that there is exactly one first_divergence
    alert (the birth point of a change); returns it."""
    text = fmt_alerts(alerts)
    assert {a["rule"] for a in alerts} <= rules, text
    fd = [a for a in alerts if a["rule"] == "first_divergence"]
    assert len(fd) == 1, text
    return fd[0]


def run_of(alert):
    """The run an alert is about: a per-run rule's run, a pair rule's candidate (the
    alerting JSON lists `runs`: [run] or [baseline, candidate])."""
    runs = alert.get("runs") or [""]
    return runs[-1]


def fmt_alerts(alerts):
    return "\n".join("%s %s step=%s run=%s tensor=%s kind=%s: %s" % (
        a.get("rule"), a.get("severity"), a.get("step"), run_of(a), a.get("tensor"),
        a.get("kind"), a.get("message")) for a in alerts)
