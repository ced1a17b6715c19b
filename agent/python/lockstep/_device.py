"""The device path: statistics of non-CPU tensors without a host sync per tensor.

Tensors are batched: a module output is copied (one kernel, so that a later in-place
update, e.g. an ``inplace=True`` activation, cannot change what is recorded), gradients
and the step's loss/parameters/optimizer state are held as they are, and up to 256 of
them (256 MB) go through one ``_torch_stats.device_stats`` call (asynchronous kernels,
no ``.item()``): at the end of the backward pass (``queue_callback``), at the size
bound, or at the end of the step. A kernel launch costs ~10-20 us of host time and the
statistics of one tensor ~50 of them, so per-tensor calls would dominate the step of a
GPU model. Holding gradients is safe: the autograd engine never accumulates in place
into a gradient someone else references (AccumulateGrad copies a held parameter
gradient into ``.grad`` instead of adopting it: one copy, in C++). At the end of a step
the rows and any device scalars (loss, loss scale, grad norm) are concatenated and
copied to host ONCE, ``non_blocking`` into a pinned buffer, followed by an event. The
step is handed to the C++ agent when that event has completed — normally at the end of
the next step, never by blocking the training thread — and at ``drain()`` (close)
within a deadline.

A tensor recorded again under another name (``add_repeat``: the recorder found it is
the same memory, layout and version as the tensor just added) adds no statistics work:
its row is an alias of that tensor's row, copied from it on the host when the step ships.

Called from the Monitor on the training thread and from autograd hooks (under the
GIL); not for use from several Python threads at once.
"""
import collections
import math
import time

import numpy as np
import torch

from lockstep import _core

_L2_COLUMN = list(_core.PACKED_FIXED_FIELDS).index("l2")

_MAX_PENDING = 4  # steps waiting for their copy; beyond it the oldest is waited for
# Deferred tensors are batched up to this many tensors / bytes: fewer kernel launches,
# bounded extra memory (the held gradients and output copies).
_DEFER_MAX_TENSORS = 256
_DEFER_MAX_BYTES = 256 << 20


class _Item:
    """A tensor handed to the pipeline and its records: its own first, then those of
    add_repeat; ``row`` is its computed row once its batch has run."""
    __slots__ = ("tensor", "metas", "row")

    def __init__(self, tensor, meta):
        self.tensor = tensor
        self.metas = [meta]
        self.row = None


class _Step:
    __slots__ = ("step", "event", "host", "n_rows", "width", "micros", "ids", "orders",
                 "grad_rows", "scalars", "device_scalar_names", "buf_key", "row_src",
                 "flags")


def _on_device(value):
    return isinstance(value, torch.Tensor) and value.device.type != "cpu"


def _backend(device):
    """torch.cuda / torch.npu ... for a device type, or None for cpu."""
    if device.type == "cpu":
        return None
    return getattr(torch, device.type, None)


class DevicePipeline:
    """Collects device stats rows of the current step; ships finished steps in order
    through ``ship(step, rows, micros, ids, orders, grad_sq, scalars, flags)``
    (flags: None, or per row _core.STAT_REPEAT where the row repeats an earlier one)."""

    def __init__(self, sketch_k, hist_bins, ship):
        self._k = sketch_k
        self._bins = hist_bins
        self._width = _core.PACKED_FIXED_COLUMNS + sketch_k + hist_bins
        self._device_stats = None  # lockstep._torch_stats.device_stats, imported on first use
        self._ship = ship
        self._rows = []
        self._micros = []
        self._ids = []
        self._orders = []
        self._grad_rows = []  # indices of param_grad rows (for the global grad norm)
        self._n_rows = 0      # rows computed this step
        self._row_src = []    # per record: the computed row it ships (repeats share one)
        self._flags = []      # per record: _core.STAT_REPEAT for a repeat, else 0
        self._repeats = 0
        self._last = None     # the _Item added last this step: what add_repeat repeats
        self._deferred = []   # _Items awaiting a batch
        self._deferred_bytes = 0
        self._pending = collections.deque()
        self._free = {}  # (device, numel) -> pinned host buffers to reuse
        self.dropped_steps = 0
        self.capture_skipped = 0  # tensors not recorded because a CUDA graph was capturing

    def _stats(self, tensors):
        if self._device_stats is None:
            # the fused Triton kernel where available and self-checked, else the torch path
            from lockstep import _triton_stats  # pylint: disable=import-outside-toplevel
            self._device_stats = _triton_stats.device_stats
        if tensors and tensors[0].is_cuda and torch.cuda.is_current_stream_capturing():
            # Inside CUDA graph capture: no statistics (kernels and the table upload would
            # be captured, or break the capture); the tensors are counted, not recorded.
            self.capture_skipped += len(tensors)
            return None
        with torch.no_grad():
            return self._device_stats(tensors, self._k, self._bins)

    def add(self, tensor, tensor_id, order, micro, is_param_grad, defer=False):
        """Launches the tensor's statistics now, or with defer=True batches it with the
        other deferred tensors until flush_deferred(): at the end of the backward pass,
        at the size bound, or at end_step. The caller passes a tensor nobody changes in
        place until then (a copy of a module output)."""
        item = _Item(tensor, (tensor_id, order, micro, is_param_grad))
        self._last = item
        if defer:
            self._deferred.append(item)
            self._deferred_bytes += tensor.numel() * tensor.element_size()
            if (len(self._deferred) >= _DEFER_MAX_TENSORS
                    or self._deferred_bytes >= _DEFER_MAX_BYTES):
                self.flush_deferred()
            return
        self._run([item])

    def add_repeat(self, tensor_id, order, micro):
        """Records the tensor added last (this step) again, under another id: its row is
        shipped twice, computed once. False when there is none to repeat (nothing added
        this step, or its batch failed)."""
        item = self._last
        if item is None:
            return False
        meta = (tensor_id, order, micro, False)
        if item.row is None:  # still deferred: recorded with it when its batch runs
            item.metas.append(meta)
        else:
            self._record(item.row, meta, repeat=True)
        self._repeats += 1
        return True

    def _record(self, row, meta, repeat=False):
        tensor_id, order, micro, is_param_grad = meta
        # Said on the wire: the collector reports a repeat once, under its producer.
        self._flags.append(_core.STAT_REPEAT if repeat else 0)
        if is_param_grad:
            self._grad_rows.append(len(self._ids))
        self._row_src.append(row)
        self._micros.append(micro)
        self._ids.append(tensor_id)
        self._orders.append(order)

    def _run(self, items):
        """Computes the rows of `items` (one device_stats call) and records them. If
        that raises, their records are dropped (nothing shipped for them) and the
        exception goes to the caller."""
        try:
            rows = self._stats([it.tensor for it in items])
        except Exception:
            if self._last in items:
                self._last = None
            raise
        if rows is None:  # statistics skipped for this batch: nothing to record
            if self._last in items:
                self._last = None
            return
        for i, item in enumerate(items):
            item.row = self._n_rows + i
            item.tensor = None
            for j, meta in enumerate(item.metas):  # the tensor's own record, then repeats
                self._record(item.row, meta, repeat=j > 0)
        self._n_rows += len(items)
        self._rows.append(rows)

    def flush_deferred(self):
        if not self._deferred:
            return
        items, self._deferred, self._deferred_bytes = self._deferred, [], 0
        self._run(items)

    def has_rows(self):
        return bool(self._rows) or bool(self._deferred)

    def busy(self):
        return bool(self._pending)

    def end_step(self, step, scalars):
        """Queues step ``step``. ``scalars`` maps loss/lr/grad_norm/loss_scale/... to
        floats or 0-d tensors; device tensors travel in the same copy as the rows."""
        self.flush_deferred()
        p = _Step()
        p.step = step
        p.n_rows = self._n_rows
        p.row_src = np.asarray(self._row_src, dtype=np.int64) if self._repeats else None
        p.flags = np.asarray(self._flags, dtype=np.uint8) if self._repeats else None
        self._last = None
        p.width = self._width
        p.micros = np.asarray(self._micros, dtype=np.uint32)
        p.ids = np.asarray(self._ids, dtype=np.uint32)
        p.orders = np.asarray(self._orders, dtype=np.uint32)
        p.grad_rows = self._grad_rows
        p.scalars = dict(scalars)
        p.device_scalar_names = [k for k, v in scalars.items() if _on_device(v)]
        p.event = None
        p.host = None
        p.buf_key = None
        parts = []
        if self._rows:
            parts.append(torch.cat(self._rows).reshape(-1))
        with torch.no_grad():
            for name in p.device_scalar_names:
                parts.append(p.scalars[name].detach().reshape(-1)[:1].to(torch.float64))
        if parts:
            flat = torch.cat([t.to(parts[0].device) for t in parts]) if len(parts) > 1 \
                else parts[0]
            backend = _backend(flat.device)
            if backend is None:
                p.host = flat
            else:
                p.buf_key = (str(flat.device), flat.numel())
                p.host = self._host_buffer(p.buf_key)
                p.host.copy_(flat, non_blocking=True)
                p.event = backend.Event()
                p.event.record()
        self._rows, self._micros, self._ids, self._orders, self._grad_rows = [], [], [], [], []
        self._n_rows = 0
        self._row_src = []
        self._flags = []
        self._repeats = 0
        self._pending.append(p)
        while len(self._pending) > _MAX_PENDING:
            self._finish(self._pending.popleft(), wait=True)
        self.poll()

    def _host_buffer(self, key):
        free = self._free.get(key)
        if free:
            return free.pop()
        try:
            return torch.empty(key[1], dtype=torch.float64, pin_memory=True)
        except RuntimeError:  # no pinned memory on this build: still asynchronous enough
            return torch.empty(key[1], dtype=torch.float64)

    def poll(self):
        """Ships every leading step whose copy has completed; never blocks."""
        while self._pending:
            p = self._pending[0]
            if p.event is not None and not p.event.query():
                return
            self._pending.popleft()
            self._finish(p, wait=False)

    def drain(self, deadline):
        """Ships everything, waiting for copies until ``deadline`` (time.monotonic());
        steps whose copy has not completed by then are dropped and counted."""
        while self._pending:
            p = self._pending[0]
            while p.event is not None and not p.event.query():
                if time.monotonic() >= deadline:
                    self.dropped_steps += len(self._pending)
                    self._pending.clear()
                    return False
                time.sleep(0.0005)
            self._pending.popleft()
            self._finish(p, wait=False)
        return True

    def _finish(self, p, wait):
        if wait and p.event is not None:
            p.event.synchronize()
        values = p.host.numpy() if p.host is not None else np.zeros(0)
        n = p.n_rows * p.width
        rows = values[:n].reshape(p.n_rows, p.width)
        for i, name in enumerate(p.device_scalar_names):
            p.scalars[name] = float(values[n + i])
        if p.buf_key is not None:  # the buffer is reused once read; few sizes recur
            rows = rows.copy()
            if p.buf_key not in self._free and len(self._free) >= 8:
                self._free.clear()
            free = self._free.setdefault(p.buf_key, [])
            if len(free) < _MAX_PENDING + 1:
                free.append(p.host)
        if p.row_src is not None:  # repeated records: copies of the row they repeat
            rows = rows[p.row_src]
        grad_sq = None
        if p.grad_rows:
            l2 = rows[p.grad_rows, _L2_COLUMN]
            grad_sq = float(np.sum(l2 * l2)) if np.all(np.isfinite(l2)) else math.nan
        self._ship(p.step, rows, p.micros, p.ids, p.orders, grad_sq, p.scalars, p.flags)
