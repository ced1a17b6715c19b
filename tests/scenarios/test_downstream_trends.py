"""Issue 30, item 6f: trends downstream of the first divergence are not alerts.

A small conv net (three conv-BatchNorm-ReLU blocks and a linear head) trained 40 steps;
the candidate's first BatchNorm has eps 2e-5 instead of 1e-5. The first divergence is
that BatchNorm at step 0; from there the difference spreads to everything after it and
grows step by step, which the `trend` rule (a drift growing towards its tolerance) saw in
tensor after tensor: on resnet18 with a changed BatchNorm, 137 of 182 alerts were such
trends. A trend on a rank after its first drifting tensor (or born op) is that divergence
spreading: the pair counts it (`compare --json`: trends_downstream; the text says how
many) and alerts nothing. Measured on this pair (torch 1.13): 6 trends, all downstream,
were 6 of 32 alerts before; now none is listed, 6 are counted. The live alerts file and
`compare` agree, alert for alert.
"""
import collections
import subprocess

import torch
from torch import nn

from scenario_lib import DRIFT_RULES, Run, collect_pair, compare_json, fmt_alerts, seeded_state

C, HW, BATCH, CLASSES, STEPS = 8, 8, 8, 4, 40


class Net(nn.Module):
    def __init__(self, eps=1e-5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, C, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(C, eps=eps)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(C, C, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(C)
        self.conv3 = nn.Conv2d(C, C, 3, padding=1)
        self.bn3 = nn.BatchNorm2d(C)
        self.head = nn.Linear(C, CLASSES)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.bn2(self.conv2(x)))
        x = self.relu(self.bn3(self.conv3(x)))
        return self.head(x.mean(dim=(2, 3)))


class ClassifierRun(Run):
    def loss(self, x, y):
        return nn.functional.cross_entropy(self.model(x), y)


def make_run(state, eps=1e-5):
    def make(endpoint, run, role, experiment):
        model = Net(eps)
        model.load_state_dict(state)
        return ClassifierRun(endpoint, run, role, experiment, model=model)
    return make


def data():
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(BATCH, 3, HW, HW, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g))
            for _ in range(STEPS)]


def identity(a):
    return (a["rule"], a["step"], a["rank"], a.get("micro_step", 0), a["tensor"], a["kind"], a["severity"])


def test_trends_downstream_of_the_first_divergence_are_counted_not_alerted(tmp_path):
    state = seeded_state(Net)
    alerts, col, _, _ = collect_pair(tmp_path, "bn", make_run(state), make_run(state, eps=2e-5), data())
    text = fmt_alerts(alerts)
    assert {a["rule"] for a in alerts} <= DRIFT_RULES | {"setup"}, text
    fd = [a for a in alerts if a["rule"] == "first_divergence"]
    assert len(fd) == 1 and (fd[0]["tensor"], fd[0]["step"]) == ("bn1", 0), text
    assert [a for a in alerts if a["rule"] == "trend"] == [], text

    code, rep = compare_json(col, "bn")
    assert code == 1, rep["verdict"]
    assert rep["trends_downstream"] >= 3, rep["trends_downstream"]  # 6 measured; torch versions differ
    live = collections.Counter(identity(a) for a in alerts)
    offline = collections.Counter(identity(a) for a in rep["alerts"])
    assert live == offline, (live - offline, offline - live)
    out = subprocess.run([col.exe, "compare", col.log_path("bn-base"), col.log_path("bn-cand")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert ("  and %d trend(s) downstream of the first divergence, counted in it, not listed as alerts"
            % rep["trends_downstream"]) in out.stdout, out.stdout
