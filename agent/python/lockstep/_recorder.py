"""Recorder: turns (name, kind, tensor) into agent records at the current
(step, micro step, execution order).

CPU tensors go through the C++ one-pass kernel over the tensor's own memory
(``Agent.record_host_tensor``, GIL released; a non-contiguous tensor is made
contiguous first). Other devices go through the DevicePipeline (one copy per step).
Called from hooks under the GIL; the counters are plain ints for that reason.

The same tensor often reaches several hooks in a row: a container module's output is
its last child's output (``encoder.layers.1`` and its ``norm2``), a dropout with p=0
returns its input, and one gradient reaches the hooks of all of those. Its statistics
are computed once and recorded again for the other names (``record_repeat``), when the
tensor is the very same memory and unchanged (same version counter) as the one just
recorded on this thread. Only output and output-gradient tensors: holding a reference
to a parameter gradient after its hook would cost a copy (see ``record``).
"""
import threading

import torch

from lockstep import _core

KIND = dict(_core.KINDS)
_ACT, _ACT_GRAD, _PARAM_GRAD = KIND["act"], KIND["act_grad"], KIND["param_grad"]
_BACKWARD_KINDS = (_ACT_GRAD, _PARAM_GRAD)
_get_ident = threading.get_ident


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


class Recorder:
    def __init__(self, agent, sketch_k, hist_bins, pipeline, guard,
                 force_device_path=False):
        self._agent = agent
        self._guard = guard
        self._end_of_backward_queued = False
        self._pipeline = pipeline
        self._host_dtypes = probe_host_dtypes(sketch_k, hist_bins)
        self._force_device = force_device_path
        self._ids = {}
        # (tensor, its version, thread) of the last host record of an output or output
        # gradient: what record_repeat would repeat. Holding the tensor keeps its memory
        # from being reused by another tensor while we compare addresses.
        self._last = None
        self.repeats = 0        # records that reused the statistics just computed
        self.step = 0
        self.micro = 0
        self.order = 0
        self.grad_sq = 0.0      # sum of squared l2 of host param grads in this step
        self.grad_count = 0
        self.records = 0        # tensors handed on (host or device)
        self.skipped = 0        # tensors not recorded: dtype/layout the kernel lacks
        self.failed = 0         # agent refused (queue full, closed) or the kernel failed

    def new_step(self, step):
        self._last = None
        self.step = step
        self.micro = 0
        self.order = 0
        self.grad_sq = 0.0
        self.grad_count = 0

    def new_micro(self):
        self._last = None
        self.micro += 1
        self.order = 0

    def _is_last(self, t):
        """Whether `t` is the same memory, same layout and unchanged since the last
        host record on this thread (views share their base's version counter)."""
        last, version, ident = self._last
        try:
            if ident != _get_ident() or t._version != version:
                return False
        except RuntimeError:
            return False
        return t is last or (t.data_ptr() == last.data_ptr() and t.dtype == last.dtype
                             and t.shape == last.shape and t.stride() == last.stride())

    def _register(self, name, kind, t, order):
        """The tensor's agent id, or -1 for a tensor without statistics (sparse or
        other non-strided layouts), remembered per (name, kind)."""
        if t.layout != torch.strided:
            tid = -1
        else:
            dtype = DTYPE_CODES.get(t.dtype, 0)
            tid = self._agent.register_tensor(name, kind, dtype, list(t.shape), order)
            if tid >= 0xFFFFFFFF:  # the agent refused (counted there); try again next time
                return None
        self._ids[(name, kind)] = tid
        return tid

    def record(self, name, kind, t):
        order = self.order
        self.order = order + 1
        tid = self._ids.get((name, kind))
        if tid is None:
            tid = self._register(name, kind, t, order)
            if tid is None:
                self.failed += 1
                return
        if tid < 0:
            self.skipped += 1
            return
        # t.is_cpu, not t.device.type: building a device object costs ~10x more.
        if t.is_cpu and not self._force_device:
            code = self._host_dtypes.get(t.dtype)
            if code is None:
                self.skipped += 1
                return
            repeatable = kind == _ACT or kind == _ACT_GRAD
            if repeatable and self._last is not None and self._is_last(t):
                l2 = self._agent.record_repeat(self.step, self.micro, tid, order)
                if l2 != -2.0:
                    self.records += 1
                    self.repeats += 1
                    return
            self._last = None
            src = t if t.is_contiguous() else t.contiguous()
            self.records += 1
            l2 = self._agent.record_host_tensor(self.step, self.micro, tid, order,
                                                src.data_ptr(), src.numel(), code)
            if l2 < 0.0:  # the kernel refused the tensor
                self.failed += 1
            elif repeatable:
                try:
                    self._last = (t, t._version, _get_ident())
                except RuntimeError:  # inference tensors have no version counter
                    pass
            elif kind == _PARAM_GRAD:
                self.grad_sq += l2 * l2  # NaN l2 (no finite value) makes the norm NaN
                self.grad_count += 1
        else:
            if not t.dtype.is_floating_point:
                self.skipped += 1
                return
            self.records += 1
            # Every tensor is batched (one set of statistics kernels for up to 256 tensors:
            # a kernel launch costs ~10-20 us of host time, per-tensor statistics ~50 of
            # them). A module output is copied first (one kernel): an in-place op after
            # the hook (an inplace activation) must not change what is recorded. Gradients
            # are held as they are: autograd never changes in place a gradient someone
            # else references (AccumulateGrad copies a held parameter gradient into .grad
            # instead of adopting it: one copy, in C++).
            if kind == _ACT:
                t = t.detach().clone()
            self._pipeline.add(t, tid, order, self.micro, kind == _PARAM_GRAD, defer=True)
            if kind in _BACKWARD_KINDS and not self._end_of_backward_queued:
                self._queue_end_of_backward()

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
            self._pipeline.flush_deferred()
        except Exception as e:  # pylint: disable=broad-except
            self._guard.fail("the end-of-backward flush", e)
