"""Issue 25: a module that returns a tuple is judged as a birth point like any other.
torch's nn.MultiheadAttention has three tensor inputs (act_in blocks.1.attn(0..2)) and a
tuple output (act blocks.1.attn[0], the attention, and [1], its averaged weights); before
this, its inputs belonged to no op and its outputs were ops without inputs, so a change
of its output was blamed on the enclosing block "in its own code".

Model: MhaNet (3 pre-norm blocks of our own, d_model 32, 4 heads: x = x + attn(ln1(x));
x = x + fc2(act(fc1(ln2(x)))), attn an nn.MultiheadAttention, batch_first), fp32 on CPU,
AdamW, 4 steps. The change: a forward hook on the candidate's blocks.1.attn multiplies
its output[0] by (1 + 1e-4) (what a kernel that computes differently would do; the
fingerprint does not see hooks). "Platform noise" (birth_models.PlatformNoise, seeded): every
leaf module's output and every attention's outputs x (1 + 1e-6 n), n ~ N(0, 1) (the
attention's own kernels are the platform's too: its out_proj is never called as a
module).

Measured (`lockstep compare --json` births at step 0, ratio = output error / what
rounding explains; each test prints them with pytest -s), build of 2026-11-27 ~19:00:
                     blocks.1.attn: in      out     ratio   blocks.1   best other op
  torch 1.13, exact                 0       1.0e-4  38.7    5.89 (*)   0.263 (blocks.2.attn)
  torch 1.13, noise                 1.4e-6  1.0e-4  7.15    2.29 (*)   0.397 (blocks.0.ln1)
  torch 2.11, exact                 0       1.0e-4  38.7    5.9  (*)   0.263 (blocks.2.attn)
  torch 2.11, noise                 1.4e-6  1.0e-4  7.37    2.26 (*)   0.403 (blocks.0.ln1)
  (*) the enclosing block sees the same error (its residual output 1.5e-5 apart) and is
  listed as explained by its attention (born false). Twins with noise: the largest ratio
  0.40 (blocks.0.ln1, whose input is the data, exact); exact twins: every op 0.
"""
import pytest
from torch import nn

from birth_models import D_FF, D_MODEL, LAYERS, NHEAD, BlockStack, PlatformNoise, batches
from scenario_lib import Run, fmt_alerts, one_first_divergence, step0_births

STEPS = 4
REL_CHANGE = 1e-4
CHANGED = "blocks.1.attn"


class MhaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D_MODEL)
        self.attn = nn.MultiheadAttention(D_MODEL, NHEAD, batch_first=True)
        self.ln2 = nn.LayerNorm(D_MODEL)
        self.fc1 = nn.Linear(D_MODEL, D_FF)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(D_FF, D_MODEL)

    def forward(self, x):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, need_weights=True)  # (output, averaged weights)
        x = x + a
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class MhaNet(BlockStack):
    def __init__(self):
        super().__init__(MhaBlock() for _ in range(LAYERS))


def scale_first_output(_module, _inputs, output):
    """The change: the attention's output (not its weights) x (1 + REL_CHANGE)."""
    return (output[0] * (1 + REL_CHANGE),) + tuple(output[1:])


def mha_run(state, change=False, noise=False):
    """A factory for collect_pair: one watched run of MhaNet from `state`; the change
    and the noise (every leaf module and every attention) are hooked before watch(), so
    lockstep records what the next op receives."""
    def make(endpoint, run, role, experiment):
        model = MhaNet()
        model.load_state_dict(state)
        if change:
            model.get_submodule(CHANGED).register_forward_hook(scale_first_output)
        if noise:
            PlatformNoise(model, types=nn.MultiheadAttention)
        return Run(endpoint, run, role, experiment, model=model)
    return make


def run_pair(tmp_path, exp, label, change, noise):
    """scenario_lib.step0_births for MhaNet: (alerts, ranked ops at step 0)."""
    return step0_births(tmp_path, exp, MhaNet, mha_run, batches(STEPS), label, change=change,
                        noise=noise)


@pytest.mark.parametrize("noise", [False, True], ids=["exact", "noise"])
def test_multihead_attention_is_the_birth_point(tmp_path, noise):
    alerts, ops = run_pair(tmp_path, "mha-" + ("noise" if noise else "exact"),
                           "changed attention, noise=%s" % noise, True, noise)
    text = fmt_alerts(alerts)
    fd = one_first_divergence(alerts)
    assert (fd["step"], fd["tensor"], fd["kind"], fd["cause"]) == (0, CHANGED, "act", "op"), text
    assert fd["severity"] == "warning", text  # 1e-4 is below the fp32 tolerance (1e-3)
    assert "the error is born in %s (MultiheadAttention)" % CHANGED in fd["message"], text
    assert "computes differently" in fd["message"] and "in its own code" not in fd["message"], text
    # The ranking: the attention is the only op born at step 0; its output differs by the
    # change, what it received by nothing (or the noise).
    born = [o for o in ops if o["born"]]
    assert [o["name"] for o in born] == [CHANGED], ops
    assert born[0]["pass"] == "forward", ops
    assert born[0]["output_error"] == pytest.approx(REL_CHANGE, rel=0.1), ops
    assert born[0]["input_error"] < 1e-5, ops
    assert born[0]["ratio"] > 5, ops


@pytest.mark.parametrize("noise", [False, True], ids=["exact", "noise"])
def test_twins_are_silent(tmp_path, noise):
    """No change: not a single alert, no op born (compare lists the 5 ops of largest
    ratio per step)."""
    alerts, ops = run_pair(tmp_path, "mha-twins-" + ("noise" if noise else "exact"),
                           "twins, noise=%s" % noise, False, noise)
    assert alerts == [], fmt_alerts(alerts)
    assert not [o for o in ops if o["born"]], ops
    if not noise:
        assert all(o["output_error"] == 0 for o in ops), ops
