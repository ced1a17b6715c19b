"""Small Hugging Face transformers models for the tests (torch 2.x stack only): a GPT-2
and a Llama-family decoder, random weights, nothing downloaded (HF_HUB_OFFLINE is set
before transformers is imported), and synthetic token batches.

    import hf_models
    if not hf_models.available(): pytest.skip(...)      # Debian's stack has no transformers
    model = hf_models.gpt2(seed=0)                      # GPT2LMHeadModel, 2 layers, d=64
    model = hf_models.llama(seed=0, rms_norm_eps=1e-5)  # LlamaForCausalLM; any config key
    for tokens in hf_models.token_batches(20, vocab=hf_models.VOCAB, seed=0):
        loss = hf_models.lm_loss(model, tokens)         # model(input_ids, labels).loss

Keyword arguments of gpt2() / llama() override the config (e.g. attn_implementation=
"eager" or "sdpa", hidden_act="gelu", n_layer=3); GPT2_CONFIG / LLAMA_CONFIG are the
defaults. The weights are drawn from torch's generator after torch.manual_seed(seed), so
the same seed gives the same model on every call. GPT-2 keeps its dropout (0.1 on
embeddings, attention and residuals): a test of determinism then also checks that the
random stream is consumed identically.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

VOCAB = 128
SEQ = 64
GPT2_CONFIG = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                   bos_token_id=0, eos_token_id=1)
LLAMA_CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=SEQ, bos_token_id=0, eos_token_id=1)


def available():
    """Whether transformers imports here (the torch 2.x venv has it; Debian's stack not)."""
    try:
        import transformers  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        return True
    except Exception:  # pylint: disable=broad-except
        return False


def gpt2(seed=0, **overrides):
    """A GPT2LMHeadModel of GPT2_CONFIG (with `overrides`), in training mode."""
    from transformers import GPT2Config, GPT2LMHeadModel  # pylint: disable=import-outside-toplevel
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(**dict(GPT2_CONFIG, **overrides))).train()


def llama(seed=0, **overrides):
    """A LlamaForCausalLM of LLAMA_CONFIG (with `overrides`), in training mode."""
    from transformers import LlamaConfig, LlamaForCausalLM  # pylint: disable=import-outside-toplevel
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**dict(LLAMA_CONFIG, **overrides))).train()


def token_batches(n, vocab=VOCAB, batch=4, seq=32, seed=0):
    """n batches of random token ids [batch, seq], from a generator of their own (the
    global random stream stays the models')."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(n)]


def lm_loss(model, tokens):
    """The causal language-model loss of `tokens` (the model shifts the labels)."""
    return model(input_ids=tokens, labels=tokens).loss
