"""A captured op rebuilt as data, for `python -m lockstep replay` (lockstep._replay).

load() reads a capture with torch.load(weights_only=True) only; Op rebuilds the op it
holds: a call from its qualified name within an allowlist of torch namespaces (torch,
torch.nn.functional, torch.Tensor's methods, torch.special, torch.linalg; never a name
that touches files or global state), a module only when its type is a torch.nn builtin
without submodules, from its captured settings, parameters and buffers. Op.run() runs it
(in float64 by default) with this run's settings on any run's data. Nothing here runs code
from the file: names resolve only within the allowlist. Anything else raises ReplayError
with one sentence (exit 3); a file that is no capture raises UsageError (exit 2).
"""
from __future__ import annotations

import json
import os
import re

import torch
import torch.nn.functional as F

from lockstep import _capture_file as cf
from lockstep._names import output_tensors

_NAMESPACES = {"torch": torch, "torch.nn.functional": F, "torch.Tensor": torch.Tensor,
               "torch.special": getattr(torch, "special", None),
               "torch.linalg": getattr(torch, "linalg", None)}
# Names in those namespaces that touch files, global state or the interpreter: never called.
_DENY = re.compile(r"^(load|save|from_file|from_numpy|set_.*|use_.*|manual_seed|seed|"
                   r"initial_seed|compile|.*file.*|.*storage.*|numpy|tolist|data_ptr|"
                   r"__setitem__|__reduce.*|__setstate__|__init.*|__new__|__del__|"
                   r"__class.*|__getattr.*|__setattr__|register.*|backward|retain_grad)$")
MANTISSA = {torch.float64: 52, torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
MIN_EXP = {torch.float64: -1022, torch.float32: -126, torch.float16: -14,
            torch.bfloat16: -126}
for _n, _m, _e in (("float8_e4m3fn", 3, -6), ("float8_e5m2", 2, -14)):
    if hasattr(torch, _n):
        MANTISSA[getattr(torch, _n)] = _m
        MIN_EXP[getattr(torch, _n)] = _e


class ReplayError(Exception):
    """A capture that cannot be replayed: one sentence (exit 3)."""


class UsageError(Exception):
    """A file that is no capture, two captures that do not pair (exit 2)."""


# ---- loading -------------------------------------------------------------------------

def load(path):
    """(meta, tensors) of one capture file, read with weights_only=True."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError("%s: no such file" % path) from None
    except Exception as e:  # pylint: disable=broad-except
        raise UsageError("%s is not a lockstep capture (torch.load(weights_only=True) cannot "
                         "read it as plain data: %s)" % (path, type(e).__name__)) from None
    if not isinstance(data, dict) or not isinstance(data.get("lockstep_capture"), str):
        raise UsageError("%s is not a lockstep capture (no lockstep_capture header)" % path)
    try:
        meta = json.loads(data["lockstep_capture"])
    except ValueError:
        raise UsageError("%s: its lockstep_capture header is not JSON" % path) from None
    if meta.get("format") != cf.FORMAT or meta.get("version") != cf.VERSION:
        raise UsageError("%s: capture format %r version %r is not one this replay reads (%s %d)"
                         % (path, meta.get("format"), meta.get("version"), cf.FORMAT,
                            cf.VERSION))
    tensors = data.get("tensors") or {}
    meta["path"] = path
    return meta, tensors


def pick(paths):
    """(baseline path, candidate path) from two files, or from one folder holding the two
    runs' files of one capture (by their roles; the lowest rank when several)."""
    if len(paths) == 2:
        return paths[0], paths[1]
    folder = paths[0]
    if not os.path.isdir(folder):
        raise UsageError("%s is not a folder of captures; give a folder or two capture files"
                         % folder)
    files = sorted(f for f in os.listdir(folder) if f.endswith(".pt"))
    roles = {}
    for f in files:
        try:
            with open(os.path.join(folder, f + ".json"), encoding="utf-8") as fh:
                side = json.load(fh)
        except (OSError, ValueError):
            continue
        key = (side.get("role"), side.get("rank", 0))
        roles.setdefault(side.get("role"), []).append((key[1], os.path.join(folder, f)))
    if not roles.get("baseline") or not roles.get("candidate"):
        raise UsageError("%s does not hold a baseline's and a candidate's capture (found: %s)"
                         % (folder, ", ".join(files) or "none"))
    return min(roles["baseline"])[1], min(roles["candidate"])[1]


# ---- rebuilding ----------------------------------------------------------------------

def decode(value, tensors, f64, baseline_tensors=None):
    """The captured argument as Python: tensors from `tensors` (float64 when f64; from
    baseline_tensors when given: another run's settings on the baseline's data),
    floating dtypes as float64 when f64."""
    src = baseline_tensors if baseline_tensors is not None else tensors
    if isinstance(value, list):
        return [decode(v, tensors, f64, baseline_tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "$t" in value:
        t = src.get(value["$t"])
        if t is None:
            raise ReplayError("tensor %s was not saved (over the capture's bound): the op "
                              "cannot be re-run without it" % value["$t"])
        return t.double() if f64 and t.is_floating_point() else t.clone()
    if "$tuple" in value:
        return tuple(decode(v, tensors, f64, baseline_tensors) for v in value["$tuple"])
    if "$dict" in value:
        return {k: decode(v, tensors, f64, baseline_tensors) for k, v in value["$dict"].items()}
    if "$float" in value:
        return float(value["$float"])
    if "$dtype" in value:
        dt = getattr(torch, value["$dtype"], None)
        if not isinstance(dt, torch.dtype):
            raise ReplayError("dtype %r is not one of this torch's" % value["$dtype"])
        return torch.float64 if f64 and dt.is_floating_point else dt
    if "$device" in value:
        return torch.device("cpu")
    if "$size" in value:
        return torch.Size(value["$size"])
    if "$slice" in value:
        return slice(*[decode(v, tensors, f64, baseline_tensors) for v in value["$slice"]])
    if "$ellipsis" in value:
        return Ellipsis
    if "$torch" in value:
        obj = getattr(torch, value["$torch"], None)
        if not isinstance(obj, (torch.memory_format, torch.layout)):
            raise ReplayError("argument torch.%s is not a memory format or layout"
                              % value["$torch"])
        return obj
    if "$unsupported" in value:
        raise ReplayError("an argument of type %s was not captured as data"
                          % value["$unsupported"])
    return value


def resolve_func(qualified):
    """The torch function `qualified` names, within the allowlist; ReplayError else."""
    ns_name, _, name = (qualified or "").rpartition(".")
    ns = _NAMESPACES.get(ns_name)
    if ns is None:
        raise ReplayError("%s is not in a namespace replay may call (torch, "
                          "torch.nn.functional, torch.Tensor methods, torch.special, "
                          "torch.linalg)" % qualified)
    if _DENY.match(name) or (name.startswith("_") and not (
            ns is torch.Tensor and name.startswith("__") and name.endswith("__"))):
        raise ReplayError("%s is not an op replay calls (it touches files or global state, "
                          "or is private)" % qualified)
    func = getattr(ns, name, None)
    if func is None or not callable(func) or isinstance(func, type):
        raise ReplayError("%s does not exist in this torch %s" % (qualified, torch.__version__))
    return func


def resolve_module(type_name):
    """The torch.nn builtin class `type_name` (torch.nn.modules.activation.GELU) names."""
    cls = getattr(torch.nn, (type_name or "").rpartition(".")[2], None)
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module) or \
            "%s.%s" % (cls.__module__, cls.__qualname__) != type_name or \
            not cls.__module__.startswith("torch.nn.modules."):
        raise ReplayError("module type %s is not a torch.nn builtin: its code is not in the "
                          "capture, so it cannot be rebuilt (capture a call inside it: "
                          "zoom names them)" % type_name)
    return cls


class Op:
    """One run's captured op, rebuilt: run(settings_of, data_of, f64) -> output tensors."""

    def __init__(self, meta, tensors):
        self.meta, self.tensors = meta, tensors
        self.kind = meta.get("kind")
        if meta.get("bound", {}).get("cut"):
            self.cut = meta["bound"]["cut"]
        else:
            self.cut = []
        if self.kind == "call":
            if meta.get("inplace"):
                raise ReplayError("%s is in-place: its inputs were saved after it changed "
                                  "them, so it cannot be re-run" % meta.get("func"))
            self.func = resolve_func(meta.get("func"))
        elif self.kind == "module":
            if meta.get("has_children"):
                raise ReplayError("%s (%s) has submodules, whose settings are not captured: "
                                  "capture the submodule or a call in its own code"
                                  % (meta.get("row"), meta.get("module_type")))
            self.cls = resolve_module(meta.get("module_type"))
        else:
            raise UsageError("%s: unknown capture kind %r" % (meta["path"], self.kind))

    def settings(self):
        """What defines the function: a module's settings, a call's name and its
        non-tensor arguments; floating dtypes left out (they are precision, judged by
        accuracy), as is `training` (a replay runs as the capture did)."""
        if self.kind == "module":
            return {"type": self.meta["module_type"],
                    **{k: v for k, v in self.meta.get("settings", {}).items()
                       if not _is_float_dtype(v)}}
        return {"func": self.meta.get("func"),
                "args": strip(self.meta.get("args")), "kwargs": strip(self.meta.get("kwargs"))}

    def precision(self):
        """The precision settings: dtype arguments, autocast."""
        out = {"autocast": self.meta.get("autocast") or {}}
        for k, v in _dtype_settings(self.meta.get("settings" if self.kind == "module"
                                                  else "kwargs")):
            out[k] = v
        return out

    def run(self, data, f64=True):
        """The op with this run's settings on `data` (an Op: whose tensors to use)."""
        base = data.tensors if data is not self else None
        if self.kind == "call":
            args = decode(self.meta["args"], self.tensors, f64, base)
            kwargs = decode(self.meta["kwargs"], self.tensors, f64, base)
            with torch.no_grad():
                self._seed(data)
                out = self.func(*args, **kwargs)
        else:
            m = self.cls.__new__(self.cls)
            torch.nn.Module.__init__(m)
            for k, v in self.meta.get("settings", {}).items():
                if not k.startswith("__"):
                    m.__dict__[k] = decode(v, {}, False)
            for kind, table in (("_parameters", "params"), ("_buffers", "buffers")):
                for name, ref in data.meta.get(table, {}).items():
                    if "." in name:
                        continue
                    t = None if ref is None else decode(ref, data.tensors, f64)
                    getattr(m, kind)[name] = (torch.nn.Parameter(t, requires_grad=False)
                                              if kind == "_parameters" and t is not None else t)
            args = decode(data.meta["args"], data.tensors, f64)
            kwargs = decode(data.meta["kwargs"], data.tensors, f64)
            with torch.no_grad():
                self._seed(data)
                out = m(*args, **kwargs)
        items = []
        output_tensors(out, "", items)
        return [t for _, t in items]

    @staticmethod
    def _seed(data):
        ref = (data.meta.get("rng") or {}).get("cpu")
        if isinstance(ref, dict) and ref.get("$t") in data.tensors:
            torch.set_rng_state(data.tensors[ref["$t"]])

    def outputs(self):
        outs = []
        for o in self.meta.get("outputs", []):
            t = self.tensors.get(o["tensor"]["$t"])
            if t is None:
                raise ReplayError("output %s was not saved (over the capture's bound)"
                                  % o["tensor"]["$t"])
            outs.append(t)
        return outs

    def inputs(self):
        """The floating-point tensors the op received (arguments, parameters, buffers)."""
        return {k: t for k, t in self.tensors.items()
                if not k.startswith(("out", "rng.")) and t.is_floating_point()}

    def width(self):
        """The last dimension of its first floating-point input (a reduction's length)."""
        for k in sorted(self.inputs()):
            if k.startswith(("in", "kw")):
                t = self.tensors[k]
                return int(t.shape[-1]) if t.dim() else 1
        return 1

    def coarsest(self):
        dts = [t.dtype for k, t in self.tensors.items() if not k.startswith("rng.")
               and t.is_floating_point()]
        return max(dts, key=unit, default=torch.float32)


def _is_float_dtype(v):
    return isinstance(v, dict) and "$dtype" in v and v["$dtype"] in (
        "float16", "bfloat16", "float32", "float64") or (
        isinstance(v, dict) and str(v.get("$dtype", "")).startswith("float8"))


def strip(v):
    """The encoded arguments with tensors and floating dtypes blanked (the settings)."""
    if isinstance(v, list):
        return [strip(x) for x in v]
    if isinstance(v, dict):
        if "$t" in v:
            return "<tensor>"
        if _is_float_dtype(v):
            return "<dtype>"
        # a keyword given a floating dtype is precision: as if not given (dtype=None)
        return {k: strip(x) for k, x in v.items() if not _is_float_dtype(x)}
    return v


def _dtype_settings(v, path=""):
    """(where, dtype name) of each floating dtype among encoded settings or arguments."""
    if _is_float_dtype(v):
        yield path or "dtype", v["$dtype"]
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _dtype_settings(x, "%s[%d]" % (path, i))
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from _dtype_settings(x, path if k.startswith("$") else
                                       ("%s.%s" % (path, k) if path else k))


def unit(dtype):
    return 2.0 ** -(MANTISSA.get(dtype, 23) + 1)
