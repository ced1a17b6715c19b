"""Monitor.capture's bounds and safety (lockstep._capture; docs/python.md "Capture and
replay"): off by capture=False / LOCKSTEP_CAPTURE=0, at most capture_limit captures and
capture_mb per capture (big tensors cut along their first dimension, the file says so),
a step already past refused, a failed save one warning and never an exception, files
readable with torch.load(weights_only=True) and replayable. No collector: the agent
sends to a closed port."""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import lockstep

CLOSED = "tcp://127.0.0.1:9"


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 1))


def train(mon, m, steps=2, batch=16):
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        loss = m(torch.randn(batch, 8, generator=g)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.step(loss=loss)


def monitor(tmp_path, run="r", role="baseline", **kw):
    mon = lockstep.Monitor(run=run, role=role, experiment="cap", endpoint=CLOSED,
                           capture_dir=str(tmp_path / "caps"), host_stats_thread="off", **kw)
    assert mon.enabled
    return mon


def lockstep_warnings(record):
    return [str(w.message) for w in record if str(w.message).startswith("lockstep")]


def test_a_module_capture_holds_what_replay_needs(tmp_path):
    m = model()
    mon = monitor(tmp_path)
    mon.watch(m)
    assert mon.capture("2", step=1)  # the LayerNorm, at step 1
    train(mon, m)
    assert mon.close(timeout=5)
    n = mon.counters()
    assert (n["captures_written"], n["captures_refused"], n["captures_failed"]) == (1, 0, 0), n
    path = n["capture_files"][0]
    assert path == str(tmp_path / "caps" / "cap" / "step1-2" / "r.rank0.pt")
    data = torch.load(path, weights_only=True)
    meta = json.loads(data["lockstep_capture"])
    assert meta == json.load(open(path + ".json", encoding="utf-8"))
    assert meta["module_type"] == "torch.nn.modules.normalization.LayerNorm"
    assert meta["settings"]["eps"] == 1e-5 and meta["settings"]["normalized_shape"] == \
        {"$tuple": [64]}
    assert set(data["tensors"]) == {"in.0", "param.weight", "param.bias", "rng.cpu", "out"}
    assert meta["tensors"]["in.0"]["shape"] == [16, 64] and meta["bound"]["cut"] == []
    assert meta["step"] == 1 and meta["torch"] == torch.__version__ and meta["role"] == "baseline"
    # twice the same file: identical
    out = subprocess.run([sys.executable, "-m", "lockstep", "replay", "--json", path, path],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["verdict"] == "identical"


def test_capture_off_writes_nothing(tmp_path, monkeypatch):
    for kw, env in (({"capture": False}, None), ({}, "0")):
        if env is not None:
            monkeypatch.setenv("LOCKSTEP_CAPTURE", env)
        m = model()
        mon = monitor(tmp_path, **kw)
        mon.watch(m)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            assert not mon.capture("1")
            assert not mon.capture("0")
        warned = lockstep_warnings(record)
        assert len(warned) == 1 and "capture is off" in warned[0], warned
        train(mon, m)
        mon.close(timeout=1)
        assert mon.counters()["captures_refused"] == 2
        assert not (tmp_path / "caps").exists()


def test_bad_capture_settings_are_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_CAPTURE", "maybe")
    with pytest.warns(RuntimeWarning, match="LOCKSTEP_CAPTURE='maybe' is not valid"):
        mon = lockstep.Monitor(run="r", endpoint=CLOSED)
    assert not mon.enabled
    monkeypatch.delenv("LOCKSTEP_CAPTURE")
    with pytest.warns(RuntimeWarning, match="capture_mb=0 is not valid"):
        assert not lockstep.Monitor(run="r", endpoint=CLOSED, capture_mb=0).enabled


def test_the_limit_a_past_step_and_bad_names_are_refused(tmp_path):
    m = model()
    mon = monitor(tmp_path, capture_limit=2)
    mon.watch(m)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert mon.capture("0", step=0) and mon.capture("0", step=0)  # the same: one
        assert mon.capture("3", step=0)
        assert not mon.capture("1", step=0)  # a third: over the limit
        train(mon, m, steps=1)
        assert not mon.capture("1", step=0)  # past
        assert not mon.capture("nope") and not mon.capture("0/softmax")
    assert len(lockstep_warnings(record)) == 1, lockstep_warnings(record)
    mon.close(timeout=5)
    n = mon.counters()
    assert (n["captures_written"], n["captures_refused"]) == (2, 4), n


def test_over_the_bound_big_tensors_are_cut(tmp_path):
    m = model()
    # ~4 KB: the GELU's 64x64 input and output are 16 KB each
    mon = monitor(tmp_path, capture_mb=0.004)
    mon.watch(m)
    assert mon.capture("1", step=0)
    train(mon, m, steps=1, batch=64)
    mon.close(timeout=5)
    path = mon.counters()["capture_files"][0]
    data = torch.load(path, weights_only=True)
    meta = json.loads(data["lockstep_capture"])
    assert sorted(meta["bound"]["cut"]) == ["in.0", "out"], meta["bound"]
    assert meta["bound"]["bytes"] <= 0.004 * 1024 * 1024
    assert meta["tensors"]["in.0"]["shape"] == [64, 64]
    rows = meta["tensors"]["in.0"]["saved_rows"]
    assert 0 < rows < 64 and data["tensors"]["in.0"].shape == (rows, 64)
    # the bound, the RNG state (kept whole, ~5 KB) and the file's own overhead
    assert os.path.getsize(path) < 0.004 * 1024 * 1024 + 5056 + 8192
    # input and output cut to the same rows: the GELU replays on them
    assert meta["tensors"]["out"]["saved_rows"] == rows
    out = subprocess.run([sys.executable, "-m", "lockstep", "replay", "--json", path, path],
                         capture_output=True, text=True, timeout=120)
    res = json.loads(out.stdout)
    assert out.returncode == 0 and res["verdict"] == "identical", res
    assert "cut to the capture's bound (in.0, out)" in res["notes"][0], res["notes"]


def test_a_failed_save_is_one_warning_and_training_goes_on(tmp_path):
    blocker = tmp_path / "caps"
    blocker.write_text("a file where the folder should be")
    m = model()
    mon = monitor(tmp_path)
    mon.watch(m)
    assert mon.capture("1", step=0) and mon.capture("3", step=1)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        train(mon, m)
        mon.close(timeout=5)
    warned = lockstep_warnings(record)
    assert len(warned) == 1 and "could not be written" in warned[0], warned
    n = mon.counters()
    assert (n["captures_written"], n["captures_failed"], n["python_errors"]) == (0, 2, 0), n


def forged(tmp_path, name, **header):
    """A capture file with a header of our making (what a hostile file could say)."""
    meta = {"format": "lockstep-capture", "version": 1, "row": "x", "step": 0, "run": name,
            "role": "baseline", "kind": "call", "args": {"$tuple": [{"$t": "in.0"}]},
            "kwargs": {"$dict": {}}, "outputs": [{"name": "", "tensor": {"$t": "out"}}],
            "tensors": {}}
    meta.update(header)
    path = tmp_path / (name + ".pt")
    torch.save({"lockstep_capture": json.dumps(meta),
                "tensors": {"in.0": torch.ones(3), "out": torch.ones(3)}}, str(path))
    return str(path)


@pytest.mark.parametrize("header,says", [
    ({"func": "torch.load"}, "touches files or global state"),
    ({"func": "torch.from_file"}, "touches files or global state"),
    ({"func": "os.system"}, "not in a namespace replay may call"),
    ({"func": "torch.nn.functional.__builtins__"}, "private"),
    ({"kind": "module", "module_type": "evil.Module", "settings": {}}, "not a torch.nn builtin"),
    ({"func": "torch.add", "args": {"$tuple": [{"$t": "in.0"}, {"$t": "gone"}]}},
     "was not saved"),
    ({"func": "torch.exp", "args": "not an argument list"}, "header is not as this replay"),
])
def test_replay_never_calls_outside_the_allowlist(tmp_path, header, says):
    a, b = forged(tmp_path, "a", **header), forged(tmp_path, "b", **header)
    out = subprocess.run([sys.executable, "-m", "lockstep", "replay", a, b],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cannot replay: ") and says in lines[0], lines
    assert not out.stderr.strip(), out.stderr


def test_replay_refuses_what_is_not_a_capture(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    a = forged(tmp_path, "a", func="torch.exp")
    for args, says in (([str(junk), a], "is not a lockstep capture"),
                       ([str(tmp_path / "none.pt"), a], "no such file"),
                       ([str(tmp_path)], "does not hold a baseline's and a candidate's")):
        out = subprocess.run([sys.executable, "-m", "lockstep", "replay", *args],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and says in out.stdout, (args, out.stdout, out.stderr)


def test_hostile_capture_arguments_are_one_warning(tmp_path):
    m = model()
    mon = monitor(tmp_path)
    mon.watch(m)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for name, step in ((None, None), (123, None), ("1", 1.5), ("1", True), ("1", "2"),
                           ("x" * 10000, None), ("1\x00", None), ("1#x", None),
                           ("1/gelu#", None), ("1/gelu#0/x#1", None)):
            assert mon.capture(name, step=step) is False, (name, step)
        train(mon, m, steps=1)
    assert len(lockstep_warnings(record)) == 1, lockstep_warnings(record)
    mon.close(timeout=1)
    n = mon.counters()
    assert (n["captures_refused"], n["python_errors"], n["captures_written"]) == (10, 0, 0), n
