"""What a capture file holds and where it goes (lockstep._capture writes it,
lockstep._replay reads it; docs/python.md "Capture and replay").

A capture is ``{"lockstep_capture": <JSON header>, "tensors": {key: tensor}}``, saved with
torch.save: plain containers only, which torch.load(weights_only=True) reads on torch >=
1.13 (whose safe loader reads no floats: every number and setting travels in the JSON).
The header names the op, its arguments as plain data (a tensor as {"$t": key}; tuples,
dicts, dtypes, devices, slices tagged), a module's settings, the RNG state, autocast,
math flags, every tensor's dtype, shape and device, and what the bound cut.

Everything here is pure (no thread, no state) but write(), which the writer thread calls.
"""
from __future__ import annotations

import json
import math
import os
import urllib.parse

import torch

from lockstep._names import call_name

FORMAT = "lockstep-capture"
VERSION = 1
_SAFE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
_MAX_PART = 150
_PLAIN = (bool, int, str, type(None))


def safe_part(text):
    """`text` as one path component: characters outside [A-Za-z0-9._-] percent-encoded
    (so two names never map to one file), never empty or starting with '.'."""
    out = urllib.parse.quote(text, safe=_SAFE)
    if not out or out.startswith("."):
        out = "%2E" + out[1:] if out else "-"
    if len(out) > _MAX_PART:
        out = out[:_MAX_PART - 9] + "~%08x" % (hash_text(text) & 0xFFFFFFFF)
    return out


def hash_text(text):
    """A hash stable across processes (str's hash is salted per process)."""
    h = 2166136261
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def capture_path(directory, experiment, run, rank, step, row):
    """Where a run's file of one capture goes; both runs derive the same folder."""
    return os.path.join(directory, safe_part(experiment or "-"),
                        "step%d-%s" % (step, safe_part(row)), "%s.rank%d.pt" % (run, rank))


def parse_row(name):
    """(module name, call index, call row or None) of a row name: ``blocks.1.attn#1/
    softmax#0`` -> ("blocks.1.attn", 1, "blocks.1.attn#1/softmax#0"); ``fc1#2`` ->
    ("fc1", 2, None); an output element (``attn[0]``) or input (``attn(0)``) row names
    its module. ValueError for a name that is no row."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError("capture(name=%r) is not valid: give a row name, e.g. "
                         "'blocks.1.mlp.act' or 'blocks.1.attn/softmax#0'" % (name,))
    head, slash, tail = name.partition("/")
    base = head.split("[", 1)[0].split("(", 1)[0]
    path, _, index = base.partition("#")
    call = 0
    if index:
        if not index.isdigit():
            raise ValueError("capture(%r): the call suffix must be #<number>" % name)
        call = int(index)
    if slash:
        fname, _, k = tail.partition("#")
        if not fname or not k.isdigit() or "/" in tail:
            raise ValueError("capture(%r): a call in a zoomed module is named "
                             "module/func#k, e.g. 'blocks.1.attn/softmax#0'" % name)
        return path, call, "%s/%s#%d" % (call_name(path, call), fname, int(k))
    return path, call, None


def qualified_func(func):
    """The public name a replay resolves: torch.nn.functional.softmax, torch.softmax,
    torch.Tensor.mul, torch.special.erf, torch.linalg.norm; else module.qualname."""
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
    name = getattr(func, "__name__", None)
    if isinstance(name, str):
        for ns_name, ns in (("torch.nn.functional", F), ("torch", torch),
                            ("torch.special", getattr(torch, "special", None)),
                            ("torch.linalg", getattr(torch, "linalg", None)),
                            ("torch.Tensor", torch.Tensor)):
            if ns is not None and getattr(ns, name, None) is func:
                return "%s.%s" % (ns_name, name)
    return "%s.%s" % (getattr(func, "__module__", None) or "?",
                      getattr(func, "__qualname__", None) or name or type(func).__name__)


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


class Tensors:
    """The tensors of one capture: key -> (tensor, role); planned, then copied."""

    def __init__(self):
        self.items = {}

    def add(self, key, t):
        self.items[key] = t
        return {"$t": key}


def encode(value, tensors, prefix, depth=0):
    """Plain data for `value`: tensors by reference ({"$t": key}, added to `tensors`
    under `prefix`), tuples, dicts, dtypes, devices, slices tagged; anything else
    {"$unsupported": type name} (a replay then says it cannot rebuild the call)."""
    if isinstance(value, torch.Tensor):
        return tensors.add(prefix, value)
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if depth > 6:
        return {"$unsupported": "nesting"}
    if isinstance(value, torch.dtype):
        return {"$dtype": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"$device": str(value)}
    if isinstance(value, torch.Size):
        return {"$size": list(value)}
    if isinstance(value, (torch.memory_format, torch.layout)):
        return {"$torch": str(value).replace("torch.", "")}
    if isinstance(value, slice):
        return {"$slice": [encode(v, tensors, prefix, depth + 1)
                           for v in (value.start, value.stop, value.step)]}
    if value is Ellipsis:
        return {"$ellipsis": True}
    if isinstance(value, tuple):
        return {"$tuple": [encode(v, tensors, "%s.%d" % (prefix, i), depth + 1)
                           for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, tensors, "%s.%d" % (prefix, i), depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"$dict": {k: encode(v, tensors, "%s.%s" % (prefix, k), depth + 1)
                          for k, v in value.items()}}
    if isinstance(value, (int, float)):  # numpy scalars and kin
        return encode(value.item() if hasattr(value, "item") else float(value), tensors,
                      prefix, depth)
    return {"$unsupported": type(value).__name__}


def plain(value, depth=0):
    """A module setting worth keeping: numbers, bools, strings, None, tuples and lists
    of those (GELU's approximate, LayerNorm's eps and normalized_shape)."""
    if isinstance(value, _PLAIN) or isinstance(value, float):
        return True
    if isinstance(value, (tuple, list)) and depth < 3 and len(value) <= 64:
        return all(plain(v, depth + 1) for v in value)
    return isinstance(value, torch.dtype)


def module_settings(module):
    """The module's plain-data attributes (its settings), encoded; torch's hook
    bookkeeping left out."""
    out = {}
    for k, v in vars(module).items():
        if k.startswith("__") or "hook" in k or k in ("_parameters", "_buffers", "_modules"):
            continue
        if plain(v):
            out[k] = encode(v, None, k)
    return out


def autocast_state():
    """{device type: dtype name} of each autocast context active now (cpu, cuda)."""
    out = {}
    import warnings  # pylint: disable=import-outside-toplevel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dev in ("cpu", "cuda"):
            try:
                try:  # torch >= 2.4
                    on, dtype = torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev)
                except TypeError:
                    if dev == "cpu":
                        on, dtype = torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
                    else:
                        on, dtype = torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
                if on:
                    out[dev] = dtype_name(dtype)
            except Exception:  # pylint: disable=broad-except
                pass
    return out


def math_flags():
    out = {}
    for key, read in (
            ("deterministic_algorithms", torch.are_deterministic_algorithms_enabled),
            ("float32_matmul_precision", getattr(torch, "get_float32_matmul_precision", None)),
            ("cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
            ("cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32)):
        try:
            if read is not None:
                out[key] = read()
        except Exception:  # pylint: disable=broad-except
            pass
    return out


def plan_slices(items, max_bytes):
    """key -> rows to keep (None: whole) so the tensors fit in max_bytes. The rows of
    the batch (the tensors among inputs and outputs whose first dimension is the first
    input's) are cut together to the same count, so that a row-wise op (elementwise, a
    softmax, a norm or a Linear over the last dimension) replays on the rows kept; when
    the rest alone is over the bound, each big tensor gets an equal share instead, and a
    tensor whose one row exceeds its share is left out (0 rows)."""
    nbytes = {k: t.numel() * t.element_size() for k, t in items.items()}
    if sum(nbytes.values()) <= max_bytes:
        return {k: None for k in items}
    first = next((items[k] for k in sorted(items) if k.startswith(("in", "kw"))
                  and items[k].dim()), None)
    batch = [k for k, t in items.items() if first is not None and t.dim()
             and t.shape[0] == first.shape[0] and k.startswith(("in", "kw", "out"))]
    fixed = sum(n for k, n in nbytes.items() if k not in batch)
    per_row = sum(nbytes[k] / items[k].shape[0] for k in batch)
    if batch and per_row and fixed + per_row <= max_bytes:
        rows = int((max_bytes - fixed) // per_row)
        return {k: (rows if k in batch else None) for k in items}
    plan, left = {}, float(max_bytes)
    for i, (n, key) in enumerate(sorted((n, k) for k, n in nbytes.items())):
        share = left / (len(nbytes) - i)
        t = items[key]
        if n <= share:
            plan[key] = None
            left -= n
            continue
        row_bytes = n / max(1, t.shape[0] if t.dim() else 1)
        keep = int(share // row_bytes) if t.dim() else 0
        plan[key] = keep
        left -= keep * row_bytes
    return plan


def write(path, meta, copies):
    """The capture file (atomically: a temporary file renamed) and its JSON sidecar."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = json.dumps(meta, sort_keys=True)
    tmp = path + ".tmp"
    torch.save({"lockstep_capture": text, "tensors": copies}, tmp)
    os.replace(tmp, path)
    with open(path + ".json.tmp", "w", encoding="utf-8") as f:
        f.write(json.dumps(meta, sort_keys=True, indent=1) + "\n")
    os.replace(path + ".json.tmp", path + ".json")
