"""The models of the tests and benches: the small transformer of the end-to-end test and
the overhead benches, and GPT-2-small-sized and ~1B Llama-style decoders (each with a tiny
variant for CPU smoke runs) for the GPU model bench."""
import math

import torch
from torch import nn


class TinyTransformer(nn.Module):
    """Linear embedding -> TransformerEncoder -> linear head, on synthetic float input."""

    def __init__(self, d_in=16, d_model=32, nhead=4, d_ff=64, layers=2, dropout=0.0):
        super().__init__()
        self.embed = nn.Linear(d_in, d_model)
        layer = nn.TransformerEncoderLayer(d_model=d_model, nhead=nhead, dim_feedforward=d_ff,
                                           dropout=dropout, batch_first=True)
        # enable_nested_tensor only matters for eval fast paths; off keeps 1.13 and 2.x alike
        kwargs = {"enable_nested_tensor": False} if "enable_nested_tensor" in \
            nn.TransformerEncoder.__init__.__code__.co_varnames else {}
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, **kwargs)
        self.head = nn.Linear(d_model, 1)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x))).squeeze(-1)


def synthetic_batches(n, batch=8, seq=12, d_in=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d_in, generator=g)
    for _ in range(n):
        x = torch.randn(batch, seq, d_in, generator=g)
        yield x, (x @ w).tanh()


# ---- realistic decoders for the GPU bench (plain torch: no download, no transformers) ----
def _causal_attention(q, k, v):
    """[B, H, S, Dh] causal attention: torch's fused kernel where it exists (2.x), the
    explicit masked softmax otherwise (torch 1.13)."""
    sdpa = getattr(nn.functional, "scaled_dot_product_attention", None)
    if sdpa is not None:
        return sdpa(q, k, v, is_causal=True)
    s = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    return att.masked_fill(mask, float("-inf")).softmax(-1) @ v


class _GPT2Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh")
                                 if "approximate" in nn.GELU.__init__.__code__.co_varnames
                                 else nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = _causal_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


GPT2_SMALL = dict(layers=12, d=768, heads=12, vocab=50257, seq=1024)
GPT2_TINY = dict(layers=2, d=64, heads=4, vocab=512, seq=64)


class GPT2(nn.Module):
    """A GPT-2-shaped decoder (GPT2_SMALL: 124 M parameters, the LM head tied to the
    token embedding as in GPT-2); forward(tokens [B, S]) -> logits [B, S, vocab]."""

    def __init__(self, layers, d, heads, vocab, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList(_GPT2Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype) if x.dtype != torch.float32 else \
            y * self.weight


def _rotary(seq, dh, device, base=10000.0):
    inv = 1.0 / (base ** (torch.arange(0, dh, 2, device=device).float() / dh))
    f = torch.outer(torch.arange(seq, device=device).float(), inv)
    return f.cos(), f.sin()  # [S, Dh/2]


def _apply_rotary(x, cos, sin):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    y = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return y.flatten(-2).to(x.dtype)


class _LlamaBlock(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.heads = heads
        self.input_layernorm = RMSNorm(d)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        h = self.input_layernorm(x)
        q, k, v = (p(h).view(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
        y = _causal_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.o_proj(y)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


LLAMA_1B = dict(layers=16, d=2048, heads=16, ffn=5632, vocab=32000, seq=2048)
LLAMA_TINY = dict(layers=2, d=64, heads=4, ffn=172, vocab=512, seq=64)


class Llama(nn.Module):
    """A Llama-style decoder (RMSNorm, SwiGLU, rotary positions; LLAMA_1B: ~1.0 G
    parameters, untied head); forward(tokens [B, S]) -> logits [B, S, vocab]."""

    def __init__(self, layers, d, heads, ffn, vocab, seq):
        super().__init__()
        self.dh = d // heads
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(_LlamaBlock(d, heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens):
        cos, sin = _rotary(tokens.shape[1], self.dh, tokens.device)
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def lm_batch(vocab, batch, seq, device, seed=0):
    """(tokens, targets) of random token ids: the next-token shift of one sequence."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return t[:, :-1].to(device), t[:, 1:].to(device)
