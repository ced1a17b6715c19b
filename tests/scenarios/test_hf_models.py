"""Real model code (issue 25, item 4): Hugging Face transformers' GPT2LMHeadModel and
LlamaForCausalLM (hf_scenario_models.py: 2 layers, hidden 64, 4 heads, vocab 128,
sequence 32, batch 4, random weights, nothing downloaded), trained on synthetic tokens
through the public API exactly as README.md shows it (`mon.watch(model, optimizer=opt)`,
`loss = model(input_ids=ids, labels=ids).loss`, `mon.step(loss=loss, lr=...)`), into a
real `lockstep collect`. Torch 2.x stack only (transformers 5.x needs it).

Cases: twins (same seeds) on both models; attn_implementation "eager" vs "sdpa" on both;
one real change per case (CHANGES), named at step 0 with cause `config`; the Llama
under DistributedDataParallel (gloo, 2 ranks), twins.

MEASURED (torch 2.11 CPU, transformers 5.17, fp32, 30 steps, AdamW lr 1e-3; lockstep
build of 2026-11-27 ~19:05):
- twins: every loss bit-equal (4.85 -> 3.73 gpt2, 4.88 -> 3.45 llama), no alert,
  compare exits 0 with 30 steps compared. (Before this file: 8 `overflow` warnings per
  pair at step 0, "1984 value(s) would overflow fp16", on the eager attention's additive
  causal mask, torch.finfo(float32).min where masked, seen by every layer and attention
  as act_in; fixed in the collector's overflow rule: a tensor holding its own dtype's
  extreme finite value is no fp16 overflow to come. The same Llama cast to bf16 got 8
  critical ones, "1984 value(s) past bf16's range", for its mask at bf16's minimum: a
  mask made outside every module is no saturation either; test_bf16_llama_twins_*.)
- eager vs sdpa, plain torch forward hooks, step 0, ||cand - base|| / ||base||: the first
  module output that differs is the attention's output projection (gpt2
  transformer.h.0.attn.c_proj 1.27e-7, llama model.layers.0.self_attn.o_proj 1.33e-7:
  about one fp32 ulp, 1.19e-7), everything after it 0.5e-7..3.4e-7; the losses differ by
  <= 2.2e-7 (gpt2) / 1.2e-7 (llama) relative over 30 steps. What the birth-point rule
  says: layer 0's attention gets an error of ~1 ulp while its inputs agree bit for bit,
  where rounding explains ~3e-6..5e-6 (the "explained" of the ops listed: 32 fp32 ulps
  per op, the default --birth-ulps), ~30x more, so it is not born (nor listed: every
  listed op's ratio is lower than 0.11): two kernels rounding differently, not an op
  computing something else. compare --json births at step 0: no op born, top ratio
  0.067 (gpt2, h.1.attn.c_attn backward) and 0.106 (llama, layers.1.mlp forward); no
  alert but the setup warning; compare exits 0. The fingerprint records the model
  config's fields with the attention implementation (module.config.attn_implementation):
  the setup rule names that one difference, and nothing else.
- one real change (compare --json births at step 0, input error 0 in each case):
  gpt2-act       transformer.h.1.mlp.act gelu_new -> gelu: 2.42e-5, ratio 6.33, warning
                 (below the fp32 tolerance; compare exits 0)
  llama-act      model.layers.1.mlp.act_fn silu -> gelu: 0.068, ratio 2.1e4, critical
  llama-rms-eps  rms_norm_eps 1e-6 -> 1e-5: model.layers.0.input_layernorm 0.0116, ratio
                 4.0e3, critical (the setup lists all five RMSNorms' eps)
  Each first divergence has cause `config`, from the run fingerprint as it was: the
  activation's module type (module.<path>.type) and the RMSNorm's extra_repr (eps=...)
  differ, so no fingerprint change was needed.
- DDP twins, 2 ranks x 20 steps: no alert, compare exits 0 over 20 steps x 2 ranks. Each
  worker trains in ~2.7 s; the rest of the test (9 s quiet, 45 s under load on this
  2-core machine) is the two spawned processes importing torch and transformers (~7 s
  of CPU each).
- bf16 Llama twins, 10 steps: no alert (after the fix above).
Whole file (9 tests): 29 s under ctest on this 2-core machine when quiet (DDP 9 s, each
other test ~1.5 s, imports the rest), 74 s with a load average of ~5 (other builds and
tests running, DDP 45 s).
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing is downloaded

import pytest  # noqa: E402
import torch  # noqa: E402

import lockstep  # noqa: E402
import hf_scenario_models as hf  # noqa: E402
from scenario_lib import (DRIFT_RULES, LMRun, births_at, collect_pair, collect_ranks,  # noqa: E402
                          compare_json, fmt_alerts, one_first_divergence)

STEPS = 30          # a few dozen: the loss falls from ~4.9 to ~3.5 (llama) / ~3.7 (gpt2)
SEED = 1234


def build(kind, attn="eager", change=None, **config):
    """The model a run builds after seeding: two runs built this way start from the same
    weights (as a user's two jobs with the same seed)."""
    lockstep.seed_all(SEED, deterministic=True)
    model = hf.BUILDERS[kind](attn, **config)
    if change is not None:
        change(model)
    return model


def hf_run(kind, **build_args):
    """A factory for collect_pair: a watched run (as README.md writes it) of the model
    build(kind, **build_args) makes when the run starts."""
    def make(endpoint, run, role, experiment):
        return LMRun(endpoint, run, role, experiment, model=build(kind, **build_args))
    return make


def run_pair(tmp_path, exp, kind, base=None, cand=None, steps=STEPS, extra_args=()):
    """Baseline and candidate (each built by build(kind, **base / **cand)) trained side by
    side on the same batches, baseline step s then candidate step s. Returns (alerts,
    collector, baseline, candidate); the collector is stopped, its logs are kept."""
    return collect_pair(tmp_path, exp, hf_run(kind, **(base or {})), hf_run(kind, **(cand or {})),
                        [(ids,) for ids in hf.token_batches(steps)], extra_args)


@pytest.mark.parametrize("kind", sorted(hf.BUILDERS))
def test_twins_are_silent(tmp_path, kind):
    """Same seeds, same data, same code: every loss equal, not a single alert."""
    exp = "hf-twins-" + kind
    alerts, col, b, c = run_pair(tmp_path, exp, kind)
    assert b.losses == c.losses
    assert b.losses[-1] < b.losses[0] - 0.5, b.losses  # it trains
    assert alerts == [], fmt_alerts(alerts)
    code, rep = compare_json(col, exp)
    assert code == 0 and rep["steps_compared"] == STEPS, rep["steps_compared"]


def test_bf16_llama_twins_are_silent(tmp_path):
    """The Llama cast to bf16 (model.to(torch.bfloat16), as large models are trained):
    its eager attention's mask is bf16's own minimum (-3.39e38), which the overflow rule
    read as "past bf16's range", critical, on every layer before the fix (MEASURED)."""
    exp = "hf-twins-bf16"
    bf16 = {"change": lambda m: m.to(torch.bfloat16)}
    alerts, _, b, c = run_pair(tmp_path, exp, "llama", base=bf16, cand=bf16, steps=10)
    assert next(c.model.parameters()).dtype == torch.bfloat16
    assert b.losses == c.losses
    assert alerts == [], fmt_alerts(alerts)


@pytest.mark.parametrize("kind", sorted(hf.BUILDERS))
def test_eager_vs_sdpa_is_rounding_not_a_divergence(tmp_path, kind):
    """attn_implementation "eager" (matmul, softmax, matmul in the attention's own code)
    vs "sdpa" (torch's fused scaled_dot_product_attention): a real kernel difference.
    The birth-point rule judges it against fp32 rounding (see MEASURED at the top): the
    attention's output differs by ~1 ulp while its inputs agree, far below what 32 ulps
    per op explain, so no op is born, nothing is critical, and compare exits 0."""
    exp = "hf-attn-" + kind
    alerts, col, b, c = run_pair(tmp_path, exp, kind, base={"attn": "eager"}, cand={"attn": "sdpa"})
    assert b.model.config._attn_implementation == "eager"  # pylint: disable=protected-access
    assert c.model.config._attn_implementation == "sdpa"  # pylint: disable=protected-access
    gap = max(abs(x - y) / abs(x) for x, y in zip(b.losses, c.losses))
    assert b.losses != c.losses and gap < 1e-5, (gap, b.losses, c.losses)  # real, and tiny
    text = fmt_alerts(alerts)
    # One alert: the setup rule saying the attention kernels differ (the model config's
    # field, in the fingerprint), a warning to check, not a divergence.
    assert [(a["rule"], a["severity"]) for a in alerts] == [("setup", "warning")], text
    assert "attn_implementation" in alerts[0]["message"], text
    code, rep = compare_json(col, exp)
    assert code == 0 and rep["first_divergence"] is None, rep["first_divergence"]
    assert [(d["key"], d["baseline"], d["candidate"]) for d in rep["setup"]["differences"]] == [
        ("module.config.attn_implementation", "eager", "sdpa")], rep["setup"]
    ops = births_at(rep, 0)
    assert ops, "compare --json has no births at step 0"
    assert not [o for o in ops if o["born"]], ops
    assert max(o["ratio"] for o in ops) < 0.5, ops  # measured <= 0.11


def _act(path, name):
    """A change: the activation module at `path` (dotted) replaced by transformers'
    activation `name`, as a config's hidden_act / activation_function would pick it."""
    parent, attr = path.rsplit(".", 1)

    def change(model):
        setattr(model.get_submodule(parent), attr, hf.activation(name))
    return change


# case -> (kind, candidate's build() arguments, module named, severity, setup key)
CHANGES = {
    # one layer's MLP activation: SiLU -> exact GELU, a large change of that op's output
    "llama-act": ("llama", {"change": _act("model.layers.1.mlp.act_fn", "gelu")},
                  "model.layers.1.mlp.act_fn", "critical", "module.model.layers.1.mlp.act_fn.type"),
    # the config's rms_norm_eps 1e-6 -> 1e-5: every RMSNorm changes; the first in order
    # is the one whose inputs still agree
    "llama-rms-eps": ("llama", {"rms_norm_eps": 1e-5}, "model.layers.0.input_layernorm",
                      "critical", "module.model.layers.0.input_layernorm.eps"),
    # GPT-2's tanh-approximated gelu_new -> exact gelu in layer 1: ~2.4e-5, below the
    # fp32 tolerance, named by the birth rule alone
    "gpt2-act": ("gpt2", {"change": _act("transformer.h.1.mlp.act", "gelu")},
                 "transformer.h.1.mlp.act", "warning", "module.transformer.h.1.mlp.act.type"),
}


@pytest.mark.parametrize("case", sorted(CHANGES))
def test_one_real_change_is_named_at_step_0_with_cause_config(tmp_path, case):
    kind, cand, module, severity, key = CHANGES[case]
    exp = "hf-change-" + case
    alerts, col, _, _ = run_pair(tmp_path, exp, kind, cand=cand)
    text = fmt_alerts(alerts)
    fd = one_first_divergence(alerts, DRIFT_RULES | {"setup", "scalars"})
    setup = [a for a in alerts if a["rule"] == "setup"]
    assert len(setup) == 1 and key in setup[0]["message"], text
    assert (fd["step"], fd["tensor"], fd["kind"]) == (0, module, "act"), text
    assert fd["cause"] == "config" and key in fd["message"], text
    assert "its inputs agree (rel. distance 0)" in fd["message"], text
    assert fd["severity"] == severity, text
    code, rep = compare_json(col, exp)
    assert code == (1 if severity == "critical" else 0), code
    live = rep["first_divergence"]
    assert (live["step"], live["tensor"], live["kind"], live["cause"]) == (0, module, "act", "config"), live
    born = [o for o in births_at(rep, 0) if o["born"]]
    assert [o["name"] for o in born] == [module], births_at(rep, 0)
    assert born[0]["input_error"] == 0 and born[0]["ratio"] > 1, born  # measured 6.3 .. 2.1e4


# ---------------------------------------------------------------------------------------
# DDP: the Llama on 2 ranks (gloo, torch.multiprocessing spawn), twins.
# ---------------------------------------------------------------------------------------

WORLD = 2
DDP_STEPS = 20
DDP_RUNS = (("hf-ddp-base", "baseline"), ("hf-ddp-cand", "candidate"))


def _ddp_worker(rank, endpoint):
    runs = []
    for run, role in DDP_RUNS:
        r = LMRun(endpoint, run, role, "hf-ddp", model=torch.nn.parallel.DistributedDataParallel(
            build("llama")), monitor_kwargs={"host_stats_thread": "off"})
        assert r.mon.rank == rank, (r.mon.rank, rank)
        runs.append(r)
    for ids in hf.token_batches(DDP_STEPS, seed=100 + rank):  # each rank its own shard
        for r in runs:
            r.train_step(ids)
    assert runs[0].losses == runs[1].losses, "rank %d: twin losses differ" % rank
    for r in runs:
        assert r.close()


def test_ddp_llama_twins_are_silent(tmp_path, monkeypatch):
    alerts, col = collect_ranks(tmp_path, monkeypatch, WORLD, _ddp_worker,
                                [run for run, _ in DDP_RUNS])
    assert alerts == [], fmt_alerts(alerts)
    code, rep = compare_json(col, "hf-ddp")
    assert code == 0 and rep["ranks"] == WORLD, (code, rep["ranks"])
    assert rep["steps_compared"] == DDP_STEPS * WORLD, rep["steps_compared"]
    assert rep["first_divergence"] is None and rep["setup"]["differences"] == [], rep["setup"]
