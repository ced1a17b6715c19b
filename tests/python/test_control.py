"""What the job does with the collector's requests (lockstep._control; docs/design.md
"The control channel"), through a FakeAgent: a zoom starts at the requested step, from
the start of a step, and is answered "done" with the steps; a request for a step already
past starts at the next one; an unknown module is refused with why; an unknown action is
ignored; a step without requests never asks for them; the derived control endpoint.
A capture the collector asked for is replayed by the capture's writer thread and
answered a second time with the result (lockstep._self_replay); a replay that fails is
counted and answered with why; with capture off nothing is captured or replayed.
A sample request sets the stride from its step (steps divisible by k; the next step when
past), with watch(every=N) as its floor; k = 0 is refused."""
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


def tensor_steps(fake):
    return sorted({r["step"] for r in fake.records})


def test_a_sample_request_records_every_kth_step_from_its_step():
    """`sample` k from step S: tensors at the steps >= S divisible by k (both runs alike,
    whatever step each acts at); every step before S; the wire's Sampling says so."""
    mon, fake = fake_monitor()
    model = Net()
    mon.watch(model)
    train(mon, model, 1)
    fake.requests = [(1, "sample", "", 4, 5)]
    train(mon, model, 15)
    assert fake.answers == ((1, "done", 4, "sample every 5 steps from step 4"),), fake.answers
    assert tensor_steps(fake) == [0, 1, 2, 3, 5, 10, 15], tensor_steps(fake)
    assert fake.sampling["every"] == 5, fake.sampling
    fake.requests = [(2, "sample", "", 17, 1)]  # back to every step, from step 17
    train(mon, model, 4)
    assert fake.answers[-1] == (2, "done", 17, "sample every 1 steps from step 17"), fake.answers
    assert tensor_steps(fake)[-4:] == [15, 17, 18, 19], tensor_steps(fake)
    assert fake.sampling["every"] == 1, fake.sampling
    assert mon.counters()["python_errors"] == 0, mon.counters()["last_python_error"]
    mon.close()


def test_a_sample_request_for_a_step_already_past_starts_at_the_next():
    mon, fake = fake_monitor()
    model = Net()
    mon.watch(model)
    train(mon, model, 6)
    fake.requests = [(1, "sample", "", 2, 4)]  # taken when step 6 ends
    train(mon, model, 6)
    assert fake.answers == ((1, "done", 7, "sample every 4 steps from step 7"),), fake.answers
    assert tensor_steps(fake) == [0, 1, 2, 3, 4, 5, 6, 8], tensor_steps(fake)
    mon.close()


def test_the_users_every_is_the_floor_of_a_sample_request():
    """watch(every=2): k=3 becomes 4 (a multiple of 2: only steps the user records), and
    k=1 gives the user's 2 back, never every step."""
    mon, fake = fake_monitor()
    model = Net()
    mon.watch(model, every=2)
    train(mon, model, 1)
    fake.requests = [(1, "sample", "", 2, 3)]
    train(mon, model, 9)
    assert fake.answers == (
        (1, "done", 2, "sample every 4 steps from step 2 (asked 3; watch(every=2) is the floor)"),
    ), fake.answers
    assert tensor_steps(fake) == [0, 4, 8], tensor_steps(fake)
    fake.requests = [(2, "sample", "", 11, 1)]  # taken when step 10 ends
    train(mon, model, 6)
    assert fake.answers[-1][1:3] == ("done", 11), fake.answers
    assert tensor_steps(fake) == [0, 4, 8, 12, 14], tensor_steps(fake)
    mon.close()


def test_a_sample_request_of_zero_steps_is_refused():
    mon, fake = fake_monitor()
    model = Net()
    mon.watch(model)
    train(mon, model, 1)
    fake.requests = [(1, "sample", "", 1, 0)]
    train(mon, model, 3)
    assert fake.answers[0][1] == "refused" and "from 1 to" in fake.answers[0][3], fake.answers
    assert tensor_steps(fake) == [0, 1, 2, 3], tensor_steps(fake)
    mon.close()
