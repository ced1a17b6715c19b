"""lockstep never hurts the job: internal failures are caught, counted and warned about
once; close() and interpreter exit return within their timeouts without a collector."""
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch
from torch import nn

import lockstep
from conftest import fake_monitor


def model_and_data():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), torch.randn(8, 4)


def test_agent_failures_never_reach_the_training_loop_and_warn_once():
    mon, fake = fake_monitor()
    model, x = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon.watch(model, optimizer=opt)
    fake.fail = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = []
        for _ in range(3):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss=loss)
            losses.append(loss.item())
        mon.close(timeout=1.0)
    ours = [w for w in caught if "lockstep" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert "injected failure" in str(ours[0].message)
    fake.fail = False
    c = mon.counters()
    assert c["python_errors"] >= 3 * 4  # every hook and every step failed, and was counted
    assert "injected failure" in c["last_python_error"]
    assert losses[2] < losses[0]  # training went on


def test_failing_stats_kernel_in_a_hook_is_contained():
    mon, fake = fake_monitor()
    model, x = model_and_data()
    mon.watch(model)

    def broken(*args, **kwargs):
        raise ValueError("kernel exploded")

    fake.record_host_tensor = broken
    with pytest.warns(RuntimeWarning, match="kernel exploded"):
        loss = model(x).sum()
        loss.backward()
        mon.step(loss=loss)
    assert mon.counters()["python_errors"] > 0
    assert fake.ended == [0]  # the step still closed


def test_gradient_is_unchanged_by_the_hooks():
    model, x = model_and_data()
    ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    ref.load_state_dict(model.state_dict())
    mon, _ = fake_monitor()
    mon.watch(model)
    model(x).pow(2).mean().backward()
    ref(x).pow(2).mean().backward()
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_close_without_a_collector_returns_within_its_timeout():
    model, x = model_and_data()
    mon = lockstep.Monitor(run="nobody-listens", endpoint="tcp://127.0.0.1:9")
    assert mon.enabled
    mon.watch(model)
    for _ in range(5):
        loss = model(x).sum()
        loss.backward()
        mon.step(loss=loss)
    t0 = time.monotonic()
    ok = mon.close(timeout=1.0)
    elapsed = time.monotonic() - t0
    assert elapsed < 1.5, elapsed
    assert isinstance(ok, bool)  # messages wait in the socket (up to its HWM), not here
    assert mon.close() is True  # idempotent


def test_interpreter_exit_without_close_does_not_hang(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import atexit, time
        # atexit runs handlers last-in first-out: this one, registered before lockstep's
        # (at import), runs after it and timestamps the end of lockstep's exit flush.
        atexit.register(lambda: print("AFTER", time.monotonic(), flush=True))
        import torch, lockstep
        torch.set_num_threads(1)
        model = torch.nn.Linear(4, 4)
        mon = lockstep.Monitor(run="exit-test", endpoint="tcp://127.0.0.1:9",
                               close_timeout=30)
        mon.watch(model)
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            mon.step(loss=1.0)
        print("BEFORE", time.monotonic(), flush=True)
        # no close(): the atexit handler flushes with its own (2 s) bound, not 30 s
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    stamps = dict(line.split() for line in out.stdout.splitlines())
    assert float(stamps["AFTER"]) - float(stamps["BEFORE"]) < 2.0 + 1.0, stamps


def test_bad_endpoint_gives_a_warning_and_a_monitor_that_does_nothing():
    model, x = model_and_data()
    with pytest.warns(RuntimeWarning, match="endpoint|not-an-endpoint"):
        mon = lockstep.Monitor(run="bad", endpoint="not-an-endpoint")
    assert not mon.enabled
    mon.watch(model)
    loss = model(x).sum()
    loss.backward()
    mon.step(loss=loss)
    assert mon.close() is True
