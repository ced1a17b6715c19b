"""Issue 30, item 5: a run resumed under a new run id, with a learning-rate schedule.

A small MLP trained with AdamW (lr 1e-3) and StepLR (halves the lr every 2 steps). The
baseline trains steps 0..7 in one go; the candidate trains steps 0..3 as run
`resume-cand`, saves model, optimizer and scheduler, and a second Monitor (run
`resume-cand2`, start_step=4) loads them and trains steps 4..7: the same training, so
the pair (baseline, resume-cand2) must be silent. Its fingerprint is read at step 4,
where the scheduled lr is 0.00025, the baseline's at step 0 (0.001): before the
fingerprint said at which step it was read, that pair got the setup warning
"optim.group0.lr 0.001 vs 0.00025". The lr is compared step by step by the scalars
rule (step(lr=) is given) and the scheduler's base lr (initial_lr) stays compared.

A real lr difference read at the same step (a second experiment: the candidate starts
at lr 2e-3) still warns, naming optim.group0.lr. In both experiments the live alerts
file and `lockstep compare --json` give the same multiset of alerts.
"""
import collections
import json
import subprocess

import torch
from torch import nn

from scenario_lib import Collector, fmt_alerts, run_of, seeded_state

import lockstep

D_IN, D_H, BATCH = 8, 16, 4
STEPS, RESUME_AT = 8, 4


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D_IN, D_H)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(D_H, 1)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))).squeeze(-1)


def data():
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(BATCH, D_IN, generator=g), torch.randn(BATCH, generator=g)) for _ in range(STEPS)]


class Job:
    """One process's training: model, AdamW, StepLR, a Monitor watching them (made after
    the state is loaded, as a resumed job does). `resume`: the state a job before it saved."""

    def __init__(self, endpoint, run, role, experiment, state, lr=1e-3, resume=None, start_step=0):
        self.model = MLP()
        self.model.load_state_dict(state)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5)
        if resume is not None:
            self.model.load_state_dict(resume["model"])
            self.opt.load_state_dict(resume["opt"])
            self.sched.load_state_dict(resume["sched"])
        self.mon = lockstep.Monitor(run=run, role=role, experiment=experiment, endpoint=endpoint,
                                    strict=True, start_step=start_step)
        self.mon.watch(self.model, optimizer=self.opt)

    def train_step(self, x, y):
        loss = nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        lr = self.opt.param_groups[0]["lr"]  # the lr this step's update uses
        self.opt.step()
        self.opt.zero_grad()
        self.sched.step()
        self.mon.step(loss=loss, lr=lr)

    def save(self):
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(),
                "sched": self.sched.state_dict()}

    def close(self):
        ok = self.mon.close(timeout=10.0)
        assert self.mon.counters()["python_errors"] == 0, self.mon.counters()["last_python_error"]
        return ok


def identity(a):
    return (a["rule"], a["step"], a["rank"], a.get("micro_step", 0), a["tensor"], a["kind"], a["severity"],
            tuple(a.get("runs", [])))


def compare(col, base, cand, *flags):
    out = subprocess.run([col.exe, "compare", *flags, col.log_path(base), col.log_path(cand)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode in (0, 1), out.stdout + out.stderr
    assert "not paired" not in out.stderr, out.stderr  # the baseline is known before the candidate
    return out


def test_a_resumed_schedule_is_no_setup_difference_but_a_different_lr_is(tmp_path):
    state = seeded_state(MLP)
    batches = data()
    with Collector(tmp_path) as col:
        base = Job(col.endpoint, "resume-base", "baseline", "resume", state)
        cand = Job(col.endpoint, "resume-cand", "candidate", "resume", state)
        lr_base = Job(col.endpoint, "lr-base", "baseline", "lr", state)
        lr_cand = Job(col.endpoint, "lr-cand", "candidate", "lr", state, lr=2e-3)
        for s in range(RESUME_AT):
            for job in (base, cand, lr_base, lr_cand):
                job.train_step(*batches[s])
        saved = cand.save()
        assert cand.close()
        # The resumed job: a new run id, start_step where the first one stopped.
        cand2 = Job(col.endpoint, "resume-cand2", "candidate", "resume", state, resume=saved,
                    start_step=RESUME_AT)
        assert cand2.opt.param_groups[0]["lr"] == 0.00025
        for s in range(RESUME_AT, STEPS):
            for job in (base, cand2, lr_base, lr_cand):
                job.train_step(*batches[s])
        for job in (base, cand2, lr_base, lr_cand):
            assert job.close()
        col.wait_goodbye(["resume-base", "resume-cand", "resume-cand2", "lr-base", "lr-cand"])
    assert col.proc.returncode == 0, col.stderr()
    alerts = col.alerts()
    text = fmt_alerts(alerts)

    # The resume: both halves are the baseline's training, not a single alert.
    resumed = [a for a in alerts if run_of(a) in ("resume-cand", "resume-cand2")]
    assert resumed == [], text
    out = compare(col, "resume-base", "resume-cand2")
    assert out.returncode == 0, out.stdout
    assert "setup: the same (no setting differs)" in out.stdout, out.stdout
    assert ("note: the fingerprints were read at step 0 vs %d (a run resumed under its own run id): "
            "the optimizer's scheduled values (lr, momentum, betas) are not compared "
            "(optim.group0.lr 0.001 vs 0.00025)" % RESUME_AT) in out.stdout, out.stdout
    rep = json.loads(compare(col, "resume-base", "resume-cand2", "--json").stdout)
    assert rep["setup"]["differences"] == [] and rep["alerts"] == [], rep["setup"]
    assert rep["steps_compared"] == STEPS - RESUME_AT

    # The same lr at the same step is a setting that differs: warned, as before.
    setup = [a for a in alerts if a["rule"] == "setup" and a["runs"] == ["lr-base", "lr-cand"]]
    assert len(setup) == 1, text
    assert setup[0]["severity"] == "warning", text
    assert "optim.group0.lr 0.001 vs 0.002" in setup[0]["message"], setup[0]["message"]
    assert "optim.group0.initial_lr 0.001 vs 0.002" in setup[0]["message"], setup[0]["message"]
    assert "read at step" not in setup[0]["message"], setup[0]["message"]
    lr = [a for a in alerts if a["rule"] == "scalars" and a["tensor"] == "lr"]
    assert [(a["runs"], a["step"]) for a in lr] == [(["lr-base", "lr-cand"], 0)], text

    # Live == compare, as multisets (compare names the runs as the logs do).
    rep = json.loads(compare(col, "lr-base", "lr-cand", "--json").stdout)
    live = collections.Counter(identity(a) for a in alerts if run_of(a) == "lr-cand"
                               or a.get("runs") == ["lr-base"])
    offline = collections.Counter(identity(a) for a in rep["alerts"])
    assert live == offline, (live - offline, offline - live)
