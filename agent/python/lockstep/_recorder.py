"""Recorder: turns (name, kind, tensor) into agent records at the current
(step, micro step, execution order). The order counts the step's records in the
order they are made, across its micro steps (micro step 1's first record comes after
micro step 0's last), so "first in execution order" within a step is well defined.

CPU tensors go through the C++ one-pass kernel over the tensor's own memory (GIL
released on large tensors; a transposed or sliced view is read in place, in flat
order). Other devices go through the DevicePipeline (one copy per step). Called from
hooks under the GIL. The host path (everything below but the device path) is
``_core.RecorderCore``, the C++ base class of Recorder (agent/python/src/py_recorder.h):
it does per tensor what this module's Python did, without the bytecode.

The same tensor often reaches several hooks in a row: a container module's output is
its last child's output (``encoder.layers.1`` and its ``norm2``), a dropout with p=0
returns its input, and one gradient reaches the hooks of all of those. Its statistics
are computed once and recorded again for the other names (``record_repeat``), when the
tensor is the very same memory and unchanged (same version counter) as the one just
recorded on this thread. Only output and output-gradient tensors: holding a reference
to a parameter gradient after its hook would cost a copy (see ``record``). The device
path does the same (``DevicePipeline.add_repeat``: the row of the tensor added last is
shipped again, with no copy and no statistics kernels); both count ``repeats``.

With a host statistics thread (``Agent.start_host_worker``, Monitor's
host_stats_thread) the kernel runs there for outputs and output gradients while the
step goes on; the recorder holds each tensor until its statistics are computed and
settles the results in order at its next call (and at the end of the step). An output
can be changed in place after its hook (an inplace ReLU, ``out += identity``): a result
is recorded only if the tensor's version counter is unchanged when it is settled, and
is dropped (``tensors_changed_in_flight``) otherwise. To keep such drops away, a name's
first record is computed inline and watched until the end of its step; a name whose
tensor was changed in place stays inline. Parameter gradients go to the thread only as
the .grad autograd adopted (record_param_grad: holding the one a hook receives would make
autograd copy it). Tensors without a version counter stay inline.
"""
import threading

import torch

from lockstep import _core
from lockstep._names import module_type_of

KIND = dict(_core.KINDS)
_ACT, _ACT_GRAD, _PARAM_GRAD = KIND["act"], KIND["act_grad"], KIND["param_grad"]
_ACT_IN = KIND["act_in"]
_BACKWARD_KINDS = (_ACT_GRAD, _PARAM_GRAD)
# Kinds whose tensor may be the one recorded just before (record_repeat).
_REPEATABLE = frozenset((_ACT, _ACT_GRAD, _ACT_IN))
_get_ident = threading.get_ident
# Bytes per element, for the bound on what the host thread may hold (RecorderCore).
_BYTES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2, torch.float64: 8}


def _torch_dtype_codes():
    codes = {}
    for name, code in _core.DTYPES.items():
        dt = getattr(torch, name, None)
        if isinstance(dt, torch.dtype):
            codes[dt] = code
    return codes


DTYPE_CODES = _torch_dtype_codes()


def probe_host_dtypes(sketch_k, hist_bins):
    """The floating dtypes the C++ kernel accepts, found by asking it (so the package
    follows whatever the kernel supports without a list to keep in sync)."""
    ok = {}
    for dt, code in DTYPE_CODES.items():
        if not dt.is_floating_point:
            continue
        t = torch.zeros(4, dtype=dt)
        try:
            _core.host_stats(t.data_ptr(), 4, code, sketch_k, hist_bins)
        except ValueError:
            continue
        ok[dt] = code
    return ok


class Recorder(_core.RecorderCore):
    """The host path (record, record_param_grad, param_accumulated, settle and the host
    thread's bookkeeping) is _core.RecorderCore, in C++ (py_recorder.h): a Python frame
    is ~0.2 us, and the recorder ran ~3 us of them per recorded tensor. What stays here
    is rare or not on the host, and RecorderCore calls it back: registering a name
    (_register), the device path (_record_device), asking autograd for the end of
    backward (_queue_end_of_backward)."""

    def __init__(self, agent, sketch_k, hist_bins, pipeline, guard,
                 force_device_path=False):
        host_dtypes = probe_host_dtypes(sketch_k, hist_bins)
        super().__init__(agent, [(dt, code, _BYTES.get(dt, 8))
                                 for dt, code in host_dtypes.items()],
                         torch.strided, bool(force_device_path))
        self._guard = guard
        self._pipeline = pipeline
        self.module_types = {}  # module name -> type name (Watch fills it; _names.py)
        # The device path's last tensor handed to the DevicePipeline, when it is an
        # output or output gradient: (tensor, its version, thread), what add_repeat
        # would repeat.
        self._last_dev = None
        # Host statistics thread (see the module doc); Monitor's tuner may switch this
        # step's mode (set_threaded).
        self.has_worker = bool(getattr(agent, "has_host_worker", False))
        self.set_threaded(self.has_worker)

    def counters(self):
        """Monitor.counters()'s figures of the recorder."""
        return {"tensors_recorded": self.records, "tensors_repeated": self.repeats,
                "tensors_threaded": self.threaded,
                "tensors_changed_in_flight": self.changed_in_flight,
                "host_stats_thread": self._threaded, "tensors_skipped": self.skipped,
                "tensors_failed": self.failed}

    def new_step(self, step):
        self._new_step(step)
        self._last_dev = None

    def new_micro(self):
        self._new_micro()
        self._last_dev = None

    def _register(self, name, kind, t, order):
        """The tensor's agent id (RecorderCore keeps it per (name, kind)), -1 for a tensor
        without statistics (sparse or other non-strided layouts), or None when the agent
        refused it (counted there; tried again next time)."""
        if t.layout != torch.strided:
            return -1
        dtype = DTYPE_CODES.get(t.dtype, 0)
        tid = self._agent.register_tensor(name, kind, dtype, list(t.shape), order,
                                          module_type_of(name, self.module_types))
        return None if tid >= 0xFFFFFFFF else tid

    def _record_device(self, name, kind, t, tid, order):
        """record() of a tensor that is not on the CPU (or every tensor, with
        force_device_path): the DevicePipeline, one copy a step."""
        if not t.dtype.is_floating_point:
            self.skipped += 1
            return
        repeatable = kind in _REPEATABLE
        last = self._last_dev
        if repeatable and last is not None and self._is_last(t, last) \
                and self._pipeline.add_repeat(tid, order, self.micro):
            self.records += 1
            self.repeats += 1
            return
        self._last_dev = None
        if repeatable:
            try:
                self._last_dev = (t, t._version, _get_ident())
            except RuntimeError:  # inference tensors have no version counter
                pass
        self.records += 1
        # Every tensor is batched (one set of statistics kernels for up to 256 tensors:
        # a kernel launch costs ~10-20 us of host time, per-tensor statistics ~50 of
        # them). A module output is copied first (one kernel): an in-place op after
        # the hook (an inplace activation) must not change what is recorded. Gradients
        # are held as they are: autograd never changes in place a gradient someone
        # else references (AccumulateGrad copies a held parameter gradient into .grad
        # instead of adopting it: one copy, in C++).
        if kind == _ACT or kind == _ACT_IN:  # an input can be changed in place too
            t = t.detach().clone()
        self._pipeline.add(t, tid, order, self.micro, kind == _PARAM_GRAD, defer=True)
        if kind in _BACKWARD_KINDS and not self._end_of_backward_queued:
            self._queue_end_of_backward()

    @staticmethod
    def _is_last(t, last_record):
        """Whether `t` is the same memory, same layout and unchanged since `last_record`
        (tensor, version, thread) on this thread (views share their base's version
        counter)."""
        last, version, ident = last_record
        try:
            if ident != _get_ident() or t._version != version:
                return False
            return t is last or (t.data_ptr() == last.data_ptr() and t.dtype == last.dtype
                                 and t.shape == last.shape and t.stride() == last.stride())
        except RuntimeError:
            return False

    def _queue_end_of_backward(self):
        """Asks autograd to call us when this backward pass ends (hooks run inside it).
        Without that (an old torch, a hook called outside backward) the deferred batch
        is launched at its size bound or at end_step."""
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._end_of_backward_queued = True
        except Exception:  # pylint: disable=broad-except
            self._end_of_backward_queued = False

    def _end_of_backward(self):
        # Runs inside torch's backward: never raise from here.
        self._end_of_backward_queued = False
        try:
            if self.has_worker:
                self._agent.host_kick()
            self._pipeline.flush_deferred()
        except Exception as e:  # pylint: disable=broad-except
            self._guard.fail("the end-of-backward flush", e)
