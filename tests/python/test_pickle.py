"""A watched model travels as an unwatched one would: torch.save(model) (a checkpoint that
holds the whole model, as many training scripts save one) works while lockstep watches,
zooms or captures it, without a warning, and the file loads and computes without
lockstep; copy.deepcopy(model) (an EMA model) computes with its own weights, zoomed or
not. lockstep's hooks are pickled as hooks that do nothing (py_portable.h); before, the
save raised TypeError ("cannot pickle 'lockstep._core.Hook' object") into the job.

Real torch and real pickles; the agent is the tests' FakeAgent (nothing here is sent)."""
import copy
import io
import os
import subprocess
import sys
import warnings

import torch
from torch import nn

from conftest import fake_monitor

# Loads the file torch.save wrote with lockstep made unimportable, and checks that the
# model computes what the watched one did.
_LOAD_WITHOUT_LOCKSTEP = r"""
import sys
sys.modules["lockstep"] = None  # `import lockstep` raises ImportError from here on
import torch
saved = torch.load(sys.argv[1], weights_only=False)
model = saved["model"]
model.train()
out = model(saved["x"])
assert torch.equal(out, saved["out"]), (out, saved["out"])
assert "optimizer" in saved and saved["optimizer"].param_groups
print("loaded and computed without lockstep")
"""


class Body(nn.Module):
    """A module with code of its own (what a zoom records) and an inplace ReLU."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.lin(x) * 0.5 + torch.tanh(x))


class Job:
    """A model, its optimizer and a Monitor (a FakeAgent's) watching both; zoom: the
    module to zoom from the first step. One step is taken. body=False: torch's modules
    only (a file the subprocess loads needs no class of this test's)."""

    def __init__(self, run, body=True, zoom=None):
        torch.manual_seed(0)
        middle = Body() if body else nn.ReLU(inplace=True)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), middle, nn.Linear(8, 2))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.mon, self.fake = fake_monitor(run=run)
        self.mon.watch(self.model, optimizer=self.opt)
        self.x = torch.randn(3, 4)
        if zoom is not None:
            assert self.mon.zoom(zoom, steps=2)
        self.step()

    def step(self):
        self.model(self.x).sum().backward()
        self.opt.step()
        self.opt.zero_grad()
        self.mon.step()

    def close(self):
        assert self.mon.counters()["python_errors"] == 0
        self.mon.close(timeout=1.0)


def _save(obj):
    """torch.save(obj) into bytes, any warning an error (torch warns of tensor hooks it
    does not serialize)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_a_watched_model_saves_whole_and_loads_without_lockstep(tmp_path):
    job = Job("pickle", body=False)
    with torch.no_grad():
        out = job.model(job.x)
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(_save({"model": job.model, "optimizer": job.opt, "x": job.x,
                            "out": out}).getvalue())
    env = dict(os.environ, PYTHONPATH="")  # lockstep is not on the path either
    r = subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_LOCKSTEP, str(path)],
                       capture_output=True, text=True, env=env, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert "computed without lockstep" in r.stdout
    # The watch goes on as before: the next step is recorded as the first one was
    # (less the initial weights, kind "param", recorded once).
    job.step()
    rows = [[(r["name"], r["kind"]) for r in job.fake.records if r["step"] == s
             and r["kind"] != "param"] for s in (0, 1)]
    assert rows[1] == rows[0] and rows[0]
    job.close()


def test_a_loaded_copy_is_not_watched_and_its_hooks_do_nothing():
    job = Job("pickle-inert")
    x = job.x
    loaded = torch.load(_save(job.model), weights_only=False)
    expected = job.model(x)
    recorded = len(job.fake.records)
    out = loaded(x)
    out.sum().backward()
    assert torch.equal(out, expected)
    assert len(job.fake.records) == recorded  # nothing of the loaded copy is recorded
    hooks = [h for m in loaded.modules()
             for h in list(m._forward_hooks.values()) + list(m._forward_pre_hooks.values())]
    assert hooks and all(h(loaded, (x,), out) is None for h in hooks)
    job.close()


def test_a_zoomed_model_saves_whole_and_copies_with_its_own_weights():
    job = Job("pickle-zoom", zoom="2")
    model, x = job.model, job.x
    assert any("2/" in r["name"] for r in job.fake.records)  # the zoom records calls
    # Saved in the middle of the zoom: the file's module computes, unzoomed.
    loaded = torch.load(_save(model), weights_only=False)
    assert torch.equal(loaded(x), model(x))
    assert "forward" not in loaded[2].__dict__ or loaded[2].forward.__self__ is loaded[2]
    # An EMA copy made in the middle of the zoom computes with its own weights; the
    # zoom's forward would have run the original's.
    twin = copy.deepcopy(model)
    with torch.no_grad():
        assert torch.equal(twin(x), model(x))
        twin[2].lin.weight.add_(1.0)
        assert not torch.equal(twin(x), model(x))
    job.close()


def test_a_model_with_a_capture_waiting_saves_whole():
    job = Job("pickle-capture")
    assert job.mon.capture("2.lin")
    loaded = torch.load(_save(job.model), weights_only=False)
    assert torch.equal(loaded(job.x), job.model(job.x))
    job.close()
