"""Ranks (issue 20): a Monitor made before ``init_process_group`` under mp.spawn reports
the process group's rank and world size, not rank 0 of 1 in every process — a real
2-process gloo job into a real `lockstep collect`, read back with `lockstep inspect`.
And the agent's rank API (set_identity) on its own, and the one warning when a given
rank disagrees with the process group."""
import json
import os
import socket
import subprocess
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import lockstep
from conftest import fake_monitor, lockstep_bin

RUN = "spawned"
STEPS = 3


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, endpoint, port, errors):
    torch.set_num_threads(1)
    try:
        # Made before init_process_group: nothing says which rank this process is yet.
        mon = lockstep.Monitor(run=RUN, role="solo", endpoint=endpoint, host_stats_thread="off")
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                                world_size=world)
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        mon.watch(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(STEPS):
            x = torch.full((3, 4), float(rank + step))
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss=loss)
        assert mon.rank == rank, (mon.rank, rank)
        assert mon.config["world_size"] == world
        assert mon.close(5.0)
        dist.destroy_process_group()
    except BaseException as e:  # reported to the parent, which fails the test
        errors.put("rank %d: %s: %s" % (rank, type(e).__name__, e))
        raise


def test_spawned_ranks_reach_the_collector(collector, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCKSTEP_RANK", "LOCKSTEP_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    mp.spawn(_worker, args=(2, collector.endpoint, _free_port(), errors), nprocs=2, join=True)
    assert errors.empty()
    path = collector.log_path(RUN)
    records = collector.inspect(RUN)
    # Every message of each process, its Hello included, under its own rank.
    hellos = {r["rank"]: r for r in records if r["type"] == "Hello"}
    assert sorted(hellos) == [0, 1], sorted(hellos)
    assert all(h["body"]["world_size"] == 2 for h in hellos.values()), hellos
    by_rank_session = {}
    for r in records:
        by_rank_session.setdefault(r["session"], set()).add(r["rank"])
    assert sorted(map(sorted, by_rank_session.values())) == [[0], [1]], by_rank_session
    out = subprocess.run([lockstep_bin(), "inspect", "--summary", path], capture_output=True,
                         text=True, timeout=30, check=True)
    summary = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert sorted(s["rank"] for s in summary) == [0, 1], out.stdout
    for s in summary:
        assert s["world_size"] == 2 and s["sessions"] == 1 and s["goodbye"], s
        assert s.get("duplicates", 0) == 0 and s.get("gaps", 0) == 0, s


def test_rank_held_until_known_then_moved(collector, monkeypatch):
    """The agent's own API: a held identity sends nothing until set_identity; after a
    send, a changed rank is a new stream (its own Hello, seq from 0)."""
    from lockstep import _core
    agent = _core.Agent.create(endpoint=collector.endpoint, run="held", identity_pending=True)
    assert agent.flush(2.0)
    assert not os.path.exists(collector.log_path("held")) or all(
        r["type"] != "Hello" for r in collector.inspect("held", deadline_s=0.2))
    assert agent.set_identity(3, 4)
    agent.end_step(0)
    assert not agent.set_identity(4, 4)  # rank not below world_size: refused
    assert agent.set_identity(2, 4)
    agent.end_step(1)
    assert agent.close(5.0)
    records = collector.inspect("held")
    ranks = [(r["rank"], r["type"], r["seq"]) for r in records]
    assert ranks[0] == (3, "Hello", 0), ranks
    assert (2, "Hello", 0) in ranks, ranks
    assert {r for r, _, _ in ranks} == {2, 3}, ranks
    hello = [r for r in records if r["type"] == "Hello"]
    assert all(h["body"]["world_size"] == 4 for h in hello), hello


class _Group:
    """torch.distributed as an initialised process group of rank 1 of 2 would show it."""

    def __init__(self, rank=1, world=2):
        self.rank, self.world = rank, world

    def install(self, monkeypatch):
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_rank", lambda *a: self.rank)
        monkeypatch.setattr(dist, "get_world_size", lambda *a: self.world)


def test_a_given_rank_that_disagrees_warns_once(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCKSTEP_RANK", "LOCKSTEP_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    mon, fake = fake_monitor(rank=0, world_size=2)
    _Group(1, 2).install(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon.step()
        mon.step()
    msgs = [str(w.message) for w in caught if "torch.distributed says" in str(w.message)]
    assert len(msgs) == 1 and "rank 1 of 2" in msgs[0], [str(w.message) for w in caught]
    assert mon.rank == 0 and not hasattr(fake, "identity")
    assert mon.counters()["python_errors"] == 0


def test_a_late_process_group_moves_the_rank(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCKSTEP_RANK", "LOCKSTEP_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    mon, fake = fake_monitor()
    mon.step()  # no process group: the agent goes on as rank 0 of 1
    assert fake.identity == (0, 1)
    _Group(1, 2).install(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon.step()
    assert fake.identity == (1, 2) and mon.rank == 1
    assert any("from step 1 on it sends as rank 1 of 2" in str(w.message) for w in caught)


def test_not_distributed_is_never_reread(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCKSTEP_RANK", "LOCKSTEP_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    mon, fake = fake_monitor(rank=-1) if _accepts_minus_one() else pytest.skip(
        "rank=-1 not accepted by this build")
    _Group(1, 2).install(monkeypatch)
    mon.step()
    assert mon.rank == 0 and not hasattr(fake, "identity")


def _accepts_minus_one():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:  # rank=-1 ("not distributed") comes with the Monitor's argument checks
            mon = lockstep.Monitor(run="probe", rank=-1, endpoint="tcp://127.0.0.1:9")
        except (TypeError, ValueError, OverflowError):
            return False
        ok = mon.enabled
        mon.close(0.1)
        return ok
