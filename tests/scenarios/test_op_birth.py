"""Issue 14: `first_divergence` names the op where the error is born — the first module
whose inputs agree between the two runs (within rounding noise) while its output does
not (forward), or whose received gradient agrees while the gradient it passes on does
not (backward) — even below the hard tolerance, and even when "another platform" adds
rounding-level noise to every op of the candidate.

Model: birth_models.TinyGPT (3 pre-norm blocks, d_model 32, float input, causal
attention with the softmax in the attention module's own code, MLP fc1 -> GELU ->
gate (custom autograd Function) -> fc2), fp32 on CPU, one change in block 1 of the
candidate (birth_models.CHANGES). "Platform noise": a forward hook on every leaf
module of the candidate returns output * (1 + 1e-6 * n), n fixed-seed N(0, 1).

Two groups of tests (select with -k birth_ / -k "not birth_"):
- what must stay silent (or not critical) with or without the birth rule:
  test_twins_*, test_platform_noise_*, test_bf16_autocast_*;
- the birth point itself: every test whose name contains "birth_" (their asserts about
  the birth point say "issue 14" in their messages).

Measured with plain torch (measure_birth_noise.py, torch 1.13 CPU), step 0, relative L2
distance ||cand - base|| / ||base|| of whole tensors:

  noise alone: every leaf op's output differs by ~1e-6..2.6e-6 and its input by
    ~0.5e-6..2e-6 (out/in ratio <= ~2.9; the first op, blocks.0.ln1, has input 0 (the
    data) and output 9.5e-7); gradients ~1e-6..3.4e-6 (bwd ratio <= 1.9)
  case             op                  input (noise)   output (noise)   out/in with noise
  gelu-tanh        blocks.1.mlp.act    0 (1.5e-6)      1.97e-4 (same)   133
  ln-eps           blocks.1.ln2        0 (6.4e-7)      4.85e-4 (same)   762
  softmax-fp16     blocks.1.attn       0 (1.2e-6)      1.43e-4 (same)   119
  linear-bf16      blocks.1.mlp.fc1    0 (1.1e-6)      2.92e-3 (same)   2.6e3
  custom-backward  blocks.1.mlp.gate   grad received 0 (2.1e-6), passed on 1.0e-3 (same): 469
  (forward of custom-backward: identical without noise; its backward makes every
  gradient upstream of the gate differ by ~1.4e-4..1e-3.) Other leaf ops in the change
  cases with noise: out/in ratio <= 2.9 (blocks.0.ln2), without noise <= 1.7.

  noise alone, 300 steps, AdamW lr 1e-3: blocks.0.attn.qkv output relative distance
    step 0: 1.4e-6, step 1: 2.2e-4, step 10: 7.5e-4, step 50: 1.25e-3,
    step 150: 1.41e-3, step 299: 1.51e-3; the loss agrees to ~6 digits throughout.
  Why so fast: the gradient of the key bias (qkv.bias[32:64]) is mathematically zero
  (softmax ignores a shift common to all keys), ~1e-9 of rounding noise; Adam divides
  by its own magnitude, so the noise picks the sign of a full lr-sized update. The key
  bias differs by 0.2 % after step 0 and 1.4 % at step 299 (whole weight matrices only
  ~1e-7..6e-7). Any model with a key bias under Adam does this on another platform.
  Without a qkv bias (qkv_bias=False) the qkv output stays 1.4e-6..1.6e-6 apart over
  all 300 steps and no parameter differs by more than 5e-6.

Seen with the birth analysis (lockstep build of 2026-11-27 ~11:55, `compare --json`
births at step 0, ratio = output error / what rounding explains):
  noise 1e-6: changed op ratio gelu-tanh 16.5, softmax-fp16 12.6, ln-eps 54.5,
    linear-bf16 267, custom-backward (bwd) 69.7 (without noise: 83, 61, 180, 1093, 375);
    the best unchanged op 0.40 (blocks.0.ln1: its input is the data, exact, so what
    rounding explains is the floor, 2.58e-6 ~ 22 fp32 ulps).
  noise 3e-6 (per op): blocks.0.ln1 is "born" (ratio 1.2) and, coming first in order,
    is the first_divergence of every case; at 1e-5 it is 4.0, softmax-fp16 drops to 1.5
    and gelu-tanh to 1.9; at 3e-5 they are no longer born (0.46, 0.65). So the default
    budget (--birth-ulps 32) takes another platform's noise up to ~2.5e-6 per op in
    fp32; beyond that, raise it.
"""
import pytest
import torch

from birth_models import CHANGES, PlatformNoise, TinyGPT, batches
from scenario_lib import (DRIFT_RULES, Run, births_at, collect_pair, compare_json, fmt_alerts,
                          seeded_state)

CHANGE_STEPS = 4     # the birth is at step 0; a few more steps to see nothing else fires
LONG_STEPS = 300     # platform noise alone: long enough for the weights to drift apart
# where each fingerprint-visible change shows up in the setup rule's message
SETUP_KEY = {"gelu-tanh": "module.blocks.1.mlp.act.approximate", "ln-eps": "module.blocks.1.ln2.eps"}


def birth_run(state, change=None, noise=False, autocast=None, qkv_bias=True):
    """A factory for collect_pair: one watched run of TinyGPT from `state`, with the
    change and platform noise hooked before watch() (lockstep sees the noisy outputs)."""
    def make(endpoint, run, role, experiment):
        model = TinyGPT(change, qkv_bias=qkv_bias)
        model.load_state_dict(state)
        if noise:
            PlatformNoise(model)
        return Run(endpoint, run, role, experiment, model=model, autocast=autocast)
    return make


def run_pair(tmp_path, exp, steps, change=None, noise=False, autocast=None, extra_args=(),
             qkv_bias=True):
    """A baseline and a candidate (the change, noise and autocast) from the same weights
    on the same batches, through a real collector (scenario_lib.collect_pair). Returns
    (alerts, collector, baseline, candidate)."""
    state = seeded_state(lambda: TinyGPT(qkv_bias=qkv_bias))
    return collect_pair(tmp_path, exp, birth_run(state, qkv_bias=qkv_bias),
                        birth_run(state, change, noise, autocast, qkv_bias),
                        batches(steps), extra_args)


# ---------------------------------------------------------------------------------------
# HARNESS / current rules: must hold before and after issue 14.
# ---------------------------------------------------------------------------------------

def test_twins_are_silent(tmp_path):
    """Bit-identical twins: not a single alert, every loss equal."""
    alerts, _, b, c = run_pair(tmp_path, "birth-twins", LONG_STEPS)
    assert b.losses == c.losses
    assert alerts == [], fmt_alerts(alerts)


def test_platform_noise_alone_is_silent_for_300_steps(tmp_path):
    """Rounding-level noise on every op of the candidate (what another platform's kernels
    do) is no divergence: no alert of any rule over 300 steps. The runs stay ~1.5e-6
    apart for 300 steps (pure noise, no growth). Before issue 14 the trend rule fired at
    step 118 on head.bias's and blocks.2.mlp.fc2.bias's gradients: converging towards
    zero, they scored more and more for the same rounding difference."""
    alerts, _, b, c = run_pair(tmp_path, "birth-noise300", LONG_STEPS, noise=True, qkv_bias=False)
    assert b.losses != c.losses  # the noise is there
    assert max(abs(x - y) / abs(x) for x, y in zip(b.losses, c.losses)) < 1e-3
    assert alerts == [], "platform noise alone raised alerts:\n" + fmt_alerts(alerts)


def test_platform_noise_with_a_key_bias_blames_the_weights_not_an_op(tmp_path):
    """With a qkv bias the same noise is not harmless to the weights: the key bias's
    gradient is mathematically zero, only rounding, and Adam turns it into lr-sized
    steps of random sign, so the key biases drift ~1 % apart and blocks.*.attn.qkv's
    output ~1.5e-3 relative by step 299 (see the top) -- a real difference in a tensor
    (its key part; softmax ignores it). It may be reported, never as an op computing
    differently and never as critical: the first divergence's cause is the weights."""
    alerts, _, _, _ = run_pair(tmp_path, "birth-noise300-bias", LONG_STEPS, noise=True, qkv_bias=True)
    text = fmt_alerts(alerts)
    assert not [a for a in alerts if a["severity"] == "critical"], text
    for a in alerts:
        if a["rule"] == "first_divergence":
            assert a["cause"] == "weights" and "computes differently" not in a["message"], text


def test_bf16_autocast_candidate_is_not_critical(tmp_path):
    """fp32 baseline vs a bf16-autocast candidate: bf16 rounding everywhere, which is the
    precision policy (cause "precision", the setup rule says "amp"), never critical."""
    alerts, _, _, _ = run_pair(tmp_path, "birth-bf16", CHANGE_STEPS + 4, autocast=torch.bfloat16)
    text = fmt_alerts(alerts)
    assert not [a for a in alerts if a["severity"] == "critical"], text
    assert {a["rule"] for a in alerts} <= DRIFT_RULES | {"setup"}, text
    setup = [a for a in alerts if a["rule"] == "setup"]
    assert len(setup) == 1 and "amp off vs bfloat16" in setup[0]["message"], text
    assert all(a["cause"] == "precision" for a in alerts if a["rule"] == "first_divergence"), text


# ---------------------------------------------------------------------------------------
# NEW BEHAVIOUR (issue 14): the birth point. Fail until act_in and the analysis land.
# ---------------------------------------------------------------------------------------

def check_birth_alert(alerts, case, noise):
    """The asserts about one change case's alerts (shared with the compare test)."""
    op, kind, visible = CHANGES[case]
    text = "case %s noise=%s:\n%s" % (case, noise, fmt_alerts(alerts))
    # harness / current rules first: the setup rule names a fingerprint-visible change
    setup = [a for a in alerts if a["rule"] == "setup"]
    if visible:
        assert len(setup) == 1 and SETUP_KEY[case] in setup[0]["message"], text
    else:
        assert setup == [], text
    # nothing but drift rules (no nonfinite/overflow/...)
    assert {a["rule"] for a in alerts} <= DRIFT_RULES | {"setup"}, text

    fd = [a for a in alerts if a["rule"] == "first_divergence"]
    assert len(fd) == 1, "issue 14: one first_divergence alert expected\n" + text
    fd = fd[0]
    assert (fd["step"], fd["tensor"], fd["kind"]) == (0, op, kind), \
        "issue 14: birth point expected at step 0, %s (%s)\n%s" % (op, kind, text)
    # forward births below the hard fp32 tolerance (1e-3) are warnings; linear-bf16's
    # 2.9e-3 crosses it; custom-backward's 1.0e-3 sits on it (either is right)
    want = {"linear-bf16": {"critical"}, "custom-backward": {"warning", "critical"}}.get(
        case, {"warning"})
    assert fd["severity"] in want, "issue 14: severity %s not in %s\n%s" % (fd["severity"], want, text)
    if visible:  # the fingerprint says why: a setting of that very module differs
        assert fd["cause"] == "config", "issue 14: cause config expected\n" + text
        assert SETUP_KEY[case] in fd["message"] or "computes differently" in fd["message"], text
    else:  # same setup: only the numbers say it, and they blame the op
        assert fd["cause"] == "op", "issue 14: cause op expected\n" + text
        word = "backward" if kind == "act_grad" else "computes differently"
        assert word in fd["message"], "issue 14: %r expected in the message\n%s" % (word, text)
    return fd


@pytest.mark.parametrize("noise", [False, True], ids=["exact", "noise"])
@pytest.mark.parametrize("case", sorted(CHANGES))
def test_birth_point_is_named(tmp_path, case, noise):
    exp = "birth-%s-%s" % (case, "noise" if noise else "exact")
    alerts, _, b, c = run_pair(tmp_path, exp, CHANGE_STEPS, change=case, noise=noise)
    if case == "custom-backward" and not noise:
        # the forward is untouched: step 0's loss is bit-identical, later ones are not
        assert b.losses[0] == c.losses[0] and b.losses[1:] != c.losses[1:]
    check_birth_alert(alerts, case, noise)


def test_birth_bf16_autocast_blames_no_container(tmp_path):
    """Under bf16 autocast every Linear rounds to bf16, and each one's error is what bf16
    rounding explains: a container (a Block, an Mlp) that merely sums its submodules'
    outputs back into fp32 computes nothing differently and must not be "born".
    (Seen before this was asked: "the error is born in blocks.0 (Block) ... 491x what
    rounding explains (2.58e-06)": the container's fp32 output got the fp32 floor.)"""
    alerts, _, _, _ = run_pair(tmp_path, "birth-bf16-container", CHANGE_STEPS,
                               autocast=torch.bfloat16)
    text = fmt_alerts(alerts)
    containers = {n for n, m in TinyGPT().named_modules() if list(m.children())}
    containers -= {"blocks.%d.attn" % i for i in range(3)}  # computes its own softmax
    fd = [a for a in alerts if a["rule"] == "first_divergence"]
    assert all(a["cause"] == "precision" for a in fd), text
    assert not [a for a in fd if a["tensor"] in containers], \
        "issue 14: a container is blamed for bf16 rounding its submodules explain\n" + text


def test_birth_compare_gives_the_live_answer(tmp_path):
    """`lockstep compare --json` over the two logs: the same first divergence as the live
    alert, and its "births" rank the changed op first at step 0."""
    case, exp = "gelu-tanh", "birth-compare"
    alerts, col, _, _ = run_pair(tmp_path, exp, CHANGE_STEPS, change=case, noise=True)
    _, rep = compare_json(col, exp)
    assert "births" in rep, "issue 14: compare --json has no 'births'; keys %s" % sorted(rep)
    live = check_birth_alert(alerts, case, True)
    fd = rep["first_divergence"]
    assert (fd["step"], fd["tensor"], fd["kind"]) == (live["step"], live["tensor"], live["kind"]), \
        (fd, fmt_alerts(alerts))
    ops, op = births_at(rep, 0), CHANGES[case][0]
    assert ops, rep["births"]
    # Ranked: the ops that add error of their own first, then by ratio.
    key = [(o["born"], o["ratio"]) for o in ops]
    assert key == sorted(key, reverse=True), ops
    assert ops[0]["name"] == op and ops[0]["born"], ops
    assert all(o["pass"] in ("forward", "backward") for b in rep["births"] for o in b["ops"]), rep["births"]
    # The containers of the op (blocks.1.mlp, blocks.1) see the same error born inside
    # them and may rank above it (on this run blocks.1.mlp's ratio is ~18, the GELU's
    # ~16.5); they are listed as explained (born false). Among the rest, the changed op
    # is first, and it is the only op born at step 0: the noise makes no false birth.
    containers = {op.rsplit(".", i)[0] for i in range(1, op.count(".") + 1)}
    top = [o for o in ops if o["name"] not in containers]
    assert top and top[0]["name"] == op and top[0]["pass"] == "forward", ops
    assert top[0]["output_error"] > top[0]["input_error"] >= 0, ops
    assert [o["name"] for o in ops if o["born"]] == [op], ops
