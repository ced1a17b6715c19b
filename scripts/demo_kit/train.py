#!/usr/bin/env python3
"""One training run of the lockstep demo: a small transformer on synthetic data.

The same script runs the baseline and the candidate. The candidate emulates, honestly
labelled, a platform difference of the kind a GPU -> NPU migration meets: one
block that stores its output (the residual stream) in float16, as a fused kernel without
an fp32 output would. Everything else -- seeds, data, initial weights, optimizer -- is
identical, so any difference lockstep reports comes from that one operator:

  * from the first step its output differs by fp16 rounding (~5e-4 relative): small,
    and the noise floor and tolerances are there to not cry wolf about it, but it is
    fed back through training and grows;
  * the synthetic data's amplitude ramps up over the run (a stand-in for activations
    that grow during training), so that output eventually exceeds float16's range:
    the baseline (fp32) carries on, the candidate saturates to Inf and its loss turns
    NaN -- lockstep should warn about the overflow before the NaN appears.

Usage: train.py --role baseline|candidate --run NAME --experiment NAME --endpoint EP
                [--steps N] [--fp16-block I] [--ramp-start S] [--device cpu|cuda]
"""
import argparse
import math
import os
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

import lockstep


class Mlp(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d, heads, hidden, fp16_output=False):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = Mlp(d, hidden)
        # The emulated platform difference: this block's output is stored in float16.
        self.fp16_output = fp16_output

    def forward(self, x):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + a
        x = x + self.mlp(self.ln2(x))
        if self.fp16_output:
            x = x.to(torch.float16).to(torch.float32)
        return x


class TinyTransformer(nn.Module):
    def __init__(self, d_in=16, d=64, heads=4, hidden=128, layers=4, fp16_block=-1):
        super().__init__()
        self.embed = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList(
            [Block(d, heads, hidden, fp16_output=(i == fp16_block)) for i in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, d_in)

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


def batch(step, args, gen):
    """Synthetic regression: predict the next position's features; amplitude ramps."""
    x = torch.randn(args.batch, args.seq + 1, 16, generator=gen)
    amp = 1.0
    if step >= args.ramp_start:
        amp = math.exp((step - args.ramp_start) * args.ramp_rate)
    x = x.cumsum(dim=1) * amp / math.sqrt(args.seq)
    return x[:, :-1], x[:, 1:], amp


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=["baseline", "candidate"], required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--experiment", default="demo")
    p.add_argument("--endpoint", default=os.environ.get("LOCKSTEP_ENDPOINT", "tcp://127.0.0.1:6200"))
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--fp16-block", type=int, default=2,
                   help="candidate only: the block whose output is stored in fp16")
    p.add_argument("--ramp-start", type=int, default=150)
    p.add_argument("--ramp-rate", type=float, default=0.055)
    p.add_argument("--progress", type=int, default=0, help="print a line every N steps (0 = never)")
    p.add_argument("--device", default="cpu",
                   help="where the model trains (cuda: the agent's device path and fused kernel); "
                        "the data is drawn on the CPU either way, so both devices see the same batches")
    args = p.parse_args()

    torch.set_num_threads(1)
    lockstep.seed_all(1234, deterministic=True)
    fp16_block = args.fp16_block if args.role == "candidate" else -1
    model = TinyTransformer(fp16_block=fp16_block).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(99)

    mon = lockstep.Monitor(run=args.run, role=args.role, experiment=args.experiment,
                           endpoint=args.endpoint)
    mon.watch(model, optimizer=opt)
    t0 = time.time()
    for step in range(args.steps):
        x, y, amp = batch(step, args, gen)
        x, y = x.to(args.device), y.to(args.device)
        out = model(x)
        loss = F.mse_loss(out, y) / (amp * amp)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mon.step(loss=loss, lr=opt.param_groups[0]["lr"])
        if args.progress and (step % args.progress == 0 or step == args.steps - 1):
            print(f"[{args.role}] step {step:4d} loss {loss.item():.5g} amp {amp:.3g} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    mon.close()
    c = mon.counters()
    print(f"[{args.role}] done: {args.steps} steps in {time.time() - t0:.1f}s, "
          f"{c.get('records_sent', 0)} records sent, {c.get('records_dropped', 0)} dropped",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
