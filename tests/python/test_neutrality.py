"""The agent does not change what it measures: one deterministic training watched by
lockstep and one without it give bit-identical losses, gradients and parameters.

Users' first fear of a tool inside their training loop is that it changes the training
(a host sync hiding a NaN, backward hooks reordering gradient accumulation, a random
number drawn that shifts every dropout mask after it). Each case trains a model twice
from `lockstep.seed_all(1234, deterministic=True)`, for STEPS steps with AdamW: once
plain, once through the public API exactly as README.md shows (Monitor(...), watch(model,
optimizer=opt), step(loss=...), close()), its agent shipping to a real `lockstep
collect` (the log is checked to hold every step's statistics, so the hooks really ran).
At every micro step the loss, and at every step every parameter's gradient (before the
optimizer's step) and every parameter (after it), must be torch.equal to the plain run's.

Cases: model_zoo's TinyTransformer with dropout 0.1 (the random stream must be consumed
identically) and model_zoo's GPT-2 shape (tied embedding and head) with two accumulated
micro steps per step, on both torches; on the torch 2.x stack also a transformers
GPT2LMHeadModel (dropout 0.1) and a LlamaForCausalLM with two micro steps
(tests/python/hf_models.py, random weights, nothing downloaded).

Then `python -m lockstep doctor --neutrality MODULE:FACTORY` (lockstep/_neutrality.py) on
factories of tests/python/neutrality_factories.py: a neutral model (exit 0, its line), a
model that changes when hooked (exit 1, names the first tensor that differs), one that
is not deterministic by itself (exit 1, inconclusive), a factory that returns no model
(exit 2).
"""
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import lockstep
import hf_models
import model_zoo
from conftest import start_collector, stop_collector

STEPS = 20
SEED = 1234
HERE = os.path.dirname(os.path.abspath(__file__))


def _mse(model, batch):
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def _next_token(model, batch):
    tokens, targets = batch
    logits = model(tokens)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _lm_batches(n):
    g = torch.Generator().manual_seed(0)
    vocab, seq = model_zoo.GPT2_TINY["vocab"], 16
    out = []
    for _ in range(n):
        t = torch.randint(0, vocab, (4, seq + 1), generator=g)
        out.append((t[:, :-1], t[:, 1:]))
    return out


# name -> (make_model(), batches for STEPS * micro passes, loss_fn(model, batch), micro)
def _cases():
    yield "tiny_transformer", (lambda: model_zoo.TinyTransformer(dropout=0.1),
                               list(model_zoo.synthetic_batches(STEPS)), _mse, 1)
    yield "gpt2_shape_accum2", (lambda: model_zoo.GPT2(**model_zoo.GPT2_TINY),
                                _lm_batches(2 * STEPS), _next_token, 2)
    if hf_models.available():
        yield "hf_gpt2", (lambda: hf_models.gpt2(seed=SEED), hf_models.token_batches(STEPS),
                          hf_models.lm_loss, 1)
        yield "hf_llama_accum2", (lambda: hf_models.llama(seed=SEED),
                                  hf_models.token_batches(2 * STEPS), hf_models.lm_loss, 2)


CASES = dict(_cases())


def _train(make_model, batches, loss_fn, micro, endpoint=None, run=None):
    """[(per-micro-step losses, per-micro-step {name: grad}, {name: param})] per step;
    watched by a Monitor sending to `endpoint` when one is given."""
    lockstep.seed_all(SEED, deterministic=True)
    mon = None
    if endpoint is not None:  # before the model, as README.md shows
        mon = lockstep.Monitor(run=run, role="solo", experiment="neutrality",
                               endpoint=endpoint, strict=True)
    model = make_model().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if mon is not None:
        mon.watch(model, optimizer=opt)
    trace = []
    for step in range(STEPS):
        losses, grads = [], []
        for m in range(micro):
            loss = loss_fn(model, batches[step * micro + m]) / micro
            loss.backward()
            losses.append(loss.detach().clone())
            grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()
                          if p.grad is not None})
        opt.step()
        opt.zero_grad()
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        if mon is not None:
            mon.step(loss=loss)
        trace.append((losses, grads, params))
    if mon is not None:
        assert mon.close(timeout=10.0)
        counters = mon.counters()
        assert counters["python_errors"] == 0, counters["last_python_error"]
        assert counters["records_dropped"] == 0
    return trace


def _assert_identical(plain, watched):
    for step, (a, b) in enumerate(zip(plain, watched)):
        for m, (la, lb) in enumerate(zip(a[0], b[0])):
            assert torch.equal(la, lb), ("loss", step, m, la.item(), lb.item())
        for m, (ga, gb) in enumerate(zip(a[1], b[1])):
            assert sorted(ga) == sorted(gb), (step, m)
            for name in ga:
                assert torch.equal(ga[name], gb[name]), ("gradient", name, step, m)
        assert sorted(a[2]) == sorted(b[2])
        for name in a[2]:
            assert torch.equal(a[2][name], b[2][name]), ("parameter", name, step)
    assert len(plain) == len(watched) == STEPS


@pytest.mark.parametrize("name", sorted(CASES))
def test_watched_training_is_bit_identical(name, tmp_path):
    make_model, batches, loss_fn, micro = CASES[name]
    collector, _ = start_collector(tmp_path)
    try:
        plain = _train(make_model, batches, loss_fn, micro)
        watched = _train(make_model, batches, loss_fn, micro, collector.endpoint, name)
        log = collector.inspect(name)
    finally:
        stop_collector(collector)
    _assert_identical(plain, watched)
    # The hooks really ran: every step's statistics reached the collector, with module
    # outputs, their gradients and the parameter gradients of every micro step.
    stats = [dict(s, step=r["body"]["step"]) for r in log if r["type"] == "StepStats"
             for s in r["body"]["stats"]]
    assert sorted({s["step"] for s in stats}) == list(range(STEPS))
    # Every row's tensor is in the log's directory (a refused TensorDirectory leaves rows
    # without a name: the collector once refused those holding a 0-d tensor's shape).
    unnamed = sorted({s["tensor_id"] for s in stats if s.get("name") is None})
    assert not unnamed, "tensor ids without a directory entry: %s" % unnamed
    kinds = {s["kind"] for s in stats}
    assert {"act", "act_grad", "param_grad", "loss"} <= kinds, kinds
    assert {s["micro_step"] for s in stats if s["kind"] == "param_grad"} == set(range(micro))
    # The other way round: the plain run is not a copy of the watched one by accident
    # (the models learn, so steps differ).
    assert not torch.equal(plain[0][0][0], plain[-1][0][0])


def _doctor_cli(factory, *args):
    """The real command line, in a child process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.run([sys.executable, "-m", "lockstep", "doctor", "--neutrality",
                           "neutrality_factories:" + factory, *args],
                          capture_output=True, text=True, timeout=240, env=env, cwd=HERE,
                          check=False)


def _doctor(factory, capsys, *args):
    """The same command's main() in this process (a child costs a torch import, 5-10 s):
    (exit status, its last line)."""
    from lockstep.__main__ import main  # pylint: disable=import-outside-toplevel
    capsys.readouterr()
    rc = main(["doctor", "--neutrality", "neutrality_factories:" + factory, *args])
    return rc, capsys.readouterr().out.strip().splitlines()[-1]


def test_doctor_neutrality_says_neutral():
    out = _doctor_cli("tiny_transformer", "--steps", "2", "--micro-steps", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("lockstep "), lines
    # 2 x TransformerEncoderLayer (12 tensors each) + embed and head (2 each)
    assert lines[-1].startswith("neutral: loss, 28 parameters and 28 gradients bit-identical "
                                "after 2 steps of 2 micro steps each (the agent recorded "), lines


@pytest.mark.skipif(not hf_models.available(), reason="transformers: torch 2.x stack only")
def test_doctor_neutrality_on_a_transformers_model(capsys):
    rc, last = _doctor("hf_gpt2", capsys)
    # 2 blocks x 12 tensors, wte (tied with lm_head: one parameter), wpe, ln_f weight and bias
    assert rc == 0 and last.startswith("neutral: loss, 28 parameters and 28 gradients "
                                       "bit-identical after one step (the agent"), last


def test_doctor_neutrality_names_what_the_agent_changed(capsys):
    # A layer that computes differently when hooked: the check must fail and say where.
    rc, last = _doctor("hook_sensitive", capsys)
    assert rc == 1, last
    assert last.startswith("NOT neutral: with the agent, the loss at step 0: 1 of 1 elements "
                           "differ, max |difference| "), last


def test_doctor_neutrality_refuses_a_nondeterministic_model(capsys):
    rc, last = _doctor("nondeterministic", capsys)
    assert rc == 1, last
    assert last.startswith("inconclusive: two trainings without the agent already differ (the "
                           "loss at step 0: 1 of 1 elements differ"), last


def test_doctor_neutrality_usage_errors(capsys):
    assert _doctor("not_a_model", capsys) == (
        2, "cannot check: the factory's model is a int, not a torch.nn.Module")
    assert _doctor("no_such_factory", capsys) == (
        2, "cannot check: neutrality_factories has no callable 'no_such_factory'")
    # MODULE may be a .py file
    from lockstep.__main__ import main  # pylint: disable=import-outside-toplevel
    capsys.readouterr()
    assert main(["doctor", "--neutrality", os.path.join(HERE, "neutrality_factories.py") +
                 ":tiny_transformer", "--steps", "2"]) == 0
    assert "after 2 steps (the agent" in capsys.readouterr().out
