"""Tiny Hugging Face transformers models for the scenarios (test_hf_models.py): a GPT-2
and a Llama, built from a config with random weights (nothing is downloaded: every
size is given here, and HF_HUB_OFFLINE=1 is set before transformers is imported so a
slip would fail instead of reaching the network), and synthetic token batches.

Sizes: 2 layers, hidden 64, 4 heads, vocab 128, sequence 32, batch 4; no dropout, so
two runs built from the same seed compute the same thing step after step.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded, ever
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.activations import ACT2FN  # noqa: E402

VOCAB, HIDDEN, HEADS, LAYERS, SEQ, BATCH = 128, 64, 4, 2, 32, 4


def gpt2(attn="eager", **overrides):
    """GPT2LMHeadModel (learned positions, LayerNorm, gelu_new MLP, tied head)."""
    kw = dict(vocab_size=VOCAB, n_positions=SEQ, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    kw.update(overrides)
    cfg = GPT2Config(**kw)
    cfg._attn_implementation = attn  # pylint: disable=protected-access
    model = GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"  # its class name does not say it; saves a warning per run
    return model


def llama(attn="eager", **overrides):
    """LlamaForCausalLM (rotary positions, RMSNorm, SiLU-gated MLP, grouped-query
    attention: 2 key/value heads for 4 query heads, untied head)."""
    kw = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
              num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS // 2,
              max_position_embeddings=SEQ, rms_norm_eps=1e-6, tie_word_embeddings=False,
              attention_dropout=0.0, bos_token_id=0, eos_token_id=0)
    kw.update(overrides)
    cfg = LlamaConfig(**kw)
    cfg._attn_implementation = attn  # pylint: disable=protected-access
    return LlamaForCausalLM(cfg)


BUILDERS = {"gpt2": gpt2, "llama": llama}


def activation(name):
    """A transformers activation module by its config name ("gelu", "silu", ...)."""
    return ACT2FN[name]


def token_batches(n, seed=7, batch=BATCH):
    """n batches of token ids [batch, SEQ] with something to learn: each sequence is a
    random start token followed by +1 steps modulo VOCAB, with 1 in 8 tokens replaced by
    a random one (so the loss falls over a few dozen steps and never reaches zero)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        start = torch.randint(0, VOCAB, (batch, 1), generator=g)
        ids = (start + torch.arange(SEQ)) % VOCAB
        noise = torch.randint(0, VOCAB, (batch, SEQ), generator=g)
        keep = torch.rand(batch, SEQ, generator=g) >= 0.125
        out.append(torch.where(keep, ids, noise))
    return out
