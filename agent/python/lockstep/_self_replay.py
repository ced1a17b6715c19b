"""A capture replayed by the run that made it (docs/design.md "The control channel",
docs/python.md "Capture and replay").

When the collector asked for a capture, the capture's writer thread, once it has saved
the file, re-runs the op on the CPU in float64 with this run's own settings and inputs
(lockstep._replay_op, the code `python -m lockstep replay` runs) and answers the request
a second time (wire SelfReplay) with what one run alone can know: its output's error
against that float64 result (max relative error, ULPs of its dtype), a digest of the
settings replay compares and of its inputs and output, and the file. The collector
compares the two runs' answers to one verdict (rule `replay`, docs/rules.md).

measure() runs on the writer thread only and raises on any failure; the caller counts
it and answers with the reason instead.
"""
from __future__ import annotations

import hashlib
import json

import torch

from lockstep import _capture_file as cf
from lockstep._replay import _show, error
from lockstep._replay_op import Op, load, unit


def measure(path):
    """What replaying the capture at `path` against float64 of its own settings finds:
    a dict of SelfReplay's fields (schema/lockstep.fbs)."""
    meta, tensors = load(path)
    op = Op(meta, tensors)
    outs = op.outputs()
    ref = op.run(op)
    dtype = max((t.dtype for t in outs if t.is_floating_point()), key=unit, default=torch.float32)
    rel, ulps = error(outs, ref, dtype)
    settings = op.settings()
    return {"file": path, "row": meta.get("row") or "", "dtype": cf.dtype_name(dtype),
            "coarsest": cf.dtype_name(op.coarsest()), "max_rel_error": float(rel),
            "ulps": float(ulps), "width": max(1, min(int(op.width()), 2 ** 32 - 1)),
            "settings_digest": _digest_json(settings), "settings": flatten(settings),
            "precision": flatten(op.precision()), "inputs_digest": _digest(op.inputs()),
            "output_digest": _digest({"out%d" % i: t for i, t in enumerate(outs)})}


def failed(path, row, exc):
    """The answer when the replay could not run: the reason, in one line."""
    why = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    return {"file": path, "row": row or "", "error": "%s: %s" % (type(exc).__name__, why)}


def flatten(settings, prefix=""):
    """[(key, value)] of nested settings, named as `python -m lockstep replay` names a
    setting that differs (lockstep._replay._diff: "kwargs.approximate", "'tanh'"; a
    "$" key adds nothing to the path)."""
    out = []
    for k in sorted(settings, key=str):
        v = settings[k]
        if isinstance(v, dict) and v:
            out += flatten(v, prefix if str(k).startswith("$") else prefix + str(k) + ".")
        else:
            out.append((prefix + str(k), _show(v)))
    return out


def _digest_json(value):
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _digest(tensors):
    """One digest of named tensors' dtypes, shapes and bytes: equal = bit-identical."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().reshape(-1)
        h.update(("%s %s %s;" % (name, cf.dtype_name(t.dtype), list(tensors[name].shape))).encode())
        try:
            h.update(t.view(torch.uint8).numpy())
        except (RuntimeError, TypeError):  # a dtype numpy or view() cannot take
            h.update(t.double().numpy())
    return h.hexdigest()
