"""Capture and replay (Monitor.capture, `python -m lockstep replay`): the collector names
where an error is born; both runs capture that op at the birth step; the replay re-runs
it in float64 and says which run is wrong.

Model: two pre-norm blocks, each an attention whose scores and softmax are its own code
and a gated MLP, fc2(fc1(x) * act(gate(x))), whose activation is an nn.GELU module
(`blocks.1.mlp.act`) on a one-wide gate. fp32 on CPU; both runs start from one seeded
state and train side by side into a real collector; captures are set up before step 0
(the birth step: after it the weights move apart).

- softmax computed in fp16 in blocks.1.attn's own code (candidate; torch >= 2.0, CPU
  fp16 softmax): zoom and the first divergence name `blocks.1.attn/softmax#0`; the replay
  says the candidate is less accurate, by thousands of fp32 ULPs (~1 ULP of fp16).
- nn.GELU(approximate='tanh') in blocks.1.mlp (candidate): the replay says the runs
  compute different functions, cause config, naming `approximate`.
- the candidate's blocks.1.mlp.act output multiplied by (1 + 2e-7) (a forward hook; fp32
  rounds the factor to 1 + 2^-22, a few ULPs), with the collector's --birth-ulps at 0.5 so
  that it is named: the replay says both runs are within rounding and to raise
  birth-ulps; `compare` with that value no longer names it.
- the candidate's blocks.1.mlp.act rounds its output through fp16 and hands on fp32 (a
  forward hook: a kernel computing in fp16 behind an fp32 interface): the replay says the
  candidate is less accurate, cause platform, naming its capture file to report.
- the candidate's data scaled by (1 + 1e-4) (a pre-hook on the model): the replay of
  blocks.1.mlp.act says its inputs differ: the op is not where the error is born.
- twins: nothing captured, nothing written.
"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from scenario_lib import (DRIFT_RULES, Run, births_at, collect_pair, compare_json, fmt_alerts,
                          seeded_state)

D, HEADS, SEQ, BATCH = 16, 2, 6, 4
STEPS = 2
TORCH2 = int(torch.__version__.split(".")[0]) >= 2


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
    def __init__(self, tanh_gelu=False):
        super().__init__()
        self.fc1 = nn.Linear(D, 2 * D)
        self.gate = nn.Linear(D, 1)
        self.act = nn.GELU(approximate="tanh" if tanh_gelu else "none")
        self.fc2 = nn.Linear(2 * D, D)

    def forward(self, x):
        return self.fc2(self.fc1(x) * self.act(self.gate(x)))


class Block(nn.Module):
    def __init__(self, **change):
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.attn = Attention(change.get("softmax_fp16", False))
        self.ln2 = nn.LayerNorm(D)
        self.mlp = Mlp(change.get("tanh_gelu", False))

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


def batches(n, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, SEQ, D, generator=g), torch.randn(BATCH, SEQ, generator=g))
            for _ in range(n)]


def times_one_plus(_module, _inputs, output):
    return output * (1 + 2e-7)


def through_fp16(_module, _inputs, output):
    return output.half().float()


def scaled_input(_module, args):
    return (args[0] * (1 + 1e-4),) + tuple(args[1:])


def run_factory(state, cap_dir, capture=None, zoom=None, scale_act=False, scale_input=False,
                act_fp16=False, **change1):
    def make(endpoint, run, role, experiment):
        model = Net(change1)
        model.load_state_dict(state)
        if scale_act:  # before watch(): lockstep sees the scaled output
            model.blocks[1].mlp.act.register_forward_hook(times_one_plus)
        if act_fp16:
            model.blocks[1].mlp.act.register_forward_hook(through_fp16)
        if scale_input:
            model.register_forward_pre_hook(scaled_input)
        r = Run(endpoint, run, role, experiment, model=model,
                monitor_kwargs={"capture_dir": str(cap_dir)})
        if zoom is not None:
            assert r.mon.zoom(zoom)
        if capture is not None:
            assert r.mon.capture(capture, step=0)
        return r
    return make


def pair(tmp_path, exp, capture=None, zoom=None, extra_args=(), **change1):
    state = seeded_state(Net)
    cap_dir = tmp_path / "captures"
    alerts, col, b, c = collect_pair(
        tmp_path, exp, run_factory(state, cap_dir, capture, zoom),
        run_factory(state, cap_dir, capture, zoom, **change1),
        batches(STEPS), extra_args=extra_args)
    for r in (b, c):
        n = r.mon.counters()
        assert n["captures_failed"] == 0 and n["captures_refused"] == 0, n
    return alerts, col, b, c, cap_dir


def replay(*args):
    """`python -m lockstep replay ARGS --json`: (exit status, result)."""
    out = subprocess.run([sys.executable, "-m", "lockstep", "replay", "--json", *map(str, args)],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip(), out.stderr
    return out.returncode, json.loads(out.stdout)


def the_capture(b, c):
    """The one folder holding both runs' files of the capture."""
    files = b.mon.counters()["capture_files"] + c.mon.counters()["capture_files"]
    assert len(files) == 2, files
    folder = os.path.dirname(files[0])
    assert os.path.dirname(files[1]) == folder, files
    return folder, files


def first_divergence(alerts):
    fd = [a for a in alerts if a["rule"] == "first_divergence"]
    assert len(fd) == 1, fmt_alerts(alerts)
    return fd[0]


@pytest.mark.skipif(not TORCH2, reason="torch 1.13 has no CPU fp16 softmax")
def test_softmax_in_fp16_is_the_candidates_less_accurate_op(tmp_path):
    row = "blocks.1.attn/softmax#0"
    alerts, _, b, c, _ = pair(tmp_path, "cap-softmax", capture=row, zoom="blocks.1.attn",
                              softmax_fp16=True)
    assert first_divergence(alerts)["tensor"] == row, fmt_alerts(alerts)
    folder, files = the_capture(b, c)
    assert os.path.basename(folder) == "step0-blocks.1.attn%2Fsoftmax%230", folder
    side = json.load(open(files[1] + ".json", encoding="utf-8"))
    assert side["func"] == "torch.softmax" and side["row"] == row and side["step"] == 0, side
    code, res = replay(folder)
    assert code == 1, res
    assert res["verdict"] == "less_accurate" and res["less_accurate"] == "candidate", res
    assert res["cause"] == "precision" and "float16" in res["message"], res["message"]
    cand = res["runs"][1]
    # ~1 ULP of fp16 is 2^13 ULPs of fp32: thousands, where the baseline is within one
    assert cand["dtype"] == "float16" and cand["ulps"] <= 1.0, cand
    assert 1000 < cand["ulps_pair"] < 10000 and res["runs"][0]["ulps_pair"] <= 2, res["runs"]
    assert res["factor"] > 1000, res


def test_tanh_gelu_is_a_different_function_cause_config(tmp_path):
    row = "blocks.1.mlp.act"
    alerts, _, b, c, _ = pair(tmp_path, "cap-gelu", capture=row, tanh_gelu=True)
    assert first_divergence(alerts)["tensor"] == row, fmt_alerts(alerts)
    folder, files = the_capture(b, c)
    code, res = replay(*files)
    assert code == 1, res
    assert res["verdict"] == "different_functions" and res["cause"] == "config", res
    assert "approximate: 'none' (baseline) vs 'tanh' (candidate)" in res["message"], res["message"]
    assert res["function_distance"] > 1e-5, res
    # each run matches float64 of its own settings
    assert all(r["ulps_pair"] <= res["budget_ulps"] for r in res["runs"]), res["runs"]


def test_a_rounding_sized_change_is_within_rounding_and_names_the_setting(tmp_path):
    row = "blocks.1.mlp.act"
    tight = ["--birth-ulps", "0.5"]
    alerts, col, b, c, _ = pair(tmp_path, "cap-round", capture=row, extra_args=tight,
                                scale_act=True)
    assert first_divergence(alerts)["tensor"] == row, fmt_alerts(alerts)
    folder, _ = the_capture(b, c)
    code, res = replay(folder, "--birth-ulps", "0.5")
    assert code == 0, res
    assert res["verdict"] == "within_rounding", res
    setting = res["setting"]
    assert setting["name"] == "birth-ulps" and setting["from"] == 0.5 and setting["to"] > 0.5
    assert "raise birth-ulps" in res["message"], res["message"]
    # the setting it names is enough: compare with it no longer names the op at step 0
    out = subprocess.run([col.exe, "compare", "--json", "--birth-ulps", str(setting["to"]),
                          col.log_path("cap-round-base"), col.log_path("cap-round-cand")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 1), out.stderr
    born = [o["name"] for o in births_at(json.loads(out.stdout), 0) if o["born"]]
    assert row not in born, born
    _, rep = compare_json(col, "cap-round")  # with the recorded (tight) settings it is
    assert [o["name"] for o in births_at(rep, 0) if o["born"]][:1] == [row]


def test_a_kernel_rounding_through_fp16_is_a_platform_bug_to_report(tmp_path):
    row = "blocks.1.mlp.act"
    alerts, _, b, c, _ = pair(tmp_path, "cap-kernel", capture=row, act_fp16=True)
    assert first_divergence(alerts)["tensor"] == row, fmt_alerts(alerts)
    folder, files = the_capture(b, c)
    code, res = replay(folder)
    assert code == 1, res
    assert res["verdict"] == "less_accurate" and res["less_accurate"] == "candidate", res
    assert res["cause"] == "platform", res
    cand = [f for f in files if "cap-kernel-cand" in f][0]
    assert "report it with " + cand in res["message"], res["message"]
    # fp16 keeps 10 bits where fp32 keeps 23: up to 2^12 ULPs of fp32 off float64
    assert 100 < res["runs"][1]["ulps"] <= 4200 and res["runs"][1]["dtype"] == "float32"


def test_an_op_fed_other_data_is_not_where_the_error_is_born(tmp_path):
    # (the collector names no birth point here: 1e-4 is within the fp32 tolerance at the
    # model's input; the op is captured as if it had been named)
    _, _, b, c, _ = pair(tmp_path, "cap-data", capture="blocks.1.mlp.act", scale_input=True)
    folder, _ = the_capture(b, c)
    code, res = replay(folder)
    assert code == 0, res
    assert res["verdict"] == "inputs_differ", res
    assert "not where the error is born" in res["message"], res["message"]
    assert res["input_distance"] > 1e-6 and res["carried_distance"] >= 0.5 * res["output_distance"]


def test_twins_write_nothing(tmp_path):
    alerts, _, b, c, cap_dir = pair(tmp_path, "cap-twins")
    assert not [a for a in alerts if a["rule"] in DRIFT_RULES], fmt_alerts(alerts)
    assert not cap_dir.exists()
    for r in (b, c):
        n = r.mon.counters()
        assert (n["captures_written"], n["capture_files"]) == (0, []), n
