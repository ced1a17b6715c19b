"""In-place modules (issue 20): the output gradient recorded for ``nn.ReLU(inplace=True)``
and for a block ending in ``out += identity; relu(out)`` is the gradient of the tensor
the module returned, so twin runs that differ only in ``inplace`` record bit-identical
act_grad rows (torch 1.13 hooked such outputs on the node before the in-place op)."""
import torch

from conftest import fake_monitor


class Block(torch.nn.Module):
    """torchvision's BasicBlock, in Linear layers: relu(fc2(relu(fc1(x))) + x)."""

    def __init__(self, inplace):
        super().__init__()
        self.inplace = inplace
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 8)
        self.relu = torch.nn.ReLU(inplace=inplace)

    def forward(self, x):
        identity = x
        out = self.relu(self.fc1(x))
        out = self.fc2(out)
        if self.inplace:
            out += identity
        else:
            out = out + identity
        return self.relu(out)


def _run(inplace, steps=2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(inplace=inplace),
                                Block(inplace), torch.nn.Linear(8, 3))
    mon, fake = fake_monitor(run="inplace-%s" % inplace)
    mon.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=gen)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.step(loss=loss)
    assert mon.counters()["python_errors"] == 0
    return fake


def _rows(fake, kind):
    return [(r["step"], r["micro"], r["order"], r["name"], tuple(sorted(
        (k, v) for k, v in r["stats"].items() if not isinstance(v, list))),
        tuple(r["stats"].get("sketch", ())))
        for r in fake.records if r["kind"] == kind]


def test_inplace_twins_record_identical_output_gradients():
    a, b = _run(False), _run(True)
    grads_a, grads_b = _rows(a, "act_grad"), _rows(b, "act_grad")
    names = {r[3] for r in grads_a}
    assert {"1", "2.relu", "2.relu#1", "2"} <= names, names
    assert grads_a == grads_b
    assert _rows(a, "param_grad") == _rows(b, "param_grad")


def test_inplace_relu_gradient_is_of_its_output():
    """Not only equal between twins: the recorded gradient of the in-place ReLU is the
    one after the ReLU (zero where it clipped), not that of the Linear before it."""
    fake = _run(True, steps=1)
    by_name = {r["name"]: r["stats"] for r in fake.records if r["kind"] == "act_grad"}
    relu, lin = by_name["1"], by_name["0"]
    # The loss reaches the ReLU's output everywhere; the Linear's output only where the
    # ReLU passed it: the ReLU's gradient has fewer zeros.
    assert relu["zero_count"] < lin["zero_count"], (relu, lin)
