"""The small transformer used by the end-to-end test and the overhead bench."""
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
