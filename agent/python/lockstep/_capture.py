"""Capture (Monitor.capture): one op's inputs, output, parameters, buffers and settings
saved at one step, so that `python -m lockstep replay` can re-run it against float64
(lockstep._replay; docs/python.md "Capture and replay").

A capture names a row as the collector names a birth point: a module (``blocks.1.mlp.act``,
``blocks.1.mlp.act#1`` for its second call in the step) or a call in a zoomed module's own
code (``blocks.1.attn/softmax#0``: the capture zooms the module for that step when no zoom
covers it, and is told of each call by lockstep._zoom.Zoom.record). At the step it fires,
during the forward of micro step 0, the training thread takes detached CPU copies of what
it keeps (a device tensor's copy waits for the device: the captured step only) and hands
them to one writer thread, which torch.saves them and a JSON sidecar. Nothing is written
in any other step, and a capture never set up costs nothing.

File: ``<capture_dir>/<experiment>/step<step>-<row>/<run>.rank<rank>.pt`` and its JSON
sidecar, what they hold and how the bound cuts: lockstep._capture_file. At most
``capture_limit`` captures per run. A failed save is one warning; nothing raises into the
job.

A capture the collector asked for (answer_after()) is then replayed by the writer thread
against float64 of this run's own settings (lockstep._self_replay), and the request is
answered a second time with the result; a replay that fails is counted
(self_replays_failed), warned once, and answered with why.

Threads: request(), answer_after() and close() on the training thread; the hooks on the
training thread (autograd's for nothing: forward only); the writer thread only saves what
it is handed, and replays what the collector asked for.
"""
from __future__ import annotations

import os
import queue
import threading
import time

import torch

from lockstep import _capture_file as cf
from lockstep._names import call_name, module_name, output_tensors
from lockstep._watch import _in_backward, _portable

def _rng(tensors, devices):
    """The RNG states now: the CPU generator's, and each CUDA device's the op uses."""
    out = {"cpu": tensors.add("rng.cpu", torch.get_rng_state())}
    for dev in sorted(devices):
        if dev.startswith("cuda"):
            try:
                idx = torch.device(dev).index or 0
                out[dev] = tensors.add("rng." + dev, torch.cuda.get_rng_state(idx))
            except Exception:  # pylint: disable=broad-except
                pass
    return out


def _inplace(fname, kwargs):
    """Whether a call writes into its inputs: add_, x += y (Tensor.__iadd__), out=."""
    dunder = fname.startswith("__") and fname.endswith("__")
    return (fname.endswith("_") and not dunder) or (dunder and fname.startswith("__i")
                                                    and fname not in ("__index__", "__int__",
                                                                      "__invert__")) \
        or "out" in (kwargs or {})


def _copy(t, rows):
    """A detached CPU copy of `t` (its first `rows` rows when rows is not None)."""
    t = t.detach()
    if rows is not None:
        t = t[:rows]
    return t.to("cpu", copy=True).contiguous()


class _Request:
    """One capture set up and not yet taken."""

    __slots__ = ("row", "module", "call", "op", "step", "root", "target", "handles", "pre",
                 "taken", "acks")

    def __init__(self, row, module, call, op, step, root, target):
        self.row, self.module, self.call, self.op = row, module, call, op
        self.step, self.root, self.target = step, root, target
        self.handles = []
        self.pre = None   # what the pre-hook took: (meta parts, tensors)
        self.taken = False
        self.acks = []    # (request id, step, detail, send): answer with the self-replay


class Captures:
    """The captures of one Monitor: set up by request(), taken by hooks, written by one
    writer thread started at the first capture taken. Counters: written, refused,
    failed (a save that raised), pending, self_replays (sent), self_replays_failed."""

    def __init__(self, session, cfg, guard):
        self._session_ref = session.ref
        self.rec = session.rec
        self.guard = guard
        self.enabled = bool(cfg["capture"])
        self.directory = os.path.abspath(cfg["capture_dir"])
        self.max_bytes = int(cfg["capture_mb"] * 1024 * 1024)
        self.limit = cfg["capture_limit"]
        self.ident = {k: cfg[k] for k in ("experiment", "run", "role", "world_size",
                                          "platform", "device_name")}
        self.ident_of = session.ident  # its rank may be learnt after watch() (_identity.py)
        self.requests = []   # _Request not yet taken
        self.accepted = 0    # requests counted against the limit
        self.written = 0
        self.refused = 0
        self.failed = 0
        self.paths = []      # files written, in order
        self.self_replays = 0
        self.self_replays_failed = 0
        self._warned_write = False
        self._warned_replay = False
        self._queue = None
        self._thread = None

    # ---- the training thread -----------------------------------------------------------

    def request(self, name, step, first, find_module, zoom_for):
        """Sets up a capture of row `name` at `step` (None: `first`, the next step not yet
        recording). find_module(path) -> (root, module) or None; zoom_for(root, module,
        path, step) -> the Zoom recording that module at that step. Returns True; a
        request that cannot be taken raises ValueError with the sentence to warn."""
        if not self.enabled:
            raise ValueError("capture(%r) refused: capture is off (capture=False or "
                             "LOCKSTEP_CAPTURE=0)" % (name,))
        path, call, op = cf.parse_row(name)
        if step is None:
            step = first
        elif isinstance(step, bool) or not isinstance(step, int):
            raise ValueError("capture(step=%r) is not valid: give a step number" % (step,))
        if step < first:
            raise ValueError("capture(%r, step=%d) refused: step %d has already begun "
                             "recording (give step >= %d)" % (name, step, step, first))
        row = op if op is not None else call_name(path, call)
        for r in self.requests:
            if r.row == row and r.step == step:
                return True  # the same request again (idempotent)
        if self.accepted >= self.limit:
            raise ValueError("capture(%r) refused: this run has used its %d captures "
                             "(capture_limit)" % (name, self.limit))
        found = find_module(path)
        if found is None:
            raise ValueError("capture(%r): no module of a watched model has that name (the "
                             "names of the rows: 'blocks.1.attn', '<root>')" % name)
        root, module = found
        req = _Request(row, path, call, op, step, root, module)
        if op is not None:
            zoom = zoom_for(root, module, path, step)
            tap = getattr(zoom, "capture", None)
            if not isinstance(tap, _CallTap):
                tap = _CallTap(self)
                zoom.capture = tap
            tap.requests.append(req)
            req.handles.append(tap)
        else:
            self._hook_module(req)
        self.requests.append(req)
        self.accepted += 1
        return True

    def _hook_module(self, req):
        ref, rec = self._session_ref, self.rec
        caps = self

        def pre_hook(module, args, kwargs=None):
            sess = ref()
            if sess is None or req.taken or rec.step != req.step or rec.micro != 0 \
                    or not req.root.training or not torch.is_grad_enabled() \
                    or _in_backward(sess):
                return None
            if sess.calls.get(req.module, 0) != req.call:
                return None
            try:
                req.pre = caps._take_inputs(req, module, args, kwargs or {})
            except Exception as e:  # pylint: disable=broad-except  (never into the job)
                caps._fail(req, e)
            return None

        def hook(module, _args, output):
            if req.pre is None or req.taken:
                return None
            try:
                caps._finish(req, output, module=module)
            except Exception as e:  # pylint: disable=broad-except
                caps._fail(req, e)
            return None

        m = req.target
        try:  # torch >= 2.0: keyword arguments too
            req.handles.append(m.register_forward_pre_hook(_portable(pre_hook),
                                                           with_kwargs=True))
        except TypeError:
            req.handles.append(m.register_forward_pre_hook(
                _portable(lambda mod, a: pre_hook(mod, a))))
        req.handles.append(m.register_forward_hook(_portable(hook)))

    def answer_after(self, row, step, request_id, detail, send):
        """The collector asked for the capture of `row` at `step` (request `request_id`,
        answered `detail`): once written, the writer thread replays it and calls
        send(request_id, step, detail, result) (Agent.acknowledge_replay). False when no
        such capture waits."""
        for r in self.requests:
            if r.row == row and r.step == step:
                r.acks.append((request_id, step, detail, send))
                return True
        return False

    def _take_inputs(self, req, module, args, kwargs):
        """(meta, tensors) of the op's arguments before it runs (module captures)."""
        tensors = cf.Tensors()
        meta = {
            "kind": "module",
            "module_type": "%s.%s" % (type(module).__module__, type(module).__qualname__),
            "has_children": any(True for _ in module.children()),
            "settings": cf.module_settings(module),
            "args": cf.encode(tuple(args), tensors, "in"),
            "kwargs": cf.encode(dict(kwargs), tensors, "kw"),
            "params": {n: (tensors.add("param." + n, p) if p is not None else None)
                       for n, p in module.named_parameters()},
            "buffers": {n: (tensors.add("buffer." + n, b) if b is not None else None)
                        for n, b in module.named_buffers()},
        }
        devices = {str(t.device) for t in tensors.items.values()}
        meta["rng"] = _rng(tensors, devices)
        meta["autocast"] = cf.autocast_state()
        return meta, tensors

    def _finish(self, req, output, module=None):
        meta, tensors = req.pre
        items = []
        output_tensors(output, "", items)
        meta["outputs"] = [{"name": n, "tensor": tensors.add("out%s" % (n or ""), t)}
                           for n, t in items]
        self._hand_over(req, meta, tensors)

    def call_taken(self, req, func, args, kwargs, out, rng):
        """A zoomed call matched `req` (lockstep._zoom.Zoom.record): its arguments as the
        call saw them after it ran (an in-place call's inputs are its results: marked)."""
        tensors = cf.Tensors()
        fname = getattr(func, "__name__", "") or ""
        meta = {
            "kind": "call",
            "func": cf.qualified_func(func),
            "module_type": "%s.%s" % (type(req.target).__module__, type(req.target).__qualname__),
            "args": cf.encode(tuple(args), tensors, "in"),
            "kwargs": cf.encode(dict(kwargs or {}), tensors, "kw"),
            "inplace": _inplace(fname, kwargs),
        }
        if rng is not None:  # the CPU generator before the call (_CallTap.before)
            meta["rng"] = {"cpu": tensors.add("rng.cpu", rng)}
        meta["autocast"] = cf.autocast_state()
        req.pre = (meta, tensors)
        self._finish(req, out)

    def _hand_over(self, req, meta, tensors):
        """Copies what the capture keeps (within the bound) and queues it for the writer."""
        req.taken = True
        self._drop(req)
        # The RNG states (~5 KB each) are kept whole, outside the bound.
        plan = cf.plan_slices({k: t for k, t in tensors.items.items()
                            if not k.startswith("rng.")}, self.max_bytes)
        table, copies, cut = {}, {}, []
        for key, t in tensors.items.items():
            rows = plan.get(key)
            entry = {"dtype": cf.dtype_name(t.dtype), "shape": list(t.shape),
                     "device": str(t.device), "requires_grad": bool(t.requires_grad)}
            if rows is not None:
                entry["saved_rows"] = rows
                cut.append(key)
            if rows != 0:
                copies[key] = _copy(t, rows)
            table[key] = entry
        meta.update(self._header(req))
        meta["tensors"] = table
        meta["bound"] = {"max_bytes": self.max_bytes, "cut": cut,
                         "bytes": sum(c.numel() * c.element_size() for k, c in copies.items()
                                      if not k.startswith("rng."))}
        meta["math"] = cf.math_flags()
        meta["torch"] = torch.__version__
        path = cf.capture_path(self.directory, self.ident["experiment"], self.ident["run"],
                            meta["rank"], req.step, req.row)
        meta["file"] = os.path.basename(path)
        self._start_writer()
        self._queue.put((path, req.row, req.step, meta, copies, list(req.acks)))

    def _header(self, req):
        out = {"format": cf.FORMAT, "version": cf.VERSION, "row": req.row, "module": req.module,
               "call": req.call, "step": req.step, "rank": int(self.ident_of.rank),
               "time": time.time()}
        out.update(self.ident)
        return out

    def _drop(self, req):
        for h in req.handles:
            if isinstance(h, _CallTap):
                if req in h.requests:
                    h.requests.remove(req)
            else:
                h.remove()
        req.handles = []
        if req in self.requests:
            self.requests.remove(req)

    def _fail(self, req, exc):
        req.taken = True
        self._drop(req)
        self._warn_write(req.row, req.step, exc)

    def new_step(self, step):
        """Requests whose step has passed without the op running are dropped (refused)."""
        for req in [r for r in self.requests if r.step < step]:
            self._drop(req)
            self.refused += 1

    def close(self, deadline):
        """Drops what was not taken, lets the writer finish by `deadline`; True if it did."""
        for req in list(self.requests):
            self._drop(req)
        if self._thread is None:
            return True
        self._queue.put(None)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def counters(self):
        return {"captures_written": self.written, "captures_refused": self.refused,
                "captures_failed": self.failed, "captures_pending": len(self.requests),
                "self_replays": self.self_replays, "self_replays_failed": self.self_replays_failed,
                "capture_files": list(self.paths)}

    # ---- the writer thread --------------------------------------------------------------

    def _start_writer(self):
        if self._thread is None:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._run, name="ls-capture", daemon=True)
            self._thread.start()

    def _run(self):
        while True:
            job = self._queue.get()
            if job is None:
                return
            path, row, step, meta, copies, acks = job
            try:
                cf.write(path, meta, copies)
                self.written += 1
                self.paths.append(path)
            except Exception as e:  # pylint: disable=broad-except  (never into the job)
                self._warn_write(row, step, e)
                if acks:
                    from lockstep import _self_replay  # pylint: disable=import-outside-toplevel
                    self._answer(acks, _self_replay.failed(path, row, ValueError(
                        "the capture could not be written (%s)" % type(e).__name__)))
                continue
            del copies  # the replay reads the file back, as `lockstep replay` would
            if acks:
                self._answer(acks, self._replay(path, row, step))

    def _replay(self, path, row, step):
        """The capture at `path` replayed against float64 of its own settings (a failure
        is counted, warned once and answered with why)."""
        # Imported here: a job the collector never asks pays nothing for the replay code.
        from lockstep import _self_replay  # pylint: disable=import-outside-toplevel
        try:
            out = _self_replay.measure(path)
            self.self_replays += 1
            return out
        except Exception as e:  # pylint: disable=broad-except  (never into the job)
            self.self_replays_failed += 1
            if not self._warned_replay:
                self._warned_replay = True
                self.guard.warn("the capture of %s at step %d could not be replayed here (%s: %s); "
                                "training continues, and `python -m lockstep replay` with both runs' "
                                "files still can (Monitor.counters()['self_replays_failed'])"
                                % (row, step, type(e).__name__, str(e)[:200]))
            return _self_replay.failed(path, row, e)

    def _answer(self, acks, result):
        for request_id, step, detail, send in acks:
            try:
                send(request_id, step, detail, result)
            except Exception:  # pylint: disable=broad-except  (an agent closed meanwhile)
                self.self_replays_failed += 1

    def _warn_write(self, row, step, exc):
        self.failed += 1
        if self._warned_write:
            return
        self._warned_write = True
        self.guard.warn("the capture of %s at step %d could not be written (%s: %s); training "
                        "continues (Monitor.counters()['captures_failed'] counts failures)"
                        % (row, step, type(exc).__name__, exc))


class _CallTap:
    """What a Zoom calls for each recorded call while a capture waits on its module."""

    def __init__(self, captures):
        self.captures = captures
        self.requests = []

    def before(self):
        """The CPU RNG state before a call, when a capture waits for this step."""
        try:
            step = self.captures.rec.step
            if any(r.step == step for r in self.requests):
                return torch.get_rng_state()
        except Exception:  # pylint: disable=broad-except  (never into the job)
            pass
        return None

    def __call__(self, op, func, args, kwargs, out, rng):
        rec = self.captures.rec
        if rec.micro != 0:
            return
        for req in self.requests:
            if req.op == op and req.step == rec.step and not req.taken:
                try:
                    self.captures.call_taken(req, func, args, kwargs, out, rng)
                except Exception as e:  # pylint: disable=broad-except  (never into the job)
                    self.captures._fail(req, e)
                return


def find_module(watches, path):
    """(root model, module) of the watched module named `path` in the rows, or None."""
    for w in watches:
        for p, m in w.model.named_modules():
            if module_name(p) == path:
                return w.model, m
    return None
