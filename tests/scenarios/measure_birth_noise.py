"""Plain torch (no lockstep): how large are the errors the birth-point scenarios make?
Prints, per change case of birth_models, at step 0, the relative L2 distance
||cand - base|| / ||base|| at the changed op's input and output (forward), or at the
gradient it receives and passes on (custom-backward), with and without platform noise;
the largest output/input ratio of any other op (what the noise alone makes); and the
drift of blocks.0.attn.qkv's output over a 300-step platform-noise-alone run, with and
without a qkv bias.

    OMP_NUM_THREADS=1 /usr/bin/python3 measure_birth_noise.py
"""
import torch
from torch import nn

torch.set_num_threads(1)

from birth_models import CHANGES, PlatformNoise, TinyGPT, batches, leaf_modules  # noqa: E402


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


class Capture:
    """Every named module's first input, output, received gradient (w.r.t. the output)
    and passed-on gradient (w.r.t. its first input), of one forward+backward."""

    def __init__(self, model):
        self.fwd_in, self.fwd_out, self.g_out, self.g_in = {}, {}, {}, {}
        for name, m in model.named_modules():
            if name:
                m.register_forward_hook(self._hook(name))

    def _hook(self, name):
        def hook(_m, inputs, out):
            x = inputs[0]
            self.fwd_in[name], self.fwd_out[name] = x.detach().clone(), out.detach().clone()
            if out.requires_grad:
                out.register_hook(lambda g: self.g_out.__setitem__(name, g.clone()))
            if x.requires_grad:
                x.register_hook(lambda g: self.g_in.__setitem__(name, g.clone()))
        return hook


def step0(change, noise):
    torch.manual_seed(1234)
    base = TinyGPT()
    cand = TinyGPT(change)
    cand.load_state_dict(base.state_dict())
    if noise:
        PlatformNoise(cand)  # before the capture hooks: they see the noisy outputs
    caps = []
    x, y = batches(1)[0]
    x = x.requires_grad_(True)  # so block 0's ln1 passes a gradient on too
    for m in (base, cand):
        cap = Capture(m)
        nn.functional.mse_loss(m(x), y).backward()
        caps.append(cap)
    return caps


def table(change, noise):
    cb, cc = step0(change, noise)
    rows = {}
    for name in cb.fwd_out:
        f_in, f_out = rel(cc.fwd_in[name], cb.fwd_in[name]), rel(cc.fwd_out[name], cb.fwd_out[name])
        b_out = rel(cc.g_out[name], cb.g_out[name]) if name in cb.g_out else float("nan")
        b_in = rel(cc.g_in[name], cb.g_in[name]) if name in cb.g_in else float("nan")
        rows[name] = (f_in, f_out, b_out, b_in)
    return rows


def ratio(a, b):
    return a / b if b > 0 else (float("inf") if a > 0 else 0.0)


def main():
    print("step 0, relative L2 distance cand vs base (forward: op input -> op output; "
          "backward: gradient received (w.r.t. output) -> gradient passed on (w.r.t. input))")
    for noise in (False, True):
        rows = table(None, noise)
        if noise:
            fr = max((ratio(r[1], r[0]), n) for n, r in rows.items())
            br = max((ratio(r[3], r[2]), n) for n, r in rows.items() if r[2] == r[2] and r[3] == r[3])
            print("noise-alone: largest fwd out/in ratio %.3g at %s %s; largest bwd ratio %.3g at %s %s"
                  % (fr[0], fr[1], rows[fr[1]][:2], br[0], br[1], rows[br[1]][2:]))
            for n in ("blocks.0.ln1", "blocks.0.attn.qkv", "blocks.1.ln2", "blocks.1.mlp.act",
                      "blocks.1.attn", "blocks.1.mlp.fc1", "blocks.1.mlp.gate", "head"):
                print("   noise-alone %-20s fwd in %.3g out %.3g | bwd recv %.3g passed %.3g" % ((n,) + rows[n]))
        else:
            assert all(v == 0 for r in rows.values() for v in r), "twins differ"
            print("twins: all zero")
    for change, (op, kind, _) in CHANGES.items():
        for noise in (False, True):
            rows = table(change, noise)
            f_in, f_out, b_out, b_in = rows[op]
            # leaf ops and the attention modules (they compute softmax themselves); other
            # containers are explained by their submodules
            ops = {n for n, _ in leaf_modules(TinyGPT())} | {"blocks.%d.attn" % i for i in range(3)}
            others = [(ratio(r[1], r[0]), n) for n, r in rows.items() if n != op and n in ops and r[0] > 0]
            line = "%-16s noise=%d %-18s fwd in %.3g out %.3g (ratio %.3g) | bwd recv %.3g passed %.3g (ratio %.3g)" % (
                change, noise, op, f_in, f_out, ratio(f_out, f_in), b_out, b_in, ratio(b_in, b_out))
            if others:
                best = max(others)
                line += " | max fwd ratio elsewhere %.3g at %s" % best
            print(line)
            if change == "custom-backward" or (change == "softmax-fp16" and noise):
                # the neighbours of the op, for the lead's calibration
                for n in sorted(rows):
                    if n.startswith("blocks.1.") or n == "blocks.0.mlp.gate":
                        print("      %-22s fwd in %.3g out %.3g | bwd recv %.3g passed %.3g" % ((n,) + rows[n]))

    drift(qkv_bias=True)
    drift(qkv_bias=False)


def drift(qkv_bias):
    """Drift over 300 steps with platform noise alone (AdamW, lr 1e-3)."""
    torch.manual_seed(1234)
    base = TinyGPT(qkv_bias=qkv_bias)
    cand = TinyGPT(qkv_bias=qkv_bias)
    cand.load_state_dict(base.state_dict())
    PlatformNoise(cand)
    outs = [{}, {}]
    for i, m in enumerate((base, cand)):
        m.blocks[0].attn.qkv.register_forward_hook(
            lambda _m, _i, o, i=i: outs[i].__setitem__("qkv", o.detach().clone()))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (base, cand)]
    losses = [[], []]
    for s, (x, y) in enumerate(batches(300)):
        for i, (m, o) in enumerate(zip((base, cand), opts)):
            loss = nn.functional.mse_loss(m(x), y)
            loss.backward()
            o.step()
            o.zero_grad()
            losses[i].append(loss.item())
        if s in (0, 1, 5, 10, 50, 150, 299):
            w = rel(cand.blocks[0].attn.qkv.weight, base.blocks[0].attn.qkv.weight)
            worst = max((rel(pc, pb), n) for (n, pb), (_, pc) in
                        zip(base.named_parameters(), cand.named_parameters()))
            print("noise-alone qkv_bias=%d step %3d: blocks.0.attn.qkv output rel %.3g, weight rel %.3g, "
                  "loss %.6g vs %.6g, most distant parameter %s %.3g"
                  % (qkv_bias, s, rel(outs[1]["qkv"], outs[0]["qkv"]), w, losses[0][-1], losses[1][-1],
                     worst[1], worst[0]))


if __name__ == "__main__":
    main()
