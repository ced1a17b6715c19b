"""Hostile and random values at every Monitor argument, every LOCKSTEP_* variable, every
watch() and step() argument, around a real torch training loop: nothing escapes into
the loop, a bad value gives one RuntimeWarning naming it and a disabled monitor (or, for
step(), the value dropped and the monitor still working). A seeded generator stands in
for a property-testing library (none is installed): bounded, so the file runs in seconds.
"""
import math
import os
import random
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import lockstep
from lockstep import _config

CLOSED = "tcp://127.0.0.1:9"  # nothing listens: the agent drops, never blocks
SEED = 20261125


class Raises:
    """An object whose every conversion raises (a hostile __int__/__index__/__float__/
    __str__/__repr__/__bool__/__len__/__iter__/__fspath__)."""

    def _boom(self, *args):
        raise RuntimeError("hostile %s" % type(self).__name__)

    __int__ = __index__ = __float__ = __str__ = __repr__ = __bool__ = _boom
    __len__ = __iter__ = __fspath__ = _boom


class RaisesIndexOnly(int):
    def __index__(self):
        raise OverflowError("hostile __index__")


class FloatRaises:
    def __float__(self):
        raise ValueError("hostile __float__")


class StrSubclass(str):
    def strip(self, *args):
        raise RuntimeError("hostile strip")


def hostile_values():
    """Values a careless or hostile caller might pass, of every kind."""
    return [
        None, True, False, 0, 1, -1, -10, 2, 7, 16, 256, 257, 2**31, 2**32, 2**63, 2**64, -2**63,
        10**30, 10**400, 0.0, -0.0, 2.5, 1e-300, 1e308, math.nan, math.inf, -math.inf, "", " ", "5",
        "-1", "abc", "auto", "on", "off", "x" * 5000, "\x00", "tcp://127.0.0.1:9", "candidate",
        "run\n", b"5", bytearray(b"x"), [1], [], (1, 2), {}, {"a": 1}, {1, 2}, object(), Raises(),
        RaisesIndexOnly(3), FloatRaises(), StrSubclass("on"), np.int64(5), np.int64(-5),
        np.float32(1.5), np.float64("nan"), np.array([1, 2]), torch.tensor([1.0, 2.0]),
        torch.tensor(float("nan")), torch.tensor(3), torch.tensor(True), 1 + 2j, Ellipsis,
        int, lambda: 1, os.path,
    ]


ENV_STRINGS = ["", " ", "0", "1", "-1", "-10", "5.0", "1e309", "nan", "inf", "-inf", "0x10",
               "1_000", "\u0663", "9" * 5000, "maybe", "\t5\n", "true", "OFF", "yes ", "auto",
               "candidate", "tcp://127.0.0.1:9", "not an endpoint", "../etc/passwd", "x" * 300,
               "\u00e9\u00e8", "2147483648", "18446744073709551616", "/nonexistent/key.pub"]


@pytest.fixture
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("LOCKSTEP_") and key != "LOCKSTEP_BIN" or key in ("RANK", "WORLD_SIZE"):
            monkeypatch.delenv(key, raising=False)
    return monkeypatch


def lockstep_warnings(record):
    return [str(w.message) for w in record
            if issubclass(w.category, RuntimeWarning) and "lockstep" in str(w.message)]


def train(mon, steps=2, step_kwargs=None):
    """A small real training loop: forward, backward, update, mon.step()."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon.watch(model, optimizer=opt)
    for _ in range(steps):
        loss = model(torch.randn(3, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.step(**(step_kwargs if step_kwargs is not None else {"loss": loss, "lr": 0.1}))
    return model


def run_monitor_case(name, value):
    """Monitor(name=value) in a training loop. Returns (monitor, warnings)."""
    kwargs = {"run": "prop", "endpoint": CLOSED, "host_stats_thread": "off", name: value}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        mon = lockstep.Monitor(**kwargs)
        train(mon)
        mon.close(timeout=0.05)
    return mon, lockstep_warnings(record)


def test_every_monitor_argument_survives_hostile_values(clean_env):
    rng = random.Random(SEED)
    values = hostile_values()
    names = list(_config.OPTIONS)
    cases = [(n, v) for n in names for v in rng.sample(values, 6)]
    cases += [(n, v) for n in names for v in (None, Raises(), "x" * 5000, -1, 2.5)]
    disabled = 0
    for name, value in cases:
        mon, warned = run_monitor_case(name, value)  # nothing raises into the loop
        label = "%s=%s" % (name, _config.safe_repr(value))
        assert len(warned) <= 1, (label, warned)
        if not mon.enabled:
            disabled += 1
            assert warned and name in warned[0], (label, warned)
            assert "records nothing" in warned[0], (label, warned)
        else:
            assert mon.counters()["python_errors"] == 0, (label, mon.counters()["last_python_error"])
    assert disabled > len(cases) // 3  # most hostile values are refused, not accepted


def test_config_argument_survives_hostile_values(clean_env):
    """config= (the run fingerprint's user settings): any dict is taken, its unreadable
    values left out; anything else is one warning naming config= and a disabled monitor."""
    values = hostile_values() + [{"x": Raises(), Raises(): 1, "f": lambda: 1 / 0, "n": {"m": Raises()}}]
    for value in values:
        mon, warned = run_monitor_case("config", value)
        label = "config=%s" % _config.safe_repr(value)
        assert len(warned) <= 1, (label, warned)
        if isinstance(value, dict):
            assert mon.enabled and not warned, (label, warned)
            assert mon.counters()["python_errors"] == 0, (label, mon.counters()["last_python_error"])
        elif value is None:
            assert mon.enabled, label
        else:
            assert not mon.enabled and warned and "config=" in warned[0], (label, warned)
            assert "records nothing" in warned[0], (label, warned)


def test_unknown_and_positional_monitor_arguments_warn_and_disable(clean_env):
    with pytest.warns(RuntimeWarning, match="no argument 'rnak'; did you mean 'rank'"):
        mon = lockstep.Monitor(run="p", endpoint=CLOSED, rnak=1)
    assert not mon.enabled
    train(mon)
    with pytest.warns(RuntimeWarning, match="by name"):
        mon = lockstep.Monitor(*(["a"] * 25))
    assert not mon.enabled


def test_every_lockstep_variable_survives_hostile_strings(clean_env):
    rng = random.Random(SEED + 1)
    variables = ["LOCKSTEP_" + n.upper() for n in _config.OPTIONS] + ["LOCKSTEP_DISABLE"]
    cases = [(v, s) for v in variables for s in rng.sample(ENV_STRINGS, 5)]
    cases += [(v, s) for v in variables for s in ("-10", "maybe", "x" * 300)]
    for var, raw in cases:
        clean_env.setenv(var, raw)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            mon = lockstep.Monitor(run="prop", endpoint=CLOSED, host_stats_thread="off") \
                if var not in ("LOCKSTEP_RUN", "LOCKSTEP_ENDPOINT", "LOCKSTEP_HOST_STATS_THREAD") \
                else lockstep.Monitor()
            train(mon)
            mon.close(timeout=0.05)
        clean_env.delenv(var)
        warned = [w for w in lockstep_warnings(record) if "no run id given" not in w]
        label = "%s=%r" % (var, raw)
        assert len(warned) <= 1, (label, warned)
        if not mon.enabled and not (var == "LOCKSTEP_DISABLE" and _config.parse_switch(raw)):
            option = var[len("LOCKSTEP_"):].lower()
            assert warned and (var in warned[0] or option in warned[0] or
                               option.replace("_", " ") in warned[0]), (label, warned)


# The findings of issue 16, one by one.

def test_rank_minus_one_means_not_distributed(clean_env):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning at all
        mon = lockstep.Monitor(run="p", endpoint=CLOSED, rank=-1)
    assert mon.enabled and (mon.config["rank"], mon.config["world_size"]) == (0, 1)
    mon.close(timeout=0.05)
    clean_env.setenv("LOCKSTEP_RANK", "-1")
    mon = lockstep.Monitor(run="p", endpoint=CLOSED)
    assert mon.enabled and mon.config["rank"] == 0
    mon.close(timeout=0.05)


@pytest.mark.parametrize("kwargs,env,match", [
    (dict(start_step="5"), {}, "start_step='5' is not valid: give an integer >= 0"),
    (dict(sketch_k=2.5), {}, "sketch_k=2.5 is not valid: give an integer from 0 to 256"),
    (dict(close_timeout="x"), {}, "close_timeout='x' is not valid: give a number from 0 to 86400"),
    (dict(rank=3, world_size=2), {}, "rank=3 is not below world_size=2"),
    (dict(heartbeat_interval=math.inf), {}, "heartbeat_interval=inf is not valid"),
    ({}, {"LOCKSTEP_START_STEP": "-10"}, "LOCKSTEP_START_STEP='-10' is not valid: give an integer >= 0"),
    ({}, {"LOCKSTEP_SKETCH_K": "lots"}, "LOCKSTEP_SKETCH_K='lots' is not valid"),
])
def test_issue_findings_warn_once_and_disable(clean_env, kwargs, env, match):
    for k, v in env.items():
        clean_env.setenv(k, v)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        mon = lockstep.Monitor(run="p", endpoint=CLOSED, **kwargs)
        train(mon)
    warned = lockstep_warnings(record)
    assert len(warned) == 1 and match in warned[0], warned
    assert not mon.enabled
    with pytest.raises(ValueError, match=match.split("=")[0]):
        lockstep.Monitor(run="p", endpoint=CLOSED, strict=True, **kwargs)


@pytest.mark.parametrize("raw,disabled", [
    ("1", True), ("true", True), ("YES", True), (" on ", True), ("0", False), ("False", False),
    ("no", False), ("OFF", False), ("", False), ("maybe", True), ("2", True),
])
def test_lockstep_disable_values(clean_env, raw, disabled):
    clean_env.setenv("LOCKSTEP_DISABLE", raw)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        mon = lockstep.Monitor(run="p", endpoint=CLOSED)
    warned = lockstep_warnings(record)
    assert mon.enabled == (not disabled)
    known = raw.strip().lower() in ("", "1", "0", "true", "false", "yes", "no", "on", "off")
    assert bool(warned) == (not known), warned
    if not known:
        assert "LOCKSTEP_DISABLE=%r" % raw in warned[0] and "stays off" in warned[0]
    train(mon)  # a disabled Monitor takes any arguments too
    mon.step(bogus=1)
    mon.close(timeout=0.05)


def test_every_step_argument_survives_hostile_values(clean_env):
    rng = random.Random(SEED + 2)
    values = hostile_values()
    for name in ("loss", "lr", "loss_scale", "grad_norm", "samples"):
        for value in rng.sample(values, 8) + [Raises(), FloatRaises(), -1, "0.5"]:
            label = "step(%s=%s)" % (name, _config.safe_repr(value))
            mon = lockstep.Monitor(run="prop", endpoint=CLOSED, host_stats_thread="off")
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                train(mon, steps=3, step_kwargs={name: value})
            warned = lockstep_warnings(record)
            c = mon.counters()
            mon.close(timeout=0.05)
            assert mon.enabled, label
            assert c["steps"] == 3, label  # every step was closed
            assert c["python_errors"] == 0, (label, c["last_python_error"])  # no "internal error"
            assert len(warned) <= 1, (label, warned)  # once, not every step
            if warned:
                assert "step(%s=" % name in warned[0] and "dropped" in warned[0], (label, warned)


def test_step_samples_minus_one_is_one_warning_not_an_internal_error(clean_env):
    mon = lockstep.Monitor(run="p", endpoint=CLOSED)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        train(mon, steps=5, step_kwargs={"loss": 1.0, "samples": -1})
    warned = lockstep_warnings(record)
    assert len(warned) == 1 and "step(samples=-1) is not valid" in warned[0], warned
    assert "internal error" not in warned[0]
    assert mon.counters()["python_errors"] == 0 and mon.counters()["steps"] == 5
    with pytest.warns(RuntimeWarning, match="no_such"):
        mon.step(no_such=1)
    mon.close(timeout=0.05)


def test_nan_loss_is_a_value_not_a_mistake(clean_env):
    mon = lockstep.Monitor(run="p", endpoint=CLOSED)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train(mon, steps=2, step_kwargs={"loss": math.nan, "grad_norm": math.inf, "samples": 8})
    assert mon.counters()["python_errors"] == 0
    mon.close(timeout=0.05)


def test_every_watch_argument_survives_hostile_values(clean_env):
    rng = random.Random(SEED + 3)
    values = hostile_values()
    for name in ("model", "optimizer", "include", "exclude", "every", "kinds", "params",
                 "optim_state"):
        for value in rng.sample(values, 6) + [Raises()]:
            label = "watch(%s=%s)" % (name, _config.safe_repr(value))
            mon = lockstep.Monitor(run="prop", endpoint=CLOSED, host_stats_thread="off")
            model = nn.Linear(4, 1)
            kwargs = {"model": model, name: value}
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                mon.watch(**kwargs)
                for _ in range(2):
                    model(torch.randn(2, 4)).sum().backward()
                    mon.step(loss=1.0)
            warned = lockstep_warnings(record)
            c = mon.counters()
            mon.close(timeout=0.05)
            assert c["steps"] == 2, label
            assert c["python_errors"] == 0, (label, c["last_python_error"])
            assert len(warned) <= 1, (label, warned)
            if warned:
                assert name in warned[0] or "Module" in warned[0], (label, warned)
