"""Factories for `python -m lockstep doctor --neutrality neutrality_factories:NAME`, as a
user would write them (test_neutrality.py runs the doctor on each): a callable that
returns (model, batch[, loss_fn]) or a dict. Two of them are made to fail on purpose."""
import itertools

import torch
from torch import nn

import model_zoo


def tiny_transformer():
    """model_zoo's TinyTransformer with dropout (the random stream must be consumed the
    same with the agent), an MSE loss given as loss_fn(model, batch)."""
    torch.manual_seed(0)
    model = model_zoo.TinyTransformer(dropout=0.1)
    x, y = next(model_zoo.synthetic_batches(1))
    return model, (x, y), lambda m, b: nn.functional.mse_loss(m(b[0]), b[1])


def hf_gpt2():
    """A transformers GPT-2 (torch 2.x stack), the default loss: the output's .loss."""
    import hf_models  # pylint: disable=import-outside-toplevel
    tokens = hf_models.token_batches(1)[0]
    return dict(model=hf_models.gpt2(), batch=dict(input_ids=tokens, labels=tokens),
                optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9))


class _HookSensitiveLinear(nn.Linear):
    """A layer whose output changes (by one part in 10^6) when anything hooks it: the
    kind of user code the check exists to catch (torch's own fast paths test for hooks)."""

    def forward(self, x):
        out = super().forward(x)
        return out * (1 + 1e-6) if self._forward_hooks else out


def hook_sensitive():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), _HookSensitiveLinear(16, 1))
    return model, torch.randn(4, 8)


_calls = itertools.count()


class _Drifting(nn.Module):
    """A model that is not deterministic: its output depends on how often it ran."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 1)

    def forward(self, x):
        return self.lin(x) + 1e-3 * next(_calls)


def nondeterministic():
    torch.manual_seed(0)
    return _Drifting(), torch.randn(4, 8)


def not_a_model():
    return 42, torch.zeros(1)
