"""The device pipeline's mechanics with a fake device backend (this machine has no
GPU): rows are shipped in step order only once their copy's event has completed (one
step late, never blocking), drain() honours its deadline, and at most 4 steps wait."""
import math
import time

import numpy as np
import pytest
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
    step, rows, micros, ids, orders, grad_sq, scalars, flags = shipped[0]
    assert flags is None  # no repeats this step
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


def test_a_repeated_record_ships_the_row_it_repeats_without_computing_it(monkeypatch):
    pipe, shipped = make_pipeline(monkeypatch)
    batches = []

    def counting(tensors, k, bins):
        batches.append(len(tensors))
        return fake_device_stats(tensors, k, bins)

    pipe._device_stats = counting
    assert not pipe.add_repeat(9, 0, 0)  # nothing added yet this step: nothing to repeat
    pipe.add(torch.full((4,), 2.0), 7, 0, 0, False, defer=True)
    assert pipe.add_repeat(8, 1, 0)
    pipe.add(torch.ones(9), 5, 2, 0, True, defer=True)
    pipe.add(torch.ones(3), 6, 3, 0, False)  # computed at once, between deferred ones
    assert pipe.add_repeat(4, 4, 0)
    pipe.end_step(0, {})
    FakeEvent.instances[0].done = True
    pipe.poll()
    assert batches == [1, 2]  # three tensors computed, five rows shipped
    _, rows, micros, ids, orders, grad_sq, _, flags = shipped[0]
    # rows in the order they were computed; each carries its own order
    assert list(ids) == [6, 4, 7, 8, 5] and list(orders) == [3, 4, 0, 1, 2]
    # the repeats are said on the wire (the collector reports them under their producer)
    assert list(flags) == [0, _core.STAT_REPEAT, 0, _core.STAT_REPEAT, 0]
    assert list(rows[:, 0]) == [3, 3, 4, 4, 9]
    assert rows[0, 5] == rows[1, 5] == math.sqrt(3) and rows[2, 5] == rows[3, 5] == 4.0
    assert grad_sq == 9.0  # the param_grad row, found after the repeats shifted the rows
    # a new step starts without a tensor to repeat
    assert not pipe.add_repeat(8, 0, 0)


def test_device_path_computes_a_tensor_once_under_several_names(monkeypatch):
    """The device path (forced on CPU tensors): a container whose output is its last
    child's output, and the root's output equal to the head's, are computed once per
    step and recorded under every name, as on the host path; a view in another element
    order and a tensor changed in place in between are computed again."""
    from conftest import TENSOR_KINDS, fake_monitor, plain_stats  # pylint: disable=import-outside-toplevel
    from lockstep import _torch_stats  # pylint: disable=import-outside-toplevel
    from torch import nn  # pylint: disable=import-outside-toplevel

    calls = []
    real = _torch_stats.device_stats

    def counting(tensors, k, bins):
        calls.append(len(tensors))
        return real(tensors, k, bins)

    monkeypatch.setattr(_torch_stats, "device_stats", counting)

    class Block(nn.Module):  # a container: its output is its last child's output
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.act = nn.Tanh()

        def forward(self, x):
            return self.act(self.fc(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(4, 8)
            self.block = Block()
            self.head = nn.Linear(8, 3)

        def forward(self, x):  # the root's output is the head's
            return self.head(self.block(self.inp(x)))

    results = {}
    for force in (False, True):
        mon, fake = fake_monitor(_force_device_path=force)
        torch.manual_seed(0)
        net = Net()
        mon.watch(net, kinds=TENSOR_KINDS)
        calls.clear()
        for _ in range(2):
            loss = net(torch.randn(5, 4)).pow(2).mean()
            loss.backward()
            mon.step(loss=1.0)
        assert mon.close(timeout=2.0)
        results[force] = (fake, mon.counters()["tensors_repeated"], sum(calls))
    host, dev = results[False][0], results[True][0]
    # per step: block = block.act and <root> = head, for outputs and output gradients
    assert results[False][1] == results[True][1] == 8
    names = sorted({r["name"] for r in dev.records if r["kind"] == "act"})
    assert names == ["<root>", "block", "block.act", "block.fc", "head", "inp"]
    # 6 outputs + 6 output gradients + 6 parameter gradients per step, 4 of them repeats
    assert len(dev.records) == len(host.records) == 2 * 18
    assert results[True][2] == 2 * (18 - 4)  # tensors that went through device_stats
    recs = {(r["step"], r["name"], r["kind"]): r["stats"] for r in dev.records}
    hrecs = {(r["step"], r["name"], r["kind"]): r["stats"] for r in host.records}
    # both paths flag the same records as repeats, and a repeat has its producer's stats
    flagged = sorted((r["step"], r["name"], r["kind"]) for r in dev.records
                     if r["stats"].get("repeat"))
    assert flagged == sorted((r["step"], r["name"], r["kind"]) for r in host.records
                             if r["stats"].get("repeat"))
    assert len(flagged) == 8
    for step in (0, 1):
        for kind in ("act", "act_grad"):
            assert plain_stats(recs[(step, "<root>", kind)]) == \
                plain_stats(recs[(step, "head", kind)])
            assert plain_stats(recs[(step, "block", kind)]) == \
                plain_stats(recs[(step, "block.act", kind)])
            assert recs[(step, "<root>", kind)]["l2"] == pytest.approx(
                hrecs[(step, "<root>", kind)]["l2"], rel=1e-5)


def test_a_failed_batch_drops_its_records_and_its_repeats_only(monkeypatch):
    pipe, shipped = make_pipeline(monkeypatch)

    def failing(tensors, k, bins):
        if any(t.numel() == 5 for t in tensors):
            raise ValueError("device_stats got tensors on cuda:0 and cuda:1")
        return fake_device_stats(tensors, k, bins)

    pipe._device_stats = failing
    pipe.add(torch.ones(5), 1, 0, 0, False, defer=True)
    assert pipe.add_repeat(2, 1, 0)
    with pytest.raises(ValueError):
        pipe.flush_deferred()
    assert not pipe.add_repeat(3, 2, 0)  # the tensor it would repeat has no row
    pipe.add(torch.ones(2), 4, 3, 0, False, defer=True)
    assert pipe.add_repeat(5, 4, 0)
    pipe.end_step(0, {})
    FakeEvent.instances[0].done = True
    pipe.poll()
    _, rows, _, ids, orders, _, _, _ = shipped[0]
    assert list(ids) == [4, 5] and list(orders) == [3, 4] and list(rows[:, 0]) == [2, 2]


def test_a_skipped_batch_records_nothing(monkeypatch):
    """A batch whose statistics are skipped (device_stats gives None, as during CUDA
    graph capture) records nothing, and nothing repeats it."""
    pipe, shipped = make_pipeline(monkeypatch)
    pipe._device_stats = lambda tensors, k, bins: None
    pipe.add(torch.ones(5), 1, 0, 0, False, defer=True)
    pipe.flush_deferred()
    assert not pipe.add_repeat(2, 1, 0)
    pipe._device_stats = fake_device_stats
    pipe.add(torch.ones(2), 3, 2, 0, False)
    pipe.end_step(0, {})
    FakeEvent.instances[0].done = True
    pipe.poll()
    assert list(shipped[0][3]) == [3]
