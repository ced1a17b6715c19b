"""Zoom (Monitor.zoom): the calls in a module's own code as rows of their own, so that a
container "born in its own code" is refined to the call where the error is born.

Model: two pre-norm blocks, each an attention whose scores, softmax and mixing are
functional calls in its own forward (no softmax module) and an MLP whose activation is
a functional GELU in its own forward (fc1 -> F.gelu -> fc2). fp32 on CPU; both runs zoom
the same module from step 0 for 2 steps (both run the same code, so the calls pair by
name: `blocks.1.mlp/gelu#0` is the first gelu of blocks.1.mlp's forward).

- tanh-GELU in blocks.1.mlp's own code (candidate): without a zoom the birth point is
  blocks.1.mlp itself; zoomed, it is `blocks.1.mlp/gelu#0`, and the first divergence
  names it; live == compare.
- a softmax computed in fp16 in blocks.1.attn's own code (candidate; one call,
  `softmax(scores, -1, dtype=float16)`: torch >= 2.0, CPU fp16 softmax): zoomed, the
  birth point is `blocks.1.attn/softmax#0`.
- twins, zoomed: no alert, and the zoom's rows are there only for its steps.
"""
import json
import math
import subprocess

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from scenario_lib import DRIFT_RULES, Run, births_at, collect_pair, compare_json, fmt_alerts, seeded_state

D, HEADS, SEQ, BATCH = 16, 2, 6, 4
STEPS = 3
ZOOM_STEPS = 2


class Attention(nn.Module):
    def __init__(self, softmax_fp16=False):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.softmax_fp16 = softmax_fp16

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (z.reshape(b, t, HEADS, D // HEADS).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(D // HEADS)
        if self.softmax_fp16:
            w = torch.softmax(scores, -1, dtype=torch.float16).float()
        else:
            w = torch.softmax(scores, -1)
        return self.proj((w @ v).transpose(1, 2).reshape(b, t, D))


class Mlp(nn.Module):
    def __init__(self, tanh_gelu=False, gelu_grad_scale=None):
        super().__init__()
        self.fc1 = nn.Linear(D, 2 * D)
        self.fc2 = nn.Linear(2 * D, D)
        self.approximate = "tanh" if tanh_gelu else "none"
        self.gelu_grad_scale = gelu_grad_scale

    def forward(self, x):
        h = F.gelu(self.fc1(x), approximate=self.approximate)
        if self.gelu_grad_scale is not None and h.requires_grad:
            # A backward that differs while the forward is the same (a platform's GELU
            # backward kernel): what the gelu call passes on is scaled, what it received
            # is not (this hook runs after the one that records what it received).
            h.register_hook(lambda g: g * self.gelu_grad_scale)
        return self.fc2(h)


class Block(nn.Module):
    def __init__(self, **change):
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.attn = Attention(change.get("softmax_fp16", False))
        self.ln2 = nn.LayerNorm(D)
        self.mlp = Mlp(change.get("tanh_gelu", False), change.get("gelu_grad_scale"))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Net(nn.Module):
    def __init__(self, change1=None):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block(**(change1 or {})))
        self.head = nn.Linear(D, 1)

    def forward(self, x):
        return self.head(self.blocks(x)).squeeze(-1)


def batches(n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, SEQ, D, generator=g), torch.randn(BATCH, SEQ, generator=g))
            for _ in range(n)]


def zoom_run(state, zoom=None, monitor_kwargs=None, **change1):
    def make(endpoint, run, role, experiment):
        model = Net(change1)
        model.load_state_dict(state)
        r = Run(endpoint, run, role, experiment, model=model, monitor_kwargs=monitor_kwargs)
        if zoom is not None:
            assert r.mon.zoom(zoom, steps=ZOOM_STEPS)
        return r
    return make


def pair(tmp_path, exp, zoom, **change1):
    tmp_path.mkdir(parents=True, exist_ok=True)
    state = seeded_state(Net)
    alerts, col, b, c = collect_pair(tmp_path, exp, zoom_run(state, zoom),
                                     zoom_run(state, zoom, **change1), batches(STEPS))
    return alerts, col, compare_json(col, exp)[1]


def born(ops):
    return [o["name"] for o in ops if o["born"]]


def first_divergence(alerts):
    fd = [a for a in alerts if a["rule"] == "first_divergence"]
    assert len(fd) == 1, fmt_alerts(alerts)
    return fd[0]


def test_zoom_names_the_gelu_call_in_the_mlps_own_code(tmp_path):
    _, _, rep = pair(tmp_path / "plain", "zoom-off", None, tanh_gelu=True)
    assert born(births_at(rep))[:1] == ["blocks.1.mlp"], births_at(rep)[:4]

    alerts, _, rep = pair(tmp_path / "zoomed", "zoom-gelu", "blocks.1.mlp", tanh_gelu=True)
    ops = births_at(rep)
    assert born(ops)[:1] == ["blocks.1.mlp/gelu#0"], ops[:4]
    assert "blocks.1.mlp" not in born(ops), ops[:4]
    fd = first_divergence(alerts)
    assert fd["tensor"] == "blocks.1.mlp/gelu#0" and fd["step"] == 0, fmt_alerts(alerts)
    offline = [a for a in rep["alerts"] if a["rule"] == "first_divergence"]
    assert [(a["tensor"], a["step"]) for a in offline] == [(fd["tensor"], fd["step"])]


def test_zoom_names_the_call_whose_backward_differs(tmp_path):
    """The gradients the zoomed calls receive are recorded (act_grad rows of the call), so
    a backward born in a container's own code is refined to the call."""
    _, _, rep = pair(tmp_path / "plain", "zoom-bwd-off", None, gelu_grad_scale=1.01)
    ops = births_at(rep)
    assert born(ops)[:1] == ["blocks.1.mlp"] and ops[0]["pass"] == "backward", ops[:4]

    alerts, col, rep = pair(tmp_path / "zoomed", "zoom-bwd", "blocks.1.mlp", gelu_grad_scale=1.01)
    ops = births_at(rep)
    assert born(ops)[:1] == ["blocks.1.mlp/gelu#0"] and ops[0]["pass"] == "backward", ops[:4]
    assert "blocks.1.mlp" not in born(ops), ops[:4]
    fd = first_divergence(alerts)
    assert (fd["tensor"], fd["step"]) == ("blocks.1.mlp/gelu#0", 0), fmt_alerts(alerts)
    assert "the backward of blocks.1.mlp/gelu#0" in fd["message"], fd["message"]
    offline = [a for a in rep["alerts"] if a["rule"] == "first_divergence"]
    assert [(a["tensor"], a["step"]) for a in offline] == [(fd["tensor"], fd["step"])]
    # the gradient each call received: act_grad rows of the zoomed steps only
    out = subprocess.run([col.exe, "inspect", col.log_path("zoom-bwd-base")],
                         capture_output=True, text=True, timeout=60, check=True)
    grads = set()
    for line in out.stdout.splitlines():
        msg = json.loads(line)
        if msg["type"] == "StepStats":
            grads |= {(msg["body"]["step"], s["name"]) for s in msg["body"]["stats"]
                      if s.get("name") == "blocks.1.mlp/gelu#0" and s.get("kind") == "act_grad"}
    assert {st for st, _ in grads} == set(range(ZOOM_STEPS)), grads


@pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                    reason="torch 1.13 has no CPU fp16 softmax")
def test_zoom_names_the_softmax_computed_in_fp16(tmp_path):
    alerts, _, rep = pair(tmp_path, "zoom-softmax", "blocks.1.attn", softmax_fp16=True)
    ops = births_at(rep)
    assert born(ops)[:1] == ["blocks.1.attn/softmax#0"], ops[:4]
    assert first_divergence(alerts)["tensor"] == "blocks.1.attn/softmax#0", fmt_alerts(alerts)


def test_zoomed_twins_are_quiet_and_the_zoom_ends(tmp_path):
    alerts, col, rep = pair(tmp_path, "zoom-twins", "blocks.1.attn")
    assert not [a for a in alerts if a["rule"] in DRIFT_RULES], fmt_alerts(alerts)
    out = subprocess.run([col.exe, "inspect", col.log_path("zoom-twins-base")],
                         capture_output=True, text=True, timeout=60, check=True)
    steps_with_calls, names = set(), set()
    for line in out.stdout.splitlines():
        msg = json.loads(line)
        if msg["type"] != "StepStats":
            continue
        for s in msg["body"]["stats"]:
            if s.get("name") and "/" in s["name"]:
                assert s["name"].startswith("blocks.1.attn/"), s["name"]
                steps_with_calls.add(msg["body"]["step"])
                names.add(s["name"])
    assert steps_with_calls == set(range(ZOOM_STEPS)), steps_with_calls
    # the calls of attn's own code, not those of its submodules (qkv, proj: their own rows)
    assert "blocks.1.attn/softmax#0" in names and "blocks.1.attn/matmul#0" in names, names
    assert not [n for n in names if "linear" in n], names
