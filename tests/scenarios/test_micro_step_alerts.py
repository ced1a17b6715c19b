"""Issue 30, item 4: micro steps in alert identity.

A classifier trained with gradient accumulation (4 micro batches a step). The candidate
gets a different label for the first sample of micro batches 1, 2 and 3 of step 0, so
the gradients of three micro steps drift while every forward tensor of step 0 agrees;
from step 1 on the weights differ and everything drifts, in every micro step.

Each micro step's tensor is its own finding: the live alerts file (a real collector
with the default 300 s dedup cooldown) and `lockstep compare --json` of the same logs
must give the same multiset of (rule, step, rank, micro step, tensor, kind, severity),
no id may repeat, and micro steps 1..3 must have alerts of their own. Before the micro
step was in the dedup key and the id, the sink's cooldown swallowed micro steps 1..3
of each tensor live and compare repeated ids: measured on this very pair (3 steps, the
collector built before the fix), 22 alerts live where compare had 80, 40 of compare's
ids repeated; after it, 80 and 80, none repeated.
The first divergence is the changed label's gradient at step 0, micro step 1, cause
`data`, and the live one is compare's.
"""
import collections
import json
import subprocess

import torch
from torch import nn

from scenario_lib import DRIFT_RULES, AccumRun, collect_pair, compare_json, fmt_alerts, seeded_state

D_IN, D_H, CLASSES, BATCH, MICRO = 10, 16, 5, 8, 4
STEPS = 3
RELABELED = (1, 2, 3)  # micro batches of step 0 whose first label the candidate changes
# tensor_drift keeps the earliest 5 new drifts per step by default: micro step 0 would
# fill that at every step. Every alert here, so each micro step shows; compare reads
# the flag back from the settings recorded next to the logs.
MAX_ALERTS = 1000


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(D_IN, D_H), nn.Tanh(), nn.Linear(D_H, D_H), nn.ReLU())
        self.out = nn.Linear(D_H, CLASSES)

    def forward(self, x):
        return self.out(self.body(x))


def micro_batches(steps, seed=11):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(BATCH, D_IN, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g))
             for _ in range(MICRO)] for _ in range(steps)]


class RelabelRun(AccumRun):
    """One optimizer step per MICRO micro batches; `relabel`: the micro batches of step 0
    whose first sample's label is shifted by one class."""

    def __init__(self, *args, relabel=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.relabel = relabel

    def micro_loss(self, m, x, label):  # pylint: disable=arguments-differ
        if self.step_no == 0 and m in self.relabel:
            label = label.clone()
            label[0] = (label[0] + 1) % CLASSES
        return nn.functional.cross_entropy(self.model(x), label)


def make_run(state, relabel=()):
    def make(endpoint, run, role, experiment):
        model = Classifier()
        model.load_state_dict(state)
        return RelabelRun(endpoint, run, role, experiment, model=model, relabel=relabel)
    return make


def identity(a):
    return (a["rule"], a["step"], a["rank"], a.get("micro_step", 0), a["tensor"], a["kind"], a["severity"])


def id_but_experiment(a):
    rule, _, rest = a["id"].split("/", 2)
    return rule + "/" + rest


def test_each_micro_step_is_its_own_alert_live_and_offline(tmp_path):
    state = seeded_state(Classifier)
    alerts, col, _, _ = collect_pair(tmp_path, "micro", make_run(state), make_run(state, relabel=RELABELED),
                                     [(mb,) for mb in micro_batches(STEPS)],
                                     extra_args=["--max-tensor-alerts", str(MAX_ALERTS)])
    text = fmt_alerts(alerts)
    # torch 2.x's agent also sends the step's gradient norm: the `scalars` rule sees it.
    assert {a["rule"] for a in alerts} <= DRIFT_RULES | {"scalars"}, text

    # Live == compare, as a multiset of identities, and neither repeats an id.
    code, rep = compare_json(col, "micro")
    assert code == 1, rep["verdict"]
    offline = rep["alerts"]
    live_ids = collections.Counter(identity(a) for a in alerts)
    offline_ids = collections.Counter(identity(a) for a in offline)
    assert live_ids == offline_ids, (live_ids - offline_ids, offline_ids - live_ids)
    for side in (alerts, offline):
        ids = collections.Counter(a["id"] for a in side)
        assert [i for i, n in ids.items() if n > 1] == [], text
    # compare names the experiment "compare"; the rest of each id is the live one.
    assert sorted(map(id_but_experiment, alerts)) == sorted(map(id_but_experiment, offline))
    # The id names the micro step (micro step 0 keeps the key it had without accumulation).
    for a in alerts:
        m = a.get("micro_step", 0)
        assert a["id"] == a["dedup_key"] + "@%d" % a["step"], a["id"]
        assert a["dedup_key"].endswith("/micro%d" % m if m else "/rank%d" % a["rank"]), a["id"]

    # Micro steps 1..3 have alerts of their own, already at step 0 (the relabeled batches),
    # and micro step 0 of step 0 (same label, same weights) has no tensor's (the loss, a
    # scalar of the whole step, is micro step 0's, as is torch 2.x's gradient norm).
    micros = collections.Counter((a["step"], a.get("micro_step", 0)) for a in alerts)
    for m in RELABELED:
        assert micros[(0, m)] > 0, sorted(micros.items())
        assert any(a.get("micro_step", 0) == m for a in alerts if a["step"] > 0), sorted(micros.items())
    first = [a for a in alerts if (a["step"], a.get("micro_step", 0)) == (0, 0)]
    assert [a for a in first if a["kind"] not in ("loss", "scalar")] == [], text
    # One tensor drifting in several micro steps of one step: several alerts, not one.
    per_tensor = collections.Counter((a["rule"], a["tensor"], a["kind"]) for a in alerts if a["step"] == 0)
    assert max(per_tensor.values()) >= len(RELABELED), per_tensor

    # The incident does not split per micro step: one cause, one incident.
    assert len({a["incident"] for a in alerts if a["rule"] in DRIFT_RULES}) == 1, text

    # The culprit: the changed label's gradient at step 0, micro step 1, a data cause.
    fd = [a for a in alerts if a["rule"] == "first_divergence"]
    assert len(fd) == 1, text
    fd = fd[0]
    assert (fd["step"], fd.get("micro_step", 0)) == (0, 1), text
    assert fd["kind"] == "act_grad" and fd["tensor"] == "out", text
    assert fd["cause"] == "data", text
    cfd = rep["first_divergence"]
    assert id_but_experiment(fd) == id_but_experiment(cfd)
    keys = ("step", "micro_step", "tensor", "kind", "cause", "message")
    assert {k: fd.get(k) for k in keys} == {k: cfd.get(k) for k in keys}

    # The text report counts the same alerts.
    out = subprocess.run([col.exe, "compare", col.log_path("micro-base"), col.log_path("micro-cand")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "\nalerts: %d " % len(alerts) in out.stdout, out.stdout
    print(json.dumps(sorted(micros.items())))
