"""Zoom: every torch function call in one module's own code, recorded for a few steps.

A birth point that is a container "born in its own code" (an attention block whose
softmax, masking and scaling are functional calls) names the module, not the call. A zoom
records, for ``steps`` steps, each torch function its forward calls itself (not those
of its submodules, which have rows of their own) as a module of its own, named
``module/func#k`` (``blocks.1.attn/softmax#0``: the first softmax of that call of
blocks.1.attn; a second call of the module is ``blocks.1.attn#1/softmax#0``): its
floating-point inputs as ``act_in`` rows and its outputs as ``act`` rows, as for a
module. The collector reads ``/`` as "inside" (docs/rules.md "Where the error is born"),
so the birth rule, which never blames a container when something inside it is the
birth point, names the call.

Cost: outside the zoomed module and steps nothing changes and nothing is paid. During
the zoom the module's forward runs under a TorchFunctionMode (torch >= 1.13), its
submodules carry two hooks that count how deep the call is, and each recorded call costs
what a module's hooks cost. Where the watch records ``act_grad``, the gradient each call's
output receives in backward is recorded too (``act_grad`` rows of the call's name), so that
the birth rule can name the call whose backward passes on a differing gradient while the
one it received agrees. A forward run again inside backward (activation checkpointing)
records nothing new.
Hooks and the mode run on the training thread under the GIL; nothing here raises into
the job (lockstep._guard).
"""
from __future__ import annotations

import copy
import functools
import operator

import torch

from lockstep import _session
from lockstep._config import safe_repr
from lockstep._names import call_name, input_names, output_tensors
from lockstep._recorder import KIND
from lockstep._watch import _grad_hook, _in_backward, _portable

try:  # torch >= 1.13
    from torch.overrides import TorchFunctionMode as _Mode
except ImportError:  # pragma: no cover - older torch: zoom is refused
    _Mode = None

_ACT, _ACT_IN = KIND["act"], KIND["act_in"]


def available():
    return _Mode is not None


def _func_name(func):
    """softmax, matmul, mul, linear, ...: the name a user reads in their code."""
    name = getattr(func, "__name__", None) or type(func).__name__
    if name.startswith("__") and name.endswith("__") and len(name) > 4:
        name = name[2:-2]  # Tensor.__mul__ -> mul (torch 1.13 names some so)
        if name.startswith("r") and hasattr(torch.Tensor, "__%s__" % name[1:]):
            name = name[1:]  # __rmul__ -> mul
    return name


def check_args(module, steps):
    """ValueError naming the argument of zoom() that cannot be used."""
    if not isinstance(module, str):
        raise ValueError("zoom(module=%s) is not valid: give a module's name, e.g. "
                         "'blocks.1.attn'" % safe_repr(module))
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 10000:
        raise ValueError("zoom(steps=%s) is not valid: give an integer from 1 to 10000"
                         % safe_repr(steps))
    if not available():
        raise ValueError("zoom() needs torch.overrides.TorchFunctionMode (torch >= 1.13); "
                         "this torch is %s" % torch.__version__)


def zoom_of(zooms, session, root, module, name, first, last, grads=True):
    """The Zoom of `module` (called `name`) in `zooms` widened to cover steps [first,
    last], or a new one appended there; `grads`: record the calls' output gradients."""
    for z in zooms:
        if z.module is module:
            z.first, z.last = min(z.first, first), max(z.last, last)
            z.grads = z.grads or grads
            return z
    z = Zoom(session, root, module, name, first, last, grads)
    zooms.append(z)
    return z


class Zoom:
    """One zoom: `module` (called `name` in the run's rows) for steps [first, last]."""

    def __init__(self, session, root, module, name, first, last, grads=True):
        self._session_ref = session.ref
        self.grads = grads
        self.rec = session.rec
        self.root = root
        self.module = module
        self.name = name
        self.first, self.last = first, last
        self.depth = 0      # submodule forwards under way inside the zoomed one
        self.counts = {}    # func name -> calls in the module's current forward
        self.base = None    # the module call's name while its forward runs
        self.recorded = 0
        # A capture waiting on one of this module's calls (lockstep._capture._CallTap):
        # told of each recorded call; None costs one attribute read per call.
        self.capture = None
        self._handles = []
        self._orig_forward = module.__dict__.get("forward")
        self._mode = _OpMode(self)
        self._wrapper = _ZoomForward(self, module.forward)
        module.forward = self._wrapper
        for child in module.modules():
            if child is module:
                continue
            self._handles.append(child.register_forward_pre_hook(_portable(self._down)))
            self._handles.append(child.register_forward_hook(_portable(self._up)))

    def _down(self, _module, _args):
        self.depth += 1

    def _up(self, _module, _args, _output):
        self.depth = max(0, self.depth - 1)

    def enter(self):
        """The module call's name when this forward is to be recorded, else None."""
        sess = self._session_ref()
        if sess is None or not sess.active or not self.root.training \
                or not torch.is_grad_enabled():
            return None
        if not self.first <= self.rec.step <= self.last or _in_backward(sess):
            return None
        self.depth = 0
        self.counts = {}
        self.base = call_name(self.name, sess.calls.get(self.name, 0))
        return self.base

    def record(self, func, args, kwargs, out, rng=None):
        """One call the module's own code made (inside the mode, which is off here);
        `rng`: the CPU RNG state before it, when a capture asked for it."""
        if self.depth or self.base is None:
            return
        items = []
        output_tensors(out, "", items)
        items = [(n, t) for n, t in items if t.is_floating_point()]
        if not items:  # .size(), .dim(), comparisons: nothing to compare
            return
        fname = _func_name(func)
        k = self.counts.get(fname, 0)
        self.counts[fname] = k + 1
        op = "%s/%s#%d" % (self.base, fname, k)
        rec = self.rec
        rec.module_types.setdefault("%s/%s" % (self.base, fname), fname)
        for item_name, t in input_names(op, args, kwargs or {}):
            rec.record(item_name, _ACT_IN, t.detach())
        for suffix, t in items:
            rec.record(op + suffix, _ACT, t.detach())
            if self.grads and t.requires_grad:
                _grad_hook(t, functools.partial(_session.act_grad_hook, self._session_ref,
                                                op + suffix))
        self.recorded += 1
        if self.capture is not None:
            self.capture(op, func, args, kwargs, out, rng)

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        if self.module.__dict__.get("forward") is self._wrapper:
            if self._orig_forward is None:
                del self.module.forward
            else:
                self.module.forward = self._orig_forward


class _ZoomForward:
    """The zoomed module's forward while the zoom lasts (an instance attribute: torch's
    _call_impl calls it). It goes with the module as the forward it wraps would: a copy of
    the module (copy.deepcopy, an EMA model) gets its own forward, not this one, which
    would run the zoomed module's; a pickle (torch.save(model)) gets the wrapped forward,
    so the saved module computes as this one and is not zoomed once loaded."""

    __slots__ = ("zoom", "inner")

    def __init__(self, zoom, inner):
        self.zoom = zoom
        self.inner = inner

    def __call__(self, *args, **kwargs):
        zoom, inner = self.zoom, self.inner
        base = zoom.enter()
        if base is None:
            return inner(*args, **kwargs)
        try:
            with zoom._mode:  # pylint: disable=protected-access
                return inner(*args, **kwargs)
        finally:
            zoom.base = None

    def __reduce__(self):
        """The module's forward without the zoom, as pickle's (callable, args)."""
        orig = self.zoom._orig_forward  # pylint: disable=protected-access
        if orig is not None:  # someone else's instance forward: itself
            return operator.itemgetter(0), ((orig,),)
        # The class's forward, bound: when the pickle is loaded, the new module's own
        # attributes are not set yet, so getattr finds the class's (deepcopy likewise).
        return getattr, (self.zoom.module, "forward")

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        orig = self.zoom._orig_forward  # pylint: disable=protected-access
        if orig is not None:
            return copy.deepcopy(orig, memo)
        module = memo.get(id(self.zoom.module), self.zoom.module)
        return getattr(module, "forward") if module is not self.zoom.module else self


class _OpMode(_Mode if _Mode is not None else object):
    """Sees every torch function call while the zoomed forward runs; torch turns the mode
    off inside __torch_function__, so what the recorder calls is not seen again."""

    def __init__(self, zoom):
        super().__init__()
        self._zoom = zoom

    def __torch_function__(self, func, types, args=(), kwargs=None):
        zoom = self._zoom
        tap = zoom.capture
        rng = tap.before() if tap is not None and zoom.depth == 0 else None
        out = func(*args, **(kwargs or {}))
        if zoom.depth == 0 and zoom.base is not None:
            sess = zoom._session_ref()
            try:
                zoom.record(func, args, kwargs, out, rng)
            except Exception as e:  # pylint: disable=broad-except  (never into the job)
                if sess is not None:
                    sess.guard.fail("the zoom of " + zoom.name, e)
        return out
