"""Shared fixtures of the Python agent's tests: a real `lockstep collect` on an
ephemeral port, `lockstep inspect` of its log, and a recording fake agent for unit
tests of the hooks (it computes statistics with the real C++ kernel)."""
import json
import os
import signal
import subprocess
import time

import pytest
import torch

torch.set_num_threads(1)

import lockstep  # noqa: E402  (after set_num_threads)
from lockstep import _core  # noqa: E402

KIND_NAMES = {v: k for k, v in _core.KINDS.items()}


def lockstep_bin():
    path = os.environ.get("LOCKSTEP_BIN", "")
    return path if path and os.access(path, os.X_OK) else None


class Collector:
    def __init__(self, proc, endpoint, data_dir):
        self.proc = proc
        self.endpoint = endpoint
        self.data_dir = data_dir

    def log_path(self, run):
        return os.path.join(self.data_dir, run + ".lslog")

    def inspect(self, run, deadline_s=10.0):
        """The run log as JSON objects, polled until the Goodbye has been logged."""
        deadline = time.monotonic() + deadline_s
        while True:
            records = []
            path = self.log_path(run)
            if os.path.exists(path):
                out = subprocess.run([lockstep_bin(), "inspect", path], capture_output=True,
                                     text=True, timeout=30, check=False)
                records = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
                if any(r["type"] == "Goodbye" for r in records):
                    return records
            if time.monotonic() > deadline:
                return records
            time.sleep(0.05)


def start_collector(tmp_path, *extra_args):
    """A real `lockstep collect` on an ephemeral port (plus `extra_args`), once its
    ready file is written: (Collector, the ready file's JSON)."""
    exe = lockstep_bin()
    if exe is None:
        pytest.skip("build/lockstep not built (LOCKSTEP_BIN unset); build target lockstep")
    ready = tmp_path / "ready.json"
    data = tmp_path / "data"
    # Its log goes to a file: a pipe nobody drains would stall a chatty collector.
    log = tmp_path / "collector.log"
    with open(log, "w") as err:
        # No control channel (tests/scenarios/test_auto_zoom.py tests it): a request
        # landing mid-test would make these tests depend on timing.
        proc = subprocess.Popen([exe, "collect", "--listen", "tcp://127.0.0.1:*", "--data-dir",
                                 str(data), "--ready-file", str(ready), "--control-listen", "off",
                                 *extra_args],
                                stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 20
    info = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail("lockstep collect exited: " + log.read_text())
        try:
            j = json.loads(ready.read_text())
            endpoint = j["listen"][0]
            info = j
            break
        except (OSError, ValueError, KeyError, IndexError):
            time.sleep(0.02)
    assert info, "lockstep collect wrote no ready file within 20 s"
    return Collector(proc, endpoint, str(data)), info


def stop_collector(c):
    c.proc.send_signal(signal.SIGTERM)
    try:
        c.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        c.proc.kill()
        c.proc.wait()


@pytest.fixture
def collector(tmp_path):
    c, _ = start_collector(tmp_path)
    yield c
    stop_collector(c)



def plain_stats(stats):
    """A FakeAgent record's statistics without its repeat mark (kStatRepeat): a repeat
    carries its producer's statistics, and the mark says which of the two it is."""
    return {k: v for k, v in stats.items() if k != "repeat"}

class FakeAgent:
    """Stands in for lockstep._core.Agent: keeps every call, computes host stats with
    the real kernel. Attribute `fail` makes every method raise (failure injection)."""

    def __init__(self, sketch_k=32, hist_bins=16, worker=False):
        self.k, self.bins = sketch_k, hist_bins
        self.has_host_worker = worker
        self.jobs = []         # [step, micro, id, order, compute(), stats or None]
        self.done = self.settled = self.waits = self.kicks = 0
        self.worker_full = False
        self.tensors = {}      # id -> (name, kind name, dtype, shape, order)
        self.module_types = {}  # name -> module type given at registration
        self.records = []      # dict(step, micro, name, kind, order, stats)
        self.scalars = []      # dict(step, loss, lr, grad_norm, loss_scale, ...)
        self.ended = []
        self.fail = False
        self.repeats = 0
        self._last = None      # the last record_host_tensor's statistics
        self.strided = 0       # strided views recorded or submitted in place

    def _check(self):
        if self.fail:
            raise RuntimeError("injected failure")

    def set_fingerprint(self, entries):
        self._check()
        self.fingerprint = dict(entries)
        return True

    def set_sampling(self, every, include, exclude, kinds):
        self._check()
        self.sampling = dict(every=every, include=include, exclude=exclude, kinds=list(kinds))
        return True

    # The control channel: requests a test puts in `requests` are taken at the next
    # step; the job's answers land in `answers`.
    requests = ()
    answers = ()

    def has_requests(self):
        return bool(self.requests)

    def take_requests(self):
        out, self.requests = list(self.requests), ()
        return out

    def acknowledge(self, rid, status, step, detail=""):
        self.answers = tuple(self.answers) + ((rid, status, step, detail),)
        return True

    def register_tensor(self, name, kind, dtype, shape, order, module_type=""):
        self._check()
        for tid, t in self.tensors.items():
            if t[0] == name and t[1] == KIND_NAMES[kind]:
                return tid
        tid = len(self.tensors)
        self.tensors[tid] = (name, KIND_NAMES[kind], dtype, tuple(shape), order)
        self.module_types[name] = module_type
        return tid

    def _add(self, step, micro, tid, order, stats):
        name, kind = self.tensors[tid][:2]
        self.records.append(dict(step=step, micro=micro, name=name, kind=kind, order=order,
                                 stats=stats))

    def record_host_tensor(self, step, micro, tid, order, ptr, numel, dtype):
        self._check()
        stats = _core.host_stats(ptr, numel, dtype, self.k, self.bins)
        self._add(step, micro, tid, order, stats)
        self._last = stats
        return stats["l2"]

    def record_host_tensor_strided(self, step, micro, tid, order, ptr, dtype, sizes, strides):
        self._check()
        self.strided += 1
        try:
            stats = _core.host_stats_strided(ptr, dtype, list(sizes), list(strides), self.k,
                                             self.bins)
        except ValueError:
            return _core.HostOutcome.BAD_LAYOUT
        self._add(step, micro, tid, order, stats)
        self._last = stats
        return stats["l2"]

    def record_repeat(self, step, micro, tid, order):
        self._check()
        if self._last is None:
            return _core.HostOutcome.NOTHING_TO_REPEAT
        self._add(step, micro, tid, order, dict(self._last, repeat=True))  # kStatRepeat
        self.repeats += 1
        return self._last["l2"]

    def record_packed(self, step, micros, ids, orders, rows, flags=None):
        self._check()
        for j, (m, i, o, row) in enumerate(zip(micros, ids, orders, rows)):
            stats = _core.unpack_row(row, self.k, self.bins)
            if flags is not None and flags[j] & _core.STAT_REPEAT:
                stats["repeat"] = True
            self._add(step, int(m), int(i), int(o), stats)
        return len(rows)

    def record_scalars(self, step, loss, lr, grad_norm, loss_scale, step_time_s, micro_steps,
                       samples, given=0):
        self._check()
        self.scalars.append(dict(step=step, loss=loss, lr=lr, grad_norm=grad_norm,
                                 loss_scale=loss_scale, step_time_s=step_time_s,
                                 micro_steps=micro_steps, samples=samples, given=given))
        return True

    def delivery_problem(self):
        self._check()
        return ""

    def end_step(self, step):
        self._check()
        self.ended.append(step)
        return True

    def set_identity(self, rank, world_size):
        self._check()
        self.identity = (rank, world_size)
        return True

    def flush(self, timeout_s=5.0):
        return True

    def close(self, timeout_s=5.0):
        return True

    def counters(self):
        self._check()
        return {"records_enqueued": len(self.records)}

    # ---- a host statistics thread, run by hand (FakeAgent(worker=True)) ----------
    # Jobs are computed when the test calls run_jobs() (or the recorder waits), with
    # the real kernel reading the tensor's memory then: a test decides exactly what
    # happens to a tensor between its hook and the read.

    def submit_host_tensor(self, step, micro, tid, order, ptr, numel, dtype):
        self._check()
        if self.worker_full:
            return _core.HostOutcome.FULL
        self.jobs.append([step, micro, tid, order,
                          lambda: _core.host_stats(ptr, numel, dtype, self.k, self.bins), None])
        return len(self.jobs) - 1

    def submit_host_tensor_strided(self, step, micro, tid, order, ptr, dtype, sizes, strides):
        self._check()
        if self.worker_full:
            return _core.HostOutcome.FULL
        sizes, strides = list(sizes), list(strides)
        try:  # what the real agent refuses at submit (a layout the kernel cannot read)
            _core.host_stats_strided(ptr, dtype, sizes, strides, 0, 0)
        except ValueError:
            return _core.HostOutcome.BAD_LAYOUT
        self.strided += 1
        self.jobs.append([step, micro, tid, order,
                          lambda: _core.host_stats_strided(ptr, dtype, sizes, strides, self.k,
                                                           self.bins), None])
        return len(self.jobs) - 1

    def run_jobs(self, upto=None):
        upto = len(self.jobs) if upto is None else upto
        for job in self.jobs[self.done:upto]:
            job[5] = job[4]()
        self.done = max(self.done, upto)

    def host_done(self):
        return self.done

    def host_kick(self):
        self.kicks += 1

    def host_wait(self, ticket):
        self.waits += 1
        self.run_jobs(ticket + 1)

    def host_settle(self, ticket, keep, as_last=False):
        assert ticket == self.settled and ticket < self.done, "settled out of order"
        self.settled += 1
        step, micro, tid, order, _, stats = self.jobs[ticket]
        if not keep:
            return _core.HostOutcome.DROPPED
        self._add(step, micro, tid, order, stats)
        if as_last:
            self._last = stats
        return stats["l2"]

    def names(self, kind=None, step=None):
        return [r["name"] for r in self.records
                if (kind is None or r["kind"] == kind) and (step is None or r["step"] == step)]


# watch()'s default kinds without "input" and "init": for tests that count or order a
# step's records of module outputs and gradients.
TENSOR_KINDS = ("act", "act_grad", "param_grad", "loss")


def fake_monitor(worker=False, **kwargs):
    """A Monitor whose agent is a FakeAgent (the real agent is created, then closed);
    worker=True: with a host statistics thread that the test runs by hand."""
    kwargs.setdefault("run", "unit")
    kwargs.setdefault("host_stats_thread", "off")
    kwargs.setdefault("endpoint", "tcp://127.0.0.1:9")  # nobody listens; never used
    mon = lockstep.Monitor(**kwargs)
    assert mon.enabled, "Monitor failed to start"
    mon._agent.close(0.5)
    fake = FakeAgent(mon.config["sketch_k"], mon.config["hist_bins"], worker=worker)
    mon._agent = fake
    mon._rec._agent = fake
    mon._rec.has_worker = worker
    mon._rec.set_threaded(worker)
    return mon, fake
