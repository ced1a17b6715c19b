"""What the job does with the collector's requests (lockstep._control; docs/design.md
"The control channel"), through a FakeAgent: a zoom starts at the requested step, from
the start of a step, and is answered "done" with the steps; a request for a step already
past starts at the next one; an unknown module is refused with why; an unknown action is
ignored; a step without requests never asks for them; the derived control endpoint."""
import torch
from torch import nn

from conftest import fake_monitor
from lockstep import _core


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.inner(x)) * 2


def train(mon, model, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        mon.step()


def test_a_zoom_request_is_done_from_the_requested_step():
    mon, fake = fake_monitor()
    model = Net()
    mon.watch(model)
    train(mon, model, 1)
    fake.requests = [(7, "zoom", "<root>", 3, 2), (8, "zoom", "nope", 3, 2),
                     (9, "dance", "inner", 3, 1)]
    train(mon, model, 5)
    answers = {a[0]: a[1:] for a in fake.answers}
    assert answers[7] == ("done", 3, "zoom <root> steps 3..4"), fake.answers
    assert answers[8][0] == "refused" and "no module" in answers[8][2], fake.answers
    assert answers[9][0] == "ignored" and "dance" in answers[9][2], fake.answers
    calls = {r["step"] for r in fake.records if "/" in r["name"]}
    assert calls == {3, 4}, sorted(calls)
    assert mon.counters()["python_errors"] == 0, mon.counters()["last_python_error"]
    mon.close()


def test_a_request_for_a_step_already_past_starts_at_the_next():
    mon, fake = fake_monitor()
    model = Net()
    mon.watch(model)
    train(mon, model, 4)
    fake.requests = [(1, "zoom", "<root>", 1, 1)]  # taken when step 4 ends
    train(mon, model, 2)
    assert fake.answers == ((1, "done", 5, "zoom <root> steps 5..5"),), fake.answers
    assert {r["step"] for r in fake.records if "/" in r["name"]} == {5}
    mon.close()


def test_a_step_without_requests_does_not_take_them():
    mon, fake = fake_monitor()
    model = Net()
    mon.watch(model)
    taken = []
    fake.take_requests = lambda: taken.append(1) or []
    train(mon, model, 3)
    assert not taken and not fake.answers
    mon.close()


def test_the_control_endpoint_is_derived_from_the_endpoint():
    assert _core.control_endpoint_for("tcp://127.0.0.1:6200") == "tcp://127.0.0.1:6202"
    assert _core.control_endpoint_for("ipc:///tmp/x") == "ipc:///tmp/x.control"
    assert _core.control_endpoint_for("tcp://127.0.0.1:*") == ""
    mon, _ = fake_monitor(endpoint="tcp://127.0.0.1:7000")
    assert mon.config["control_endpoint"] == "tcp://127.0.0.1:7002"
    mon.close()
    mon, _ = fake_monitor(control_endpoint="off")
    assert mon.config["control_endpoint"] == ""
    mon.close()
