"""A small GPT-like model with one switchable change in block 1, for the "where is the
error born" scenarios (issue 14, tests/test_op_birth.py), plus the "platform noise" that
another platform's kernels would add to every op.

Model (fp32, CPU, no dropout, float input, no embedding):
    x -> blocks[i]: x = x + attn(ln1(x)); x = x + mlp(ln2(x)) -> head -> per-token value
    attn: qkv Linear, causal scaled-dot-product attention with the softmax computed in the
          attention module's own forward code (no softmax module), proj Linear
    mlp:  fc1 Linear -> act GELU -> gate (a leaf module around a custom autograd Function,
          x * sigmoid(x) with a hand-written backward) -> fc2 Linear

CHANGES selects one change in block 1 of the candidate, at construction. Two kinds:
- visible in the run fingerprint (the module's extra_repr changes): gelu-tanh, ln-eps;
- invisible (same classes, same extra_repr; an attribute that is not printed, as a
  kernel difference between platforms would be): softmax-fp16, linear-bf16,
  custom-backward. For these the only evidence is the numbers.
"""
import math

import torch
from torch import nn
from torch.nn import functional as F


class Fp32LayerNorm(nn.LayerNorm):
    """scenario_lib.Fp32LayerNorm, repeated here so that measure_birth_noise.py runs
    without lockstep: LayerNorm computed in fp32, a no-op cast in an fp32 run; torch
    1.13's CPU layer_norm refuses a bf16 input under autocast without it."""

    def forward(self, x):
        return super().forward(x.float())

D_MODEL, NHEAD, D_FF, LAYERS, SEQ, BATCH = 32, 4, 64, 3, 8, 4

# case -> (module blamed, kind of the first_divergence alert, visible in the fingerprint)
CHANGES = {
    "gelu-tanh": ("blocks.1.mlp.act", "act", True),
    "ln-eps": ("blocks.1.ln2", "act", True),
    "softmax-fp16": ("blocks.1.attn", "act", False),
    "linear-bf16": ("blocks.1.mlp.fc1", "act", False),
    "custom-backward": ("blocks.1.mlp.gate", "act_grad", False),
}


class _SiluFn(torch.autograd.Function):
    """x * sigmoid(x) with its own backward, whose gradient is multiplied by `scale`
    (1.0 normally; 1.001 stands for a backward kernel that computes differently while
    the forward agrees)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        grad = g * (s * (1 + x * (1 - s)))
        if ctx.scale != 1.0:
            grad = grad * ctx.scale
        return grad, None


class Gate(nn.Module):
    """A leaf module around _SiluFn. `bwd_scale` is deliberately not in extra_repr: the
    fingerprint of both runs is the same."""

    def __init__(self, bwd_scale=1.0):
        super().__init__()
        self.bwd_scale = bwd_scale

    def forward(self, x):
        return _SiluFn.apply(x, self.bwd_scale)


class MaybeBf16Linear(nn.Linear):
    """nn.Linear that, with `bf16` set, computes in bf16 and returns fp32 (one kernel of
    lower precision). Used for every fc1 of every run, so the module type is the same."""

    bf16 = False

    def forward(self, x):
        if not self.bf16:
            return super().forward(x)
        return F.linear(x.bfloat16(), self.weight.bfloat16(), self.bias.bfloat16()).float()


class Attention(nn.Module):
    """Causal multi-head attention; the softmax is computed here (no submodule), in fp16
    precision when `softmax_fp16` is set (an attribute, not in extra_repr)."""

    def __init__(self, softmax_fp16=False, qkv_bias=True):
        super().__init__()
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL, bias=qkv_bias)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.softmax_fp16 = softmax_fp16

    def forward(self, x):
        b, t, d = x.shape
        hd = d // NHEAD
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, NHEAD, hd).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        if self.softmax_fp16:
            # An fp16 softmax kernel: fp16 in, fp16 out (torch 1.13 has no CPU fp16
            # softmax, so the computation itself is emulated in fp32 between roundings).
            w = scores.half().float().softmax(-1).half().float()
        else:
            w = scores.softmax(-1)
        y = (w.to(v.dtype) @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Mlp(nn.Module):
    def __init__(self, gelu="none", bf16_fc1=False, gate_scale=1.0):
        super().__init__()
        self.fc1 = MaybeBf16Linear(D_MODEL, D_FF)
        self.fc1.bf16 = bf16_fc1
        self.act = nn.GELU(approximate=gelu)
        self.gate = Gate(gate_scale)
        self.fc2 = nn.Linear(D_FF, D_MODEL)

    def forward(self, x):
        return self.fc2(self.gate(self.act(self.fc1(x))))


class Block(nn.Module):
    def __init__(self, change=None, qkv_bias=True):
        super().__init__()
        # Fp32LayerNorm: a plain LayerNorm in fp32 runs; lets the bf16-autocast run work
        # on torch 1.13's CPU (see scenario_lib). Same type in every run.
        self.ln1 = Fp32LayerNorm(D_MODEL)
        self.attn = Attention(softmax_fp16=change == "softmax-fp16", qkv_bias=qkv_bias)
        self.ln2 = Fp32LayerNorm(D_MODEL, eps=1e-3 if change == "ln-eps" else 1e-5)
        self.mlp = Mlp(gelu="tanh" if change == "gelu-tanh" else "none",
                       bf16_fc1=change == "linear-bf16",
                       gate_scale=1.001 if change == "custom-backward" else 1.0)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class BlockStack(nn.Module):
    """Blocks applied in order, then a Linear head to one value per token: the frame of
    TinyGPT and of test_tuple_modules' MhaNet (built blocks first, then the head, so the
    seeded weights are drawn in that order)."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(D_MODEL, 1)

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return self.head(x).squeeze(-1)


class TinyGPT(BlockStack):
    """`change` (a key of CHANGES, or None) applies to block 1 only. qkv_bias=False: the
    attention's qkv Linear has no bias (as LLaMA-style models). With a bias, the key
    part's gradient is mathematically zero (softmax ignores a shift common to all keys),
    rounding noise of ~1e-9 that Adam scales up to full lr-sized steps: under platform
    noise the key biases of two runs drift apart by ~1 % (measure_birth_noise.py)."""

    def __init__(self, change=None, qkv_bias=True):
        assert change is None or change in CHANGES, change
        super().__init__(Block(change if i == 1 else None, qkv_bias) for i in range(LAYERS))


def batches(n, seed=11):
    """Synthetic regression data: (x [BATCH, SEQ, D_MODEL], y [BATCH, SEQ])."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(D_MODEL, generator=g) / math.sqrt(D_MODEL)
    out = []
    for _ in range(n):
        x = torch.randn(BATCH, SEQ, D_MODEL, generator=g)
        out.append((x, (x @ w).tanh()))
    return out


def leaf_modules(model):
    return [(n, m) for n, m in model.named_modules() if n and not list(m.children())]


class PlatformNoise:
    """Forward hooks on every leaf module (and on every module of `types`, e.g.
    nn.MultiheadAttention, whose own kernels are the platform's too) that return each
    floating-point output tensor x (1 + rel * n), n standard normal from one generator
    seeded once: what another platform's kernels would do (outputs that differ by a few
    ulps, everywhere). A tuple output gets each of its tensors noised. Deterministic: the
    hooks run in the same order every step, so they draw the same sequence. The backward
    sees the noise too (the product is differentiated), as it would on another platform.

    Register before lockstep's watch(): lockstep's own forward hook then runs after
    ours and records the noisy output, which is also what the next op receives."""

    REL = 1e-6

    def __init__(self, model, seed=4242, rel=REL, types=()):
        self.gen = torch.Generator().manual_seed(seed)
        self.rel = rel
        self.handles = [m.register_forward_hook(self._hook) for n, m in model.named_modules()
                        if n and (not list(m.children()) or isinstance(m, types))]

    def _noisy(self, t):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return t
        n = torch.randn(t.shape, generator=self.gen, dtype=torch.float32)
        return t * (1 + self.rel * n).to(t.dtype)

    def _hook(self, _module, _inputs, output):
        if isinstance(output, tuple):
            return tuple(self._noisy(t) for t in output)
        return self._noisy(output)

    def remove(self):
        for h in self.handles:
            h.remove()
