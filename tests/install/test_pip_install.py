"""`pip install --no-build-isolation <checkout>` of the agent into fresh virtual environments,
as a user would (docs/python.md "Install"), each then sending into a real `lockstep collect`
from outside the source tree, checked with `lockstep inspect`:

  - Debian's Python 3.11 (`venv --system-site-packages`, so Debian's torch is there): a real
    training loop with lockstep.Monitor; `python -m lockstep doctor` sees the collector.
  - pyenv's CPython 3.12 when this machine has one (no torch): `import lockstep`, scalars
    through lockstep._core; skipped cleanly when there is no pyenv 3.12.

Builds go to build-pip/ in the checkout (ccache when present), so a rerun is incremental."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

SRC = os.environ.get("LOCKSTEP_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
LOCKSTEP = os.environ.get("LOCKSTEP_BIN", "lockstep")


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("LOCKSTEP_")}
    env["PIP_NO_INDEX"] = "1"  # offline: nothing may come from a registry
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    return env


class Collector:
    def __init__(self, tmp_path):
        self.data_dir = tmp_path / "data"
        ready = tmp_path / "ready.json"
        self.proc = subprocess.Popen(
            [LOCKSTEP, "collect", "--listen", "tcp://127.0.0.1:*", "--data-dir",
             str(self.data_dir), "--ready-file", str(ready), "--status-interval-s", "0",
             "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert self.proc.poll() is None, self.proc.stderr.read()
            assert time.monotonic() < deadline, "collector wrote no ready file in 20 s"
            time.sleep(0.01)
        self.endpoint = json.loads(ready.read_text())["listen"][0]

    def records(self, run, deadline_s=10.0):
        """The run log as JSON objects, polled until the agent's Goodbye is in."""
        path = self.data_dir / (run + ".lslog")
        deadline = time.monotonic() + deadline_s
        while True:
            recs = []
            if path.exists():
                out = subprocess.run([LOCKSTEP, "inspect", str(path)], capture_output=True,
                                     text=True, timeout=30, check=False).stdout
                recs = [json.loads(line) for line in out.splitlines() if line.strip()]
                if any(r["type"] == "Goodbye" for r in recs):
                    return recs
            if time.monotonic() > deadline:
                return recs
            time.sleep(0.05)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)


@pytest.fixture
def collector(tmp_path):
    c = Collector(tmp_path)
    yield c
    c.stop()


def venv_with_lockstep(base_python, where, system_site):
    """A fresh venv at `where` with lockstep pip-installed from the checkout; its python."""
    cmd = [base_python, "-m", "venv", str(where)]
    if system_site:
        cmd.insert(3, "--system-site-packages")
    r = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), cwd=where.parent)
    assert r.returncode == 0, "venv: " + r.stderr
    py = str(where / "bin" / "python")
    t0 = time.monotonic()
    r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-deps", SRC],
                       capture_output=True, text=True, env=clean_env(), cwd=where.parent,
                       timeout=600)
    assert r.returncode == 0, "pip install failed:\n" + r.stdout[-3000:] + r.stderr[-3000:]
    print("pip install into %s: %.1f s" % (where, time.monotonic() - t0))
    return py


def run_py(py, code, cwd, **env):
    e = clean_env()
    e.update(env)
    return subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=cwd, env=e,
                          timeout=120)


def assert_installed_outside_source(py, cwd):
    r = run_py(py, "import lockstep, lockstep._core as c; print(lockstep.__file__); print(c.__file__)", cwd)
    assert r.returncode == 0, r.stderr
    for path in r.stdout.split():
        assert not os.path.realpath(path).startswith(os.path.realpath(SRC) + os.sep), path
        assert "site-packages" in path, path
    # The type-hint marker (PEP 561) and the declared run-time dependency are installed too.
    r = run_py(py, "import os, lockstep, importlib.metadata as m; "
                   "print(os.path.exists(os.path.join(os.path.dirname(lockstep.__file__), "
                   "'py.typed'))); print(m.requires('lockstep'))", cwd)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["True", "['numpy']"], r.stdout


TRAIN = r"""
import sys, torch, lockstep
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
mon = lockstep.Monitor(run="pip-311", role="baseline", experiment="pip", strict=True)
mon.watch(model, optimizer=opt)
for step in range(4):
    x = torch.randn(32, 8); y = x.sum(1, keepdim=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    mon.step(loss=loss, lr=0.05)
    print("loss", step, loss.item())
mon.close()
"""


def test_debian_python311_venv_training_loop(tmp_path, collector):
    if subprocess.run(["/usr/bin/python3", "-c", "import ensurepip, torch"],
                      capture_output=True).returncode != 0:
        pytest.skip("Debian's python3-venv or python3-torch is missing (scripts/setup)")
    py = venv_with_lockstep("/usr/bin/python3", tmp_path / "venv311", system_site=True)
    work = tmp_path / "job"
    work.mkdir()
    assert_installed_outside_source(py, work)

    doctor = subprocess.run([py, "-m", "lockstep", "doctor", "--timeout", "2"], capture_output=True,
                            text=True, cwd=work, timeout=60,
                            env=dict(clean_env(), LOCKSTEP_ENDPOINT=collector.endpoint))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "torch 1." in doctor.stdout or "torch 2." in doctor.stdout, doctor.stdout
    assert "a ZeroMQ peer answers" in doctor.stdout, doctor.stdout
    # The wheel carries the torch bridge built for the torch that pip's Python imports,
    # inside the installed package (lockstep._bridge).
    bridge = [line for line in doctor.stdout.splitlines() if "bridge:" in line]
    assert bridge and "built for this torch" in bridge[0], doctor.stdout
    assert "site-packages" in bridge[0] and "_bridges" in bridge[0], bridge

    r = run_py(py, TRAIN, work, LOCKSTEP_ENDPOINT=collector.endpoint)
    assert r.returncode == 0, r.stderr
    losses = [float(line.split()[2]) for line in r.stdout.splitlines() if line.startswith("loss")]
    recs = collector.records("pip-311")
    scalars = [x["body"] for x in recs if x["type"] == "StepScalars"]
    assert [x["step"] for x in scalars] == [0, 1, 2, 3], recs[:5]
    assert len(losses) == 4
    for got, want in zip(scalars, losses):
        assert abs(got["loss"] - want) <= 1e-6 * max(1.0, abs(want)), (got, want)
    stats = [x for x in recs if x["type"] == "StepStats"]
    assert stats, "no tensor statistics arrived"
    hello = next(x["body"] for x in recs if x["type"] == "Hello")
    assert hello["role"] == "baseline" and hello["framework"].startswith("torch "), hello


SEND = r"""
import importlib.util, lockstep
from lockstep import _core
assert importlib.util.find_spec("torch") is None
try:
    lockstep.Monitor
except ImportError as e:
    print("monitor:", e)
a = _core.Agent.create(endpoint=ENDPOINT, run="pip-312", role="candidate", platform="cpu",
                       framework="none")
for step in range(5):
    a.record_scalars(step, loss=1.0 / (step + 1), lr=0.1)
    a.end_step(step)
print("flushed", a.flush(5.0))
print("closed", a.close(5.0))
print("counters", a.counters())
"""


def pyenv_312():
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    if shutil.which("pyenv"):
        r = subprocess.run(["pyenv", "root"], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip():
            root = r.stdout.strip()
    found = sorted(glob.glob(os.path.join(root, "versions", "3.12*", "bin", "python3.12")))
    return found[-1] if found else None


def test_pyenv_python312_venv_sends_scalars(tmp_path, collector):
    base = pyenv_312()
    if not base:
        pytest.skip("no pyenv CPython 3.12 on this machine ($(pyenv root)/versions/3.12*)")
    py = venv_with_lockstep(base, tmp_path / "venv312", system_site=False)
    work = tmp_path / "job"
    work.mkdir()
    assert_installed_outside_source(py, work)
    r = run_py(py, SEND.replace("ENDPOINT", repr(collector.endpoint)), work)
    assert r.returncode == 0, r.stderr
    assert "needs PyTorch" in r.stdout, r.stdout
    recs = collector.records("pip-312")
    scalars = [x["body"] for x in recs if x["type"] == "StepScalars"]
    assert [x["step"] for x in scalars] == [0, 1, 2, 3, 4], recs[:6]
    assert [x["loss"] for x in scalars] == pytest.approx([1.0, 0.5, 1 / 3, 0.25, 0.2])
    hello = next(x["body"] for x in recs if x["type"] == "Hello")
    assert hello["role"] == "candidate" and hello["framework"] == "none", hello

    v = subprocess.run([py, "-m", "lockstep", "--version"], capture_output=True, text=True,
                       cwd=work, env=clean_env())
    assert v.returncode == 0 and "Python 3.12" in v.stdout, v.stdout + v.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
