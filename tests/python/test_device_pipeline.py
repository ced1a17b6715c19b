"""The device pipeline's mechanics with a fake device backend (this machine has no
GPU): rows are shipped in step order only once their copy's event has completed (one
step late, never blocking), drain() honours its deadline, and at most 4 steps wait."""
import math
import time

import numpy as np
import torch

from lockstep import _core, _device

WIDTH = _core.PACKED_FIXED_COLUMNS + 2 + 0  # sketch_k=2, hist_bins=0


class FakeEvent:
    instances = []

    def __init__(self):
        self.done = False
        self.synchronized = False
        FakeEvent.instances.append(self)

    def record(self):
        pass

    def query(self):
        return self.done

    def synchronize(self):
        self.synchronized = True
        self.done = True


class FakeBackend:
    Event = FakeEvent


def fake_device_stats(tensors, sketch_k, hist_bins):
    rows = torch.zeros(len(tensors), WIDTH, dtype=torch.float64)
    for i, t in enumerate(tensors):
        rows[i, 0] = t.numel()
        rows[i, 5] = t.double().norm()
    return rows


def make_pipeline(monkeypatch):
    FakeEvent.instances = []
    monkeypatch.setattr(_device, "_backend", lambda device: FakeBackend)
    # CPU tensors play device tensors here
    monkeypatch.setattr(_device, "_on_device", lambda v: isinstance(v, torch.Tensor))
    shipped = []
    pipe = _device.DevicePipeline(2, 0, lambda *a: shipped.append(a))
    pipe._device_stats = fake_device_stats
    return pipe, shipped


def test_a_step_ships_when_its_copy_completes_in_step_order(monkeypatch):
    pipe, shipped = make_pipeline(monkeypatch)
    pipe.add(torch.full((4,), 2.0), 7, 0, 0, True)
    pipe.add(torch.ones(9), 8, 1, 0, False)
    pipe.end_step(0, {"loss": torch.tensor(1.5), "lr": 0.1, "host_grad_sq": None})
    assert shipped == []  # the copy has not landed: nothing blocks, nothing ships
    pipe.add(torch.ones(1), 7, 0, 0, True)
    pipe.end_step(1, {"loss": 2.0})
    FakeEvent.instances[1].done = True
    pipe.poll()
    assert shipped == []  # step 1 is ready but waits behind step 0
    FakeEvent.instances[0].done = True
    pipe.poll()
    assert [s[0] for s in shipped] == [0, 1]
    step, rows, micros, ids, orders, grad_sq, scalars = shipped[0]
    assert rows.shape == (2, WIDTH) and list(rows[:, 0]) == [4, 9]
    assert list(ids) == [7, 8] and list(orders) == [0, 1] and list(micros) == [0, 0]
    assert grad_sq == 16.0  # only the param_grad row: ||(2,2,2,2)||^2
    # the loss tensor travelled in the same copy and came back a float
    assert isinstance(scalars["loss"], float) and scalars["loss"] == 1.5
    assert scalars["lr"] == 0.1


def test_drain_waits_until_its_deadline_then_drops_and_counts(monkeypatch):
    pipe, shipped = make_pipeline(monkeypatch)
    pipe.add(torch.ones(3), 1, 0, 0, False)
    pipe.end_step(0, {})
    t0 = time.monotonic()
    assert pipe.drain(time.monotonic() + 0.2) is False
    assert 0.15 < time.monotonic() - t0 < 1.0
    assert shipped == [] and pipe.dropped_steps == 1


def test_at_most_four_steps_wait(monkeypatch):
    pipe, shipped = make_pipeline(monkeypatch)
    for step in range(6):
        pipe.add(torch.ones(2), 1, 0, 0, False)
        pipe.end_step(step, {})
    assert [s[0] for s in shipped] == [0, 1]
    assert FakeEvent.instances[0].synchronized and not FakeEvent.instances[2].synchronized


def test_steps_without_rows_keep_their_place(monkeypatch):
    pipe, shipped = make_pipeline(monkeypatch)
    pipe.add(torch.ones(2), 1, 0, 0, False)
    pipe.end_step(0, {})
    pipe.end_step(1, {"loss": 3.0})  # nothing on the device: no copy, but after step 0
    assert shipped == []
    FakeEvent.instances[0].done = True
    pipe.poll()
    assert [s[0] for s in shipped] == [0, 1] and shipped[1][1].shape == (0, WIDTH)
    assert shipped[1][5] is None and math.isclose(shipped[1][6]["loss"], 3.0)
    assert isinstance(shipped[0][1], np.ndarray)
