"""What the job does with the collector's requests (lockstep._control; docs/design.md
"The control channel"), through a FakeAgent: a zoom starts at the requested step, from
the start of a step, and is answered "done" with the steps; a request for a step already
past starts at the next one; an unknown module is refused with why; an unknown action is
ignored; a step without requests never asks for them; the derived control endpoint.
A capture the collector asked for is replayed by the capture's writer thread and
answered a second time with the result (lockstep._self_replay); a replay that fails is
counted and answered with why; with capture off nothing is captured or replayed."""
import threading
import warnings

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


def self_replays(fake):
    """Collects the job's second answers to capture requests (Agent.acknowledge_replay)
    with the thread that sent each."""
    got = []
    fake.acknowledge_replay = lambda rid, step, detail, r: got.append(
        (rid, step, detail, r, threading.current_thread().name)) or True
    return got


def test_a_requested_capture_is_replayed_on_the_writer_thread_and_answered_again(tmp_path):
    mon, fake = fake_monitor(capture_dir=str(tmp_path))
    got = self_replays(fake)
    model = Net()
    mon.watch(model)
    train(mon, model, 1)
    fake.requests = [(5, "capture", "inner", 2, 1)]
    train(mon, model, 3)
    assert mon.close()
    (rid, status, step, detail), = fake.answers
    assert (rid, status, step) == (5, "done", 2) and detail.startswith("capture inner at step 2 into ")
    (rid2, step2, detail2, r, thread), = got
    assert (rid2, step2, detail2) == (5, 2, detail) and thread == "ls-capture", got
    assert not r.get("error"), r
    assert r["file"] in detail and r["row"] == "inner" and r["dtype"] == "float32", r
    # A Linear in fp32 against float64: within a few ULPs of fp32, never zero-width
    assert 0 <= r["ulps"] < 8 and r["max_rel_error"] < 1e-5 and r["width"] == 4, r
    assert dict(r["settings"])["type"] == "'torch.nn.modules.linear.Linear'", r["settings"]
    assert len(r["settings_digest"]) == 32 and len(r["inputs_digest"]) == 32, r
    n = mon.counters()
    assert n["self_replays"] == 1 and n["self_replays_failed"] == 0, n
    assert n["python_errors"] == 0, n["last_python_error"]


def test_a_self_replay_that_fails_is_counted_and_answered_with_why(tmp_path):
    mon, fake = fake_monitor(capture_dir=str(tmp_path))
    got = self_replays(fake)
    model = Net()
    mon.watch(model)
    train(mon, model, 1)
    fake.requests = [(6, "capture", "<root>", 2, 1)]  # a module with submodules: no replay
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        train(mon, model, 3)
        assert mon.close()
    (_, _, _, r, _), = got
    assert "has submodules" in r["error"] and r["file"], r
    n = mon.counters()
    assert n["self_replays"] == 0 and n["self_replays_failed"] == 1 and n["captures_written"] == 1, n
    assert n["python_errors"] == 0, n["last_python_error"]
    said = [str(x.message) for x in w if "could not be replayed here" in str(x.message)]
    assert len(said) == 1, [str(x.message) for x in w]


def test_with_capture_off_nothing_is_captured_or_replayed(tmp_path):
    mon, fake = fake_monitor(capture=False, capture_dir=str(tmp_path))
    got = self_replays(fake)
    model = Net()
    mon.watch(model)
    train(mon, model, 1)
    fake.requests = [(7, "capture", "inner", 2, 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(mon, model, 3)
    assert mon.close()
    (_, status, _, detail), = fake.answers
    assert status == "refused" and "refused" in detail, fake.answers
    assert not got and not list(tmp_path.iterdir())
    assert mon.counters()["self_replays"] == 0
