"""Issue 15: the collector says why two runs differ (setup, data, initial weights,
hyperparameters) before blaming a layer. Small real training loops (an MLP with a
dropout in each block, token-id input through an embedding) into a real collector;
each scenario checks the rule and the first divergence's cause at the right step, and
that no op is blamed."""
import json
import subprocess

import torch
from torch import nn

from scenario_lib import Collector, fmt_alerts, free_port

import lockstep

STEPS = 10
VOCAB, DIM, SEQ, BATCH = 32, 16, 8, 4


class Block(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)
        self.act = nn.GELU()
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.act(self.fc(x)))


class TinyLM(nn.Module):
    def __init__(self, drop=(0.0, 0.0)):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(p) for p in drop)
        self.head = nn.Linear(DIM, 1)

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x).mean(dim=(1, 2))


def data(n):
    g = torch.Generator().manual_seed(3)
    return [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randn(BATCH, generator=g))
            for _ in range(n)]


class Side:
    def __init__(self, endpoint, run, role, seed=1, drop=(0.0, 0.0), wd=0.01, lr=None,
                 torch_version=None):
        lockstep.seed_all(seed)
        self.model = TinyLM(drop)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=wd)
        self.lr = lr or (lambda s: 1e-3)
        self.mon = lockstep.Monitor(run=run, role=role, experiment="why", endpoint=endpoint,
                                    strict=True, config={"batch_size": BATCH})
        real_version = torch.__version__
        if torch_version is not None:  # what the fingerprint reads, as on another install
            torch.__version__ = torch_version
        try:
            self.mon.watch(self.model, optimizer=self.opt)
        finally:
            torch.__version__ = real_version

    def step(self, s, ids, y):
        for g in self.opt.param_groups:
            g["lr"] = self.lr(s)
        loss = nn.functional.mse_loss(self.model(ids), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.mon.step(loss=loss, lr=self.opt.param_groups[0]["lr"])

    def close(self):
        assert self.mon.close(timeout=10.0)
        c = self.mon.counters()
        assert c["python_errors"] == 0, c["last_python_error"]


def run_pair(tmp_path, base=None, cand=None, skip_at=None, live=None):
    """Baseline and candidate side by side on the same batches (the candidate's loader
    skips one batch at `skip_at`); returns the alerts and `compare --json`. live(col,
    view endpoint) runs while the collector still serves /metrics and the view feed."""
    view = "tcp://127.0.0.1:%d" % free_port()
    with Collector(tmp_path, extra_args=["--view-listen", view], metrics=live is not None) as col:
        b = Side(col.endpoint, "why-base", "baseline", **(base or {}))
        c = Side(col.endpoint, "why-cand", "candidate", **(cand or {}))
        batches = data(STEPS + 1)
        cand_batches = batches[:skip_at] + batches[skip_at + 1:] if skip_at is not None else batches
        for s in range(STEPS):
            b.step(s, *batches[s])
            c.step(s, *cand_batches[s])
        b.close()
        c.close()
        col.wait_goodbye(["why-base", "why-cand"])
        if live is not None:
            live(col, view)
    assert col.proc.returncode == 0, col.stderr()
    out = subprocess.run([col.exe, "compare", "--json", col.log_path("why-base"),
                          col.log_path("why-cand")], capture_output=True, text=True, timeout=60)
    return col.alerts(), json.loads(out.stdout), col


def first_div(alerts):
    fd = [a for a in alerts if a["rule"] == "first_divergence"]
    assert len(fd) == 1, fmt_alerts(alerts)
    return fd[0]


def setup_alerts(alerts):
    return [a for a in alerts if a["rule"] == "setup"]


def test_twins_have_no_setup_alert(tmp_path):
    alerts, report, _ = run_pair(tmp_path)
    assert alerts == [], fmt_alerts(alerts)
    assert report["setup"]["known"] is True and report["setup"]["differences"] == []


def test_other_init_seed_is_weights_at_step_0(tmp_path):
    alerts, report, _ = run_pair(tmp_path, cand={"seed": 2})
    fd = first_div(alerts)
    assert fd["cause"] == "weights" and fd["step"] == 0 and fd["kind"] == "param", fmt_alerts(alerts)
    # The seed itself is a setting that differs (seed_all's value), said at pairing.
    s = setup_alerts(alerts)
    assert len(s) == 1 and "seed.value 1 vs 2" in s[0]["message"], fmt_alerts(alerts)
    assert report["first_divergence"]["cause"] == "weights"


def test_skipped_batch_is_data_at_step_7(tmp_path):
    alerts, _, _ = run_pair(tmp_path, skip_at=7)
    fd = first_div(alerts)
    assert fd["cause"] == "data" and fd["step"] == 7, fmt_alerts(alerts)
    assert fd["kind"] == "input", fmt_alerts(alerts)
    assert setup_alerts(alerts) == []


def test_weight_decay_is_config_at_pairing(tmp_path):
    seen = {}

    def live(col, view):
        seen["metrics"] = col.metrics_text()
        r = subprocess.run([col.exe, "top", "--once", "--connect", view], capture_output=True,
                           text=True, timeout=30)
        seen["top"] = r.stdout + r.stderr

    alerts, report, col = run_pair(tmp_path, cand={"wd": 0.1}, live=live)
    labels = 'experiment="why",baseline="why-base",candidate="why-cand"'
    assert 'lockstep_pair_setup_differences{%s,severity="warning"} 1' % labels in seen["metrics"], \
        [x for x in seen["metrics"].splitlines() if "setup" in x]
    assert "setup: 1 setting differs" in seen["top"] and "weight_decay" in seen["top"], seen["top"]
    text = subprocess.run([col.exe, "compare", col.log_path("why-base"), col.log_path("why-cand")],
                          capture_output=True, text=True, timeout=60).stdout
    assert "SETUP: 1 setting(s) differ" in text and "optim.group0.weight_decay: 0.01 vs 0.1" in text, text
    assert "cause: config" in text, text
    s = setup_alerts(alerts)
    assert len(s) == 1 and s[0]["severity"] == "warning" and s[0]["step"] == 0, fmt_alerts(alerts)
    assert "optim.group0.weight_decay 0.01 vs 0.1" in s[0]["message"]
    fd = first_div(alerts)
    assert fd["cause"] == "config" and "weight_decay" in fd["message"], fmt_alerts(alerts)
    diffs = report["setup"]["differences"]
    assert [d["key"] for d in diffs] == ["optim.group0.weight_decay"], diffs


def test_lr_warmup_is_the_lr_rule_where_it_differs(tmp_path):
    warm_b = lambda s: 1e-3 * min(1.0, (s + 1) / 4)  # noqa: E731
    warm_c = lambda s: 1e-3 * min(1.0, (s + 1) / 8)  # noqa: E731  (equal at step 0? no: 1/4 vs 1/8)
    warm_c2 = lambda s: warm_b(s) if s < 3 else warm_c(s)  # noqa: E731  differs from step 3
    alerts, _, _ = run_pair(tmp_path, base={"lr": warm_b}, cand={"lr": warm_c2})
    lr = [a for a in alerts if a["rule"] == "scalars" and a["tensor"] == "lr"]
    assert len(lr) == 1 and lr[0]["step"] == 3, fmt_alerts(alerts)
    assert lr[0]["message"].startswith("lr differs from step 3: ")
    fd = first_div(alerts)
    assert fd["cause"] == "config" and fd["step"] >= 3 and "lr differs" in fd["message"], fmt_alerts(alerts)


def test_dropout_p_is_config_naming_the_module(tmp_path):
    alerts, _, _ = run_pair(tmp_path, cand={"drop": (0.0, 0.1)})
    s = setup_alerts(alerts)
    assert len(s) == 1 and "module.blocks.1.drop.p 0.0 vs 0.1" in s[0]["message"], fmt_alerts(alerts)
    fd = first_div(alerts)
    assert fd["cause"] == "config" and "module.blocks.1.drop.p" in fd["message"], fmt_alerts(alerts)


def test_another_torch_version_alone_is_info(tmp_path):
    alerts, report, _ = run_pair(tmp_path, cand={"torch_version": "9.9.9"})
    assert [a["rule"] for a in alerts] == ["setup"], fmt_alerts(alerts)
    assert alerts[0]["severity"] == "info"
    assert "version.torch %s vs 9.9.9" % torch.__version__ in alerts[0]["message"]
    assert [(d["key"], d["category"]) for d in report["setup"]["differences"]] == [
        ("version.torch", "environment")]
