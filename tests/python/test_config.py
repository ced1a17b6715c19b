"""Monitor configuration from arguments and LOCKSTEP_* variables; LOCKSTEP_DISABLE;
platform and rank detection; seed_all."""
import inspect
import os
import random
import warnings

import numpy as np

import pytest
import torch
from torch import nn

import lockstep


@pytest.fixture
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("LOCKSTEP_") and key != "LOCKSTEP_BIN" or key in ("RANK", "WORLD_SIZE"):
            monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_environment_supplies_every_unset_argument(clean_env):
    clean_env.setenv("LOCKSTEP_RUN", "env-run")
    clean_env.setenv("LOCKSTEP_ROLE", "candidate")
    clean_env.setenv("LOCKSTEP_EXPERIMENT", "exp-1")
    clean_env.setenv("LOCKSTEP_ENDPOINT", "tcp://127.0.0.1:9")
    clean_env.setenv("LOCKSTEP_SKETCH_K", "8")
    clean_env.setenv("LOCKSTEP_PLATFORM", "npu")
    clean_env.setenv("LOCKSTEP_SEND_BUFFER_MB", "64")
    clean_env.setenv("RANK", "3")
    clean_env.setenv("WORLD_SIZE", "8")
    mon = lockstep.Monitor(experiment="arg-wins")
    try:
        c = mon.config
        assert (c["run"], c["role"], c["endpoint"], c["sketch_k"]) == (
            "env-run", "candidate", "tcp://127.0.0.1:9", 8)
        assert c["experiment"] == "arg-wins"
        assert c["send_buffer_mb"] == 64
        assert (c["platform"], c["rank"], c["world_size"]) == ("npu", 3, 8)
        assert c["framework"] == "torch " + torch.__version__
    finally:
        mon.close(timeout=0.5)


def test_defaults_detect_platform_and_generate_a_run_id(clean_env):
    with pytest.warns(RuntimeWarning, match="no run id"):
        mon = lockstep.Monitor(endpoint="tcp://127.0.0.1:9")
    try:
        expected = "cuda" if torch.cuda.is_available() else "cpu"
        assert mon.config["platform"] == expected
        assert mon.config["role"] == "solo"
        assert (mon.config["rank"], mon.config["world_size"]) == (0, 1)
        assert mon.run.startswith("run-")
    finally:
        mon.close(timeout=0.5)


def test_lockstep_disable_gives_a_no_op_monitor(clean_env):
    clean_env.setenv("LOCKSTEP_DISABLE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not a word: not even about an unknown argument
        mon = lockstep.Monitor(run="x", endpoint="not even checked")
        assert type(mon) is lockstep.Monitor and not mon.enabled and mon.run == "x"
        assert not lockstep.Monitor(run="x", rnak=1).enabled
    model = nn.Linear(2, 2)
    with mon:
        assert mon.watch(model, optimizer=None, every=2) is mon
        model(torch.randn(1, 2)).sum().backward()
        mon.step(loss=1.0, lr=0.1)
        assert mon.flush() and mon.counters() == {"python_errors": 0, "last_python_error": None}
    assert not model._forward_hooks  # nothing was hooked


@pytest.mark.parametrize("kwargs,match", [
    (dict(role="teacher"), "role 'teacher'"),
    (dict(run="../etc/passwd"), "run id"),
    # The collector's own rule (wire.h IsValidRunId): 1-128 of [A-Za-z0-9._-], no leading '.'
    (dict(run=".hidden"), r"run id '\.hidden' .*\(1-128, not starting with '\.'\)"),
    (dict(run="r" * 129), "run id"),
    (dict(run="a b"), "run id"),
    (dict(sketch_k=1000), "sketch_k=1000"),
    (dict(send_buffer_mb=-1), "send_buffer_mb=-1 is not valid: give an integer from 0 to 1048576"),
    (dict(send_buffer_mb=1, sketch_k=256), "at least 3 MiB"),
    # The C++ agent's own bound (agent.h kMaxQueueCapacity), checked in Python with the
    # same numbers instead of failing later in the engine.
    (dict(queue_capacity=65537), "queue_capacity=65537 is not valid: give an integer from 1 to 65536"),
])
def test_configuration_mistakes_warn_once_and_disable(clean_env, kwargs, match):
    kwargs.setdefault("run", "ok")
    with pytest.warns(RuntimeWarning, match=match):
        mon = lockstep.Monitor(endpoint="tcp://127.0.0.1:9", **kwargs)
    assert not mon.enabled
    with pytest.raises(ValueError, match=match):
        lockstep.Monitor(endpoint="tcp://127.0.0.1:9", strict=True, **kwargs)


def test_bad_environment_value_names_the_variable(clean_env):
    clean_env.setenv("LOCKSTEP_SKETCH_K", "lots")
    with pytest.raises(ValueError, match="LOCKSTEP_SKETCH_K"):
        lockstep.Monitor(run="x", endpoint="tcp://127.0.0.1:9", strict=True)


def test_watch_with_a_bad_regex_warns_and_watches_nothing(clean_env):
    mon = lockstep.Monitor(run="x", endpoint="tcp://127.0.0.1:9")
    model = nn.Linear(2, 2)
    with pytest.warns(RuntimeWarning, match="include pattern"):
        mon.watch(model, include="(unclosed")
    assert not model._forward_hooks
    mon.close(timeout=0.5)


def test_seed_all_makes_runs_repeatable(clean_env):
    def draw():
        return (random.random(), np.random.rand(), torch.rand(3).tolist(),
                nn.Linear(3, 3).weight.tolist())

    lockstep.seed_all(42)
    a = draw()
    lockstep.seed_all(42)
    b = draw()
    lockstep.seed_all(43)
    c = draw()
    assert a == b and a != c
    assert os.environ["PYTHONHASHSEED"] == "43"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert os.environ["HCCL_DETERMINISTIC"] == "true"
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    torch.use_deterministic_algorithms(False)


def test_seed_all_disable_dropout_turns_dropout_off(clean_env):
    x = torch.ones(1000)
    assert (nn.Dropout(0.5).train()(x) == 0).any()
    lockstep.seed_all(1, deterministic=False, disable_dropout=True)
    assert torch.equal(nn.Dropout(0.5).train()(x), x)
    assert torch.equal(torch.nn.functional.dropout(x, 0.9, True), x)
    mha = nn.MultiheadAttention(8, 2, dropout=0.9)
    q = torch.randn(5, 1, 8)
    torch.manual_seed(0)
    a = mha(q, q, q)[0]
    torch.manual_seed(1)
    b = mha(q, q, q)[0]
    assert torch.allclose(a, b)  # attention dropout is off too


def test_run_ids_the_collector_accepts_are_accepted(clean_env):
    for run in ("r" * 128, "a.b-c_D9", "-x", "_"):
        mon = lockstep.Monitor(run=run, endpoint="tcp://127.0.0.1:9", strict=True)
        assert mon.enabled, run
        mon.close(timeout=1.0)


def test_the_public_api_has_real_signatures_and_type_hints():
    # Keyword-only options (what IDEs and type checkers read), and the PEP 561 marker.
    init = inspect.signature(lockstep.Monitor.__init__).parameters
    assert all(p.kind is p.KEYWORD_ONLY for n, p in init.items() if n != "self"), init
    assert init["run"].annotation and init["strict"].default is False
    watch = inspect.signature(lockstep.Monitor.watch).parameters
    assert [n for n, p in watch.items() if p.kind is p.POSITIONAL_OR_KEYWORD] == \
        ["self", "model", "optimizer"]
    step = inspect.signature(lockstep.Monitor.step).parameters
    assert [n for n, p in step.items() if p.kind is p.POSITIONAL_OR_KEYWORD] == ["self", "loss"]
    assert inspect.signature(lockstep.Monitor.step).return_annotation in (None, "None")
    assert os.path.exists(os.path.join(os.path.dirname(lockstep.__file__), "py.typed"))


def test_a_call_that_does_not_fit_warns_and_never_raises(clean_env):
    mon = lockstep.Monitor(run="x", endpoint="tcp://127.0.0.1:9", host_stats_thread="off")
    model = nn.Linear(2, 2)
    with pytest.warns(RuntimeWarning, match="watch\\(\\) has no argument 'kind'; did you mean "
                                            "'kinds'\\?; nothing is watched"):
        assert mon.watch(model, kind=("act",)) is mon
    assert not model._forward_hooks
    with pytest.warns(RuntimeWarning, match="step\\(\\) takes 1 argument\\(s\\), then its "
                                            "options by name; 1 more positional"):
        mon.step(1.0, 0.1)  # lr is keyword-only: the step keeps its loss
    assert mon.counters()["steps"] == 1
    with pytest.raises(ValueError, match="Monitor\\(\\) has no argument 'rnak'"):
        lockstep.Monitor(run="x", rnak=1, strict=True)
    mon.close(timeout=0.5)
