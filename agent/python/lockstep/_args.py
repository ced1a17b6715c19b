"""The arguments of Monitor's public methods: their checks and conversions, and
`lenient`, which keeps a method's real signature (keyword-only parameters, type hints:
what readers, IDEs and type checkers see) while a call that does not fit it warns
instead of raising TypeError into the training job.

Nothing here raises but ValueError, whose message says what is accepted."""
from __future__ import annotations

import difflib
import functools
import inspect
import math
import numbers
import operator
import re
from typing import Any, Callable, Dict, Tuple, TypeVar

import torch

from lockstep import _config

F = TypeVar("F", bound=Callable[..., Any])


def lenient(on_mismatch: Callable[..., Any]) -> Callable[[F], F]:
    """Decorates a method so that a call with an unknown keyword or too many positional
    arguments calls ``on_mismatch(self, message, args, kwargs)`` instead of raising
    TypeError: ``message`` says what was wrong (``"watch() has no argument 'kind'; did you
    mean 'kinds'?"``). A call that fits goes straight to the method (two cheap checks)."""
    def decorate(fn: F) -> F:
        params = list(inspect.signature(fn).parameters.values())[1:]  # without self
        positional = sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                         p.POSITIONAL_OR_KEYWORD))
        named = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                               p.KEYWORD_ONLY)
                          and not p.name.startswith("_"))
        accepted = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                                  p.KEYWORD_ONLY))
        what = fn.__name__ if fn.__name__ != "__init__" else "Monitor"

        @functools.wraps(fn)
        def call(self, *args, **kwargs):
            if len(args) <= positional and (not kwargs or kwargs.keys() <= accepted):
                return fn(self, *args, **kwargs)
            return on_mismatch(self, _mismatch(what, positional, named, args, kwargs),
                               args, kwargs)
        return call  # type: ignore[return-value]
    return decorate


def _mismatch(what: str, positional: int, named: frozenset, args: tuple,
              kwargs: Dict[str, Any]) -> str:
    unknown = sorted(k for k in kwargs if k not in named)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(named), n=1)
        return "%s() has no argument %r%s" % (what, unknown[0],
                                              "; did you mean %r?" % close[0] if close else "")
    extra = _config.safe_repr(args[positional:])
    if not positional:
        return ("%s() takes its arguments by name; %d positional argument(s) were given (%s)"
                % (what, len(args), extra))
    return ("%s() takes %d argument(s), then its options by name; %d more positional "
            "argument(s) were given (%s)" % (what, positional, len(args) - positional, extra))


def host_scalar(value):
    """float, or a 0-d device tensor left on its device (read with the step's copy)."""
    if value is None:
        return math.nan
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            return value.detach()
        return float(value.item())  # one op (~0.5 us); detach/reshape/index were ~7 us
    return float(value)


_SCALAR_TEXT = "give a number, a 1-element tensor or None"


def scalar(value):
    """A step() scalar (loss, lr, grad_norm) as _host_scalar gives it; ValueError saying
    what is accepted. NaN and inf are values (a NaN loss is a fact to report)."""
    if value is None:
        return math.nan
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError("a tensor of %d elements; %s (e.g. loss.mean())" % (value.numel(), _SCALAR_TEXT))
        if value.is_complex() or value.dtype == torch.bool:
            raise ValueError("a %s tensor; %s" % (str(value.dtype).replace("torch.", ""), _SCALAR_TEXT))
        return host_scalar(value)
    if isinstance(value, (bool, str, bytes, bytearray)) or not (
            isinstance(value, numbers.Real) or hasattr(type(value), "__float__")):
        raise ValueError("a %s; %s" % (type(value).__name__, _SCALAR_TEXT))
    return float(value)


def loss_scale(value):
    """A GradScaler gives its scale without a host sync (its _scale tensor)."""
    if value is not None and hasattr(value, "get_scale") and hasattr(value, "is_enabled"):
        if not value.is_enabled():
            return 1.0
        get_async = getattr(value, "_get_scale_async", None)
        scale = get_async() if get_async is not None else None
        return scalar(scale) if scale is not None else scalar(value.get_scale())
    return scalar(value)


_MAX_SAMPLES = 2**63 - 1


def samples(value):
    if value is None:
        return 0
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise ValueError("a %s; give an integer from 0 to 2**63-1 (samples in this step)"
                         % type(value).__name__)
    n = operator.index(value)
    if not 0 <= n <= _MAX_SAMPLES:
        raise ValueError("give an integer from 0 to 2**63-1 (samples in this step)")
    return n


def check_watch_args(optimizer, include, exclude, every, kinds, params,
                     optim_state) -> Tuple[int, Tuple[str, ...]]:
    """(every, kinds) checked; ValueError naming the argument, its value and what is
    accepted."""
    def bad(name, value, accepted):
        return ValueError("lockstep: watch(%s=%s) is not valid: %s; nothing is watched"
                          % (name, _config.safe_repr(value), accepted))
    if optimizer is not None:
        try:
            ok = hasattr(optimizer, "param_groups") and hasattr(optimizer, "state")
        except Exception:  # pylint: disable=broad-except
            ok = False
        if not ok:
            raise bad("optimizer", optimizer, "give a torch.optim.Optimizer or None")
    for name, value in (("include", include), ("exclude", exclude)):
        if value is not None and not isinstance(value, (str, re.Pattern)):
            raise bad(name, value, "give a regular expression (a str) or None")
    if isinstance(every, bool) or not hasattr(type(every), "__index__"):
        raise bad("every", every, "give an integer from 1 to 2**31-1")
    try:
        n = operator.index(every)
    except Exception:  # pylint: disable=broad-except
        raise bad("every", every, "give an integer from 1 to 2**31-1") from None
    if not 1 <= n <= 2**31 - 1:
        raise bad("every", every, "give an integer from 1 to 2**31-1")
    if isinstance(kinds, str):
        kinds = (kinds,)
    elif not isinstance(kinds, (list, tuple, set, frozenset)) or not all(
            isinstance(k, str) for k in kinds):
        raise bad("kinds", kinds, "give a tuple of kind names (act, act_grad, param_grad, param, "
                                  "optim, loss)")
    for name, value in (("params", params), ("optim_state", optim_state)):
        if not (type(value) is bool or (type(value) is int and value in (0, 1))):  # noqa: E721
            raise bad(name, value, "give True or False")
    return n, tuple(kinds)
