"""Recorder: turns (name, kind, tensor) into agent records at the current
(step, micro step, execution order). The order counts the step's records in the
order they are made, across its micro steps (micro step 1's first record comes after
micro step 0's last), so "first in execution order" within a step is well defined.

CPU tensors go through the C++ one-pass kernel over the tensor's own memory
(``Agent.record_host_tensor``, GIL released; a transposed or sliced view is read in
place, in flat order, by ``record_host_tensor_strided``). Other devices go through the DevicePipeline (one copy per step).
Called from hooks under the GIL; the counters are plain ints for that reason.

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
import collections
import threading
import time

import torch

from lockstep import _core
from lockstep._names import module_type_of

KIND = dict(_core.KINDS)
_ACT, _ACT_GRAD, _PARAM_GRAD = KIND["act"], KIND["act_grad"], KIND["param_grad"]
_ACT_IN = KIND["act_in"]
# The host statistics calls answer the l2 norm (a float) when they recorded, else a
# _core.HostOutcome naming why not (host_recorder.h).
_BAD_LAYOUT = _core.HostOutcome.BAD_LAYOUT
_REFUSED = _core.HostOutcome.REFUSED
_BACKWARD_KINDS = (_ACT_GRAD, _PARAM_GRAD)
# Kinds whose tensor may be the one recorded just before (record_repeat).
_REPEATABLE = frozenset((_ACT, _ACT_GRAD, _ACT_IN))
_get_ident = threading.get_ident
_perf_counter = time.perf_counter
# Bytes of tensors held for the host statistics thread; above it, records run inline
# (bounds the memory the thread can keep alive when it falls behind).
_MAX_PENDING_BYTES = 256 << 20
_BYTES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2, torch.float64: 8}


class _Pending:
    """A tensor whose statistics the host thread is computing."""
    __slots__ = ("ticket", "tensor", "version", "tid", "ident", "nbytes", "repeats", "pgrad")

    def __init__(self, ticket, tensor, version, tid, ident, nbytes, pgrad=False):
        self.ticket = ticket
        self.tensor = tensor    # held until settled: the thread reads its memory
        self.version = version  # its version counter when submitted
        self.tid = tid
        self.ident = ident
        self.nbytes = nbytes
        self.repeats = []       # (step, micro, id, order) recorded with the same result
        self.pgrad = pgrad      # a parameter gradient: its l2 joins the step's grad norm


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
        self.module_types = {}  # module name -> type name (Watch fills it; _names.py)
        # (tensor, its version, thread) of the last host record of an output or output
        # gradient: what record_repeat would repeat. Holding the tensor keeps its memory
        # from being reused by another tensor while we compare addresses.
        self._last = None
        # The same for the device path: (tensor, its version, thread) of the last tensor
        # handed to the DevicePipeline, when it is an output or output gradient.
        self._last_dev = None
        self.repeats = 0        # records that reused the statistics just computed
        self.step = 0
        self.micro = 0
        self.order = 0
        self.grad_sq = 0.0      # sum of squared l2 of host param grads in this step
        self.grad_count = 0
        self.records = 0        # tensors handed on (host or device)
        self.skipped = 0        # tensors not recorded: dtype/layout the kernel lacks
        self.failed = 0         # agent refused (queue full, closed) or the kernel failed
        # Host statistics thread (see the module doc).
        self.has_worker = bool(getattr(agent, "has_host_worker", False))
        self._threaded = self.has_worker  # this step's mode (Monitor's tuner may switch it)
        self.t_first = None  # perf_counter() at this step's first record (for the tuner)
        # Tickets must be settled in the order handed out; hooks on two threads (rare
        # on CPU) must not interleave a submit with its append, or two settles.
        self._host_lock = threading.Lock()
        self._pending = collections.deque()  # _Pending, in ticket order
        self._pending_bytes = 0
        self._last_pending = None  # the _Pending of self._last, while unsettled
        self._mode = {}    # tensor id -> True: may go to the thread; False: stays inline
        self._probes = []  # (tid, tensor, version): first records, watched for changes
        # Parameter gradients handed to the thread once accumulated (record_param_grad):
        # name -> (tid, order, micro) from the gradient hook, until the post-accumulate
        # hook hands over .grad; and name -> tid of a first record whose .grad is watched
        # as a probe.
        self._deferred = {}
        self._probe_grad = {}
        self.threaded = 0  # records whose statistics the thread computed
        self.changed_in_flight = 0  # results dropped: tensor changed before they were read

    def counters(self):
        """Monitor.counters()'s figures of the recorder."""
        return {"tensors_recorded": self.records, "tensors_repeated": self.repeats,
                "tensors_threaded": self.threaded,
                "tensors_changed_in_flight": self.changed_in_flight,
                "host_stats_thread": self._threaded, "tensors_skipped": self.skipped,
                "tensors_failed": self.failed}

    def new_step(self, step):
        self.settle(wait=True)
        self._drop_deferred()
        self.t_first = None
        self._last = None
        self._last_dev = None
        self.step = step
        self.micro = 0
        self.order = 0
        self.grad_sq = 0.0
        self.grad_count = 0

    def new_micro(self):
        self._drop_deferred()
        self._last = None
        self._last_dev = None
        self._last_pending = None
        self.micro += 1
        # order goes on counting: execution order within the step spans its micro steps

    def _is_last(self, t, last_record=None):
        """Whether `t` is the same memory, same layout and unchanged since the last
        host record (or `last_record`) on this thread (views share their base's
        version counter)."""
        last, version, ident = self._last if last_record is None else last_record
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
            tid = self._agent.register_tensor(name, kind, dtype, list(t.shape), order,
                                              module_type_of(name, self.module_types))
            if tid >= 0xFFFFFFFF:  # the agent refused (counted there); try again next time
                return None
        self._ids[(name, kind)] = tid
        return tid

    def set_threaded(self, on):
        """Whether this step's outputs and output gradients go to the thread (between
        steps: everything is settled then)."""
        self._threaded = bool(on) and self.has_worker

    def record(self, name, kind, t):
        # The hot path of every hook (hundreds of calls a step): what _is_last and
        # _inline do is written out here for the common cases (a Python call is ~0.2 us,
        # a measurable part of a small tensor's record).
        order = self.order
        self.order = order + 1
        if self.t_first is None:
            self.t_first = _perf_counter()
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
            repeatable = kind in _REPEATABLE
            if self._pending or self._probes:
                self._settle_done()
            last = self._last
            if repeatable and last is not None:
                try:  # _is_last, written out
                    same = last[2] == _get_ident() and t._version == last[1] and (
                        t is last[0] or (t.data_ptr() == last[0].data_ptr()
                                         and t.dtype == last[0].dtype
                                         and t.shape == last[0].shape
                                         and t.stride() == last[0].stride()))
                except RuntimeError:  # inference tensors have no version counter
                    same = False
                if same:
                    pend = self._last_pending
                    if pend is not None:  # its statistics are still being computed
                        pend.repeats.append((self.step, self.micro, tid, order))
                        self.records += 1
                        self.repeats += 1
                        return
                    l2 = self._agent.record_repeat(self.step, self.micro, tid, order)
                    if l2.__class__ is float:  # else NOTHING_TO_REPEAT: computed below
                        self.records += 1
                        self.repeats += 1
                        return
            self._last = None
            self._last_pending = None
            contiguous = t.is_contiguous()
            self.records += 1
            if repeatable and self._threaded and self._submit(t, contiguous, tid, order, code):
                # The thread is woken for batches of tensors; the end of backward wakes
                # it for the rest, so they are done while the optimizer steps.
                if kind == _ACT_GRAD and not self._end_of_backward_queued:
                    self._queue_end_of_backward()
                return
            if contiguous:  # _inline, written out
                l2 = self._agent.record_host_tensor(self.step, self.micro, tid, order,
                                                    t.data_ptr(), t.numel(), code)
                if l2.__class__ is not float:  # REFUSED: the kernel refused the tensor
                    self.failed += 1
                    return
                if kind == _PARAM_GRAD:
                    self.grad_sq += l2 * l2
                    self.grad_count += 1
                    return
            else:
                l2 = self._inline(t, contiguous, tid, order, code, self.step, self.micro, kind)
                if l2 is None:
                    return
            if repeatable:
                try:
                    self._last = (t, t._version, _get_ident())
                except RuntimeError:  # inference tensors have no version counter
                    pass
                else:
                    if self._threaded and tid not in self._mode:
                        self._probes.append((tid, t, self._last[1]))
        else:
            if not t.dtype.is_floating_point:
                self.skipped += 1
                return
            repeatable = kind in _REPEATABLE
            if (repeatable and self._last_dev is not None and self._is_last(t, self._last_dev)
                    and self._pipeline.add_repeat(tid, order, self.micro)):
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

    # ---- the host statistics thread ------------------------------------------------

    def _submit(self, t, contiguous, tid, order, code):
        """Hands `t` to the thread, which reads its memory in place (strided views too);
        False to compute inline instead: a name not yet known to stay unchanged, a full
        thread, too many bytes held already, or a layout the kernel cannot read."""
        if not self._mode.get(tid, False):
            return False  # first record (probed inline) or changed in place before
        pend = self._hand_over(t, contiguous, tid, order, code, self.step, self.micro, False)
        if pend is None:
            return False
        self._last = (t, pend.version, pend.ident)
        self._last_pending = pend
        return True

    def _hand_over(self, t, contiguous, tid, order, code, step, micro, pgrad):
        """Submits `t` to the thread as record (step, micro, tid, order): its _Pending, or
        None (no version counter, too many bytes held, a full thread, a layout the
        kernel cannot read)."""
        try:
            version = t._version
        except RuntimeError:  # no version counter: nothing to check a result against
            return None
        nbytes = t.numel() * _BYTES.get(t.dtype, 8)
        if self._pending_bytes + nbytes > _MAX_PENDING_BYTES:
            return None
        agent = self._agent
        with self._host_lock:
            if contiguous:
                ticket = agent.submit_host_tensor(step, micro, tid, order, t.data_ptr(),
                                                  t.numel(), code)
            else:
                ticket = agent.submit_host_tensor_strided(step, micro, tid, order,
                                                          t.data_ptr(), code, t.shape,
                                                          t.stride())
            if ticket.__class__ is not int:  # FULL or BAD_LAYOUT: compute inline
                return None
            pend = _Pending(ticket, t, version, tid, _get_ident(), nbytes, pgrad)
            self._pending.append(pend)
            self._pending_bytes += nbytes
            self.threaded += 1
        return pend

    # ---- parameter gradients -------------------------------------------------------
    #
    # A parameter gradient cannot be held by the gradient hook (autograd would then copy
    # it into .grad instead of adopting it). But when .grad was None before this
    # backward, the tensor autograd adopts as .grad *is* this backward's gradient: the
    # post-accumulate hook (torch >= 2.1) hands that to the thread, which computes its
    # statistics during the rest of the backward and the optimizer step. Its first
    # record is computed inline and .grad watched until the end of the step, as for
    # outputs (a gradient clipped, unscaled or zeroed in place after backward keeps its
    # name inline). A .grad that was not None (accumulation, zero_grad(set_to_none=
    # False)) would be the sum: computed inline in the hook, as before.

    def record_param_grad(self, name, t, fresh):
        """A parameter gradient from its hook; `fresh`: the parameter's .grad was None
        and its post-accumulate hook will call param_accumulated(name, .grad)."""
        if fresh and self._threaded and t.is_cpu and not self._force_device:
            tid = self._ids.get((name, _PARAM_GRAD))
            if tid is not None and tid >= 0 and self._mode.get(tid, False) \
                    and t.dtype in self._host_dtypes:
                order = self.order
                self.order = order + 1
                if self.t_first is None:
                    self.t_first = _perf_counter()
                self.records += 1
                self._deferred[name] = (tid, order, self.micro)
                return
            if tid is not None and tid >= 0 and tid not in self._mode:
                self._probe_grad[name] = tid
        self.record(name, _PARAM_GRAD, t)

    def param_accumulated(self, name, grad):
        """The post-accumulate hook: `grad` is the parameter's .grad now."""
        tid = self._probe_grad.pop(name, None)
        if tid is not None and grad is not None:
            try:
                self._probes.append((tid, grad, grad._version))
            except RuntimeError:
                pass
        d = self._deferred.pop(name, None)
        if d is None:
            return
        tid, order, micro = d
        code = self._host_dtypes.get(grad.dtype) if grad is not None else None
        if code is None or grad.layout != torch.strided:
            self.failed += 1  # .grad went away or changed type in between
            return
        contiguous = grad.is_contiguous()
        if self._pending or self._probes:
            self._settle_done()
        if self._hand_over(grad, contiguous, tid, order, code, self.step, micro, True) is None:
            self._inline(grad, contiguous, tid, order, code, self.step, micro, _PARAM_GRAD)
        elif not self._end_of_backward_queued:
            self._queue_end_of_backward()  # wakes the thread for what is left

    def _inline(self, t, contiguous, tid, order, code, step, micro, kind):
        """Computes the statistics of `t` on this thread: its l2 norm, or None when the
        kernel refused it (counted)."""
        agent = self._agent
        if contiguous:
            l2 = agent.record_host_tensor(step, micro, tid, order, t.data_ptr(), t.numel(),
                                          code)
        else:
            # A transposed or sliced view (attention's outputs): read in place, in flat
            # order, instead of copying it first.
            l2 = agent.record_host_tensor_strided(step, micro, tid, order, t.data_ptr(),
                                                  code, t.shape, t.stride())
            if l2 == _BAD_LAYOUT:  # a layout the kernel cannot read: a contiguous copy
                src = t.contiguous()
                l2 = agent.record_host_tensor(step, micro, tid, order, src.data_ptr(),
                                              src.numel(), code)
        if l2.__class__ is not float:  # REFUSED: the kernel refused the tensor
            self.failed += 1
            return None
        if kind == _PARAM_GRAD:
            self.grad_sq += l2 * l2  # NaN l2 (no finite value) makes the norm NaN
            self.grad_count += 1
        return l2

    def _drop_deferred(self):
        """Deferred gradients whose post-accumulate hook never came (a backward that
        failed half-way): counted as failed."""
        if self._deferred:
            self.failed += len(self._deferred)
            self._deferred.clear()
        self._probe_grad.clear()

    def _settle_done(self):
        """Called by every record while anything is pending: most calls find nothing
        new done, and return before the calls that would settle it."""
        if self._probes:
            self._check_probes(final=False)
        pending = self._pending
        if pending:
            with self._host_lock:
                done = self._agent.host_done()
                if pending and pending[0].ticket < done:
                    self._settle(done)

    def settle(self, wait):
        """Records the thread's finished results in order (all of them, waiting for
        the thread, when `wait`) and ends the probes (wait: the step is over)."""
        if not self._pending and not self._probes:
            return
        self._check_probes(final=wait)
        with self._host_lock:
            pending = self._pending
            if wait and pending:
                self._agent.host_wait(pending[-1].ticket)
            if pending:
                self._settle(self._agent.host_done())

    def _settle(self, done):
        pending = self._pending
        agent = self._agent
        while pending and pending[0].ticket < done:
            pend = pending.popleft()
            self._pending_bytes -= pend.nbytes
            try:
                keep = pend.tensor._version == pend.version
            except RuntimeError:
                keep = False
            is_last = pend is self._last_pending
            l2 = agent.host_settle(pend.ticket, keep, keep and (is_last or bool(pend.repeats)))
            pend.tensor = None
            if not keep:
                # Changed in place while in flight: what the thread read may not be what
                # the hook saw. Dropped, and the name stays inline from now on.
                self.changed_in_flight += 1 + len(pend.repeats)
                self._mode[pend.tid] = False
            elif l2.__class__ is not float:  # REFUSED: the kernel refused the tensor
                self.failed += 1 + len(pend.repeats)
            elif pend.pgrad:
                self.grad_sq += l2 * l2
                self.grad_count += 1
            else:
                for step, micro, tid, order in pend.repeats:
                    agent.record_repeat(step, micro, tid, order)
            if is_last:
                self._last_pending = None
                if not keep or pend.ident != _get_ident():
                    # record_repeat repeats this thread's last result; that is not it
                    self._last = None

    def _check_probes(self, final):
        """A name's first (inline) records: one changed in place since its hook keeps the
        name inline; at the end of the step the unchanged ones may use the thread."""
        if not self._probes:
            return
        keep = []
        mode = self._mode
        for probe in self._probes:
            tid, t, version = probe
            try:
                changed = t._version != version
            except RuntimeError:
                changed = True
            if changed:
                mode[tid] = False
            elif final:
                mode.setdefault(tid, True)
            else:
                keep.append(probe)
        self._probes = keep

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
