"""`python -m lockstep replay`: re-runs a captured op on the CPU in float64 and says which
run is wrong (docs/python.md "Capture and replay").

It reads two captures of one op (lockstep._capture: the baseline's and the candidate's)
with torch.load(weights_only=True) only, rebuilds the op as data — a call from its
qualified name within an allowlist of torch namespaces, a module only when its type is a
torch.nn builtin, from its captured settings, parameters and buffers — and runs it in
float64 from each run's own inputs (the reference of that run) and with each run's
settings on the baseline's inputs. Verdicts, in this order:

- different_functions (cause config): the settings differ and compute differently in
  float64 on the same inputs, or the op itself differs;
- less_accurate: one run's error against its float64 is `factor` times the other's and
  beyond what the pair's dtype explains (`ulps` + sqrt(width) ULPs): cause precision when
  a dtype setting or autocast says why, else platform (a kernel to report);
- inputs_differ: both ops are accurate and their inputs differ, which accounts for the
  output's difference: the op is not where the error is born;
- within_rounding: both are accurate on identical inputs: the collector's birth-point
  budget is too tight for this op; says how far to raise --birth-ulps;
- identical: inputs and outputs bit-identical;
- inconclusive: both are off by more than their dtype explains, neither `factor` times
  the other.
Nothing here runs code from the files: names resolve only within the allowlist.
"""
from __future__ import annotations

import json
import math
import os
import re

import torch
import torch.nn.functional as F

from lockstep import _capture

EXIT_OK, EXIT_FINDING, EXIT_USAGE, EXIT_CANNOT = 0, 1, 2, 3
EXIT_TEXT = ("exit 0: the op is accurate in both runs (within rounding, identical, or its inputs "
             "differ); 1: the runs compute different functions, one is less accurate, or "
             "inconclusive; 2: a usage error (bad flag, a file that is not a capture, two "
             "captures of different ops); 3: the op cannot be replayed")

_NAMESPACES = {"torch": torch, "torch.nn.functional": F, "torch.Tensor": torch.Tensor,
               "torch.special": getattr(torch, "special", None),
               "torch.linalg": getattr(torch, "linalg", None)}
# Names in those namespaces that touch files, global state or the interpreter: never called.
_DENY = re.compile(r"^(load|save|from_file|from_numpy|set_.*|use_.*|manual_seed|seed|"
                   r"initial_seed|compile|.*file.*|.*storage.*|numpy|tolist|data_ptr|"
                   r"__setitem__|__reduce.*|__setstate__|__init.*|__new__|__del__|"
                   r"__class.*|__getattr.*|__setattr__|register.*|backward|retain_grad)$")
_MANTISSA = {torch.float64: 52, torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
_MIN_EXP = {torch.float64: -1022, torch.float32: -126, torch.float16: -14,
            torch.bfloat16: -126}
for _n, _m, _e in (("float8_e4m3fn", 3, -6), ("float8_e5m2", 2, -14)):
    if hasattr(torch, _n):
        _MANTISSA[getattr(torch, _n)] = _m
        _MIN_EXP[getattr(torch, _n)] = _e


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
        raise UsageError("%s is not a lockstep capture (torch.load(weights_only=True) "
                         "failed: %s)" % (path, str(e).splitlines()[0][:200])) from None
    if not isinstance(data, dict) or not isinstance(data.get("lockstep_capture"), str):
        raise UsageError("%s is not a lockstep capture (no lockstep_capture header)" % path)
    try:
        meta = json.loads(data["lockstep_capture"])
    except ValueError:
        raise UsageError("%s: its lockstep_capture header is not JSON" % path) from None
    if meta.get("format") != _capture.FORMAT or meta.get("version") != _capture.VERSION:
        raise UsageError("%s: capture format %r version %r is not one this replay reads (%s %d)"
                         % (path, meta.get("format"), meta.get("version"), _capture.FORMAT,
                            _capture.VERSION))
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
                "args": _strip(self.meta.get("args")), "kwargs": _strip(self.meta.get("kwargs"))}

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
        _capture.output_tensors(out, "", items)
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
        return max(dts, key=_unit, default=torch.float32)


def _is_float_dtype(v):
    return isinstance(v, dict) and "$dtype" in v and v["$dtype"] in (
        "float16", "bfloat16", "float32", "float64") or (
        isinstance(v, dict) and str(v.get("$dtype", "")).startswith("float8"))


def _strip(v):
    """The encoded arguments with tensors and floating dtypes blanked (the settings)."""
    if isinstance(v, list):
        return [_strip(x) for x in v]
    if isinstance(v, dict):
        if "$t" in v:
            return "<tensor>"
        if _is_float_dtype(v):
            return "<dtype>"
        # a keyword given a floating dtype is precision: as if not given (dtype=None)
        return {k: _strip(x) for k, x in v.items() if not _is_float_dtype(x)}
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


def _unit(dtype):
    return 2.0 ** -(_MANTISSA.get(dtype, 23) + 1)


# ---- measuring -----------------------------------------------------------------------

def _flat64(ts):
    return torch.cat([t.double().reshape(-1) for t in ts]) if ts else torch.zeros(0)


def error(outs, refs, dtype):
    """(max relative error, max ULPs of `dtype`) of outs against refs: each element
    relative to itself, or to the tensor's root-mean-square when smaller (cancellation
    near zero is no error of the op)."""
    o, r = _flat64(outs), _flat64(refs)
    if o.numel() != r.numel():
        raise ReplayError("the replayed output has %d elements, the captured one %d"
                          % (r.numel(), o.numel()))
    if not o.numel():
        return 0.0, 0.0
    finite = torch.isfinite(r)
    if not bool(torch.equal(finite, torch.isfinite(o))) or \
            not bool(torch.equal(o[~finite], r[~finite])):
        return math.inf, math.inf
    o, r = o[finite], r[finite]
    if not o.numel():
        return 0.0, 0.0
    scale = max(float(r.pow(2).mean().sqrt()), 1e-300)
    mag = r.abs().clamp(min=scale)
    diff = (o - r).abs()
    rel = float((diff / mag).max())
    _, exp = torch.frexp(mag)
    e = (exp.double() - 1).clamp(min=_MIN_EXP.get(dtype, -126))
    ulp = torch.pow(2.0, e - _MANTISSA.get(dtype, 23))
    return rel, float((diff / ulp).max())


def distance(a, b):
    """‖a − b‖ / ‖b‖ over float64 copies (0 when both are zero)."""
    x, y = _flat64(a), _flat64(b)
    if x.numel() != y.numel():
        return math.inf
    den = float(y.norm())
    num = float((x - y).norm())
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


# ---- the verdict ---------------------------------------------------------------------

def judge(base_path, cand_path, ulps=16.0, factor=4.0, birth_ulps=32.0, birth_gain=8.0):
    """The replay's findings as a dict (what --json prints). Raises UsageError or
    ReplayError."""
    mb, tb = load(base_path)
    mc, tc = load(cand_path)
    if (mb.get("row"), mb.get("step")) != (mc.get("row"), mc.get("step")):
        raise UsageError("the two captures are of different ops or steps (%s at step %s, %s "
                         "at step %s): give the two runs' captures of one op"
                         % (mb.get("row"), mb.get("step"), mc.get("row"), mc.get("step")))
    b, c = Op(mb, tb), Op(mc, tc)
    out_b, out_c = b.outputs(), c.outputs()
    notes = []
    if b.cut or c.cut:
        notes.append("tensors cut to the capture's bound (%s): the replay takes their rows "
                     "as independent" % ", ".join(sorted(set(b.cut) | set(c.cut))))
    pair_dtype = min(b.coarsest(), c.coarsest(), key=_unit)  # the finer of the two
    width = b.width()
    budget = ulps + math.sqrt(width)
    ref_b, ref_c = b.run(b), c.run(c)
    runs = []
    for role, op, outs, ref in (("baseline", b, out_b, ref_b), ("candidate", c, out_c, ref_c)):
        own_dtype = max((t.dtype for t in outs if t.is_floating_point()), key=_unit,
                        default=torch.float32)
        rel, u_own = error(outs, ref, own_dtype)
        _, u_pair = error(outs, ref, pair_dtype)
        runs.append({"role": role, "run": op.meta.get("run"), "file": op.meta["path"],
                     "device": ", ".join(sorted({e.get("device", "?") for e in
                                                 op.meta.get("tensors", {}).values()})),
                     "torch": op.meta.get("torch"), "dtype": _capture._dtype_name(own_dtype),
                     "max_rel_error": rel, "ulps": u_own, "ulps_pair": u_pair})
    out = {"row": mb.get("row"), "step": mb.get("step"), "kind": b.kind,
           "op": mb.get("func") if b.kind == "call" else mb.get("module_type"),
           "pair_dtype": _capture._dtype_name(pair_dtype), "width": width,
           "budget_ulps": budget, "runs": runs, "notes": notes,
           "exit_codes": EXIT_TEXT}
    e_out = distance(out_c, out_b)
    e_in = max([distance([tc[k]], [t]) for k, t in b.inputs().items() if k in tc] or [0.0])
    out["output_distance"], out["input_distance"] = e_out, e_in

    # (a) different functions: the settings differ and compute differently in float64.
    sb, sc = b.settings(), c.settings()
    if sb != sc:
        diffs = _diff(sb, sc)
        cross_c = c.run(b)  # the candidate's settings on the baseline's data
        apart = distance(cross_c, ref_b)
        own_c = error(out_c, ref_c, pair_dtype)[1]
        other_c = error(out_c, b.run(c), pair_dtype)[1]  # the baseline's settings, its data
        out["settings_differ"] = diffs
        out["function_distance"] = apart
        if apart > 1e-12:
            out.update(verdict="different_functions", cause="config", message=(
                "the two runs compute different functions: %s; on the same inputs in "
                "float64 they differ by %.3g (relative); the candidate's output is %.3g ULPs "
                "of %s from float64 of its own settings, %.3g from the baseline's: cause "
                "config" % ("; ".join(diffs), apart, own_c, out["pair_dtype"], other_c)))
            return out
        notes.append("settings differ but compute the same function: " + "; ".join(diffs))

    # (b) one run less accurate than the other and than the pair's dtype explains.
    ub, uc = runs[0]["ulps_pair"], runs[1]["ulps_pair"]
    worse, other = (runs[1], runs[0]) if uc >= ub else (runs[0], runs[1])
    k = worse["ulps_pair"] / max(other["ulps_pair"], 0.5)
    out["factor"] = k
    if worse["ulps_pair"] > budget and k >= factor:
        why = _diff(b.precision(), c.precision())
        if worse["dtype"] != other["dtype"]:
            why.append("it hands on %s, the other run %s" % (worse["dtype"], other["dtype"]))
        cause = "precision" if why else "platform"
        tail = ("; cause precision: %s" % "; ".join(why)) if why else (
            "; no setting explains it: the platform's kernel is less accurate; report it "
            "with %s" % worse["file"])
        out.update(verdict="less_accurate", cause=cause, less_accurate=worse["role"],
                   message="the %s's op is less accurate: its error against float64 is "
                   "%.3g ULPs of %s (%.3g ULPs of its own %s), %.0fx the %s's (%.3g), beyond "
                   "the %.3g its dtype explains%s" % (
                       worse["role"], worse["ulps_pair"], out["pair_dtype"], worse["ulps"],
                       worse["dtype"], k, other["role"], other["ulps_pair"], budget, tail))
        return out
    if worse["ulps_pair"] > budget:
        out.update(verdict="inconclusive", cause=None, message=(
            "both runs are off float64 by more than %s explains (%.3g and %.3g ULPs, budget "
            "%.3g), neither %gx the other: the op is inaccurate in both, or this dtype "
            "budget is too small for it (--ulps)" % (out["pair_dtype"], ub, uc, budget, factor)))
        return out

    # (d) inputs differ, and the float64 op carries that difference to its output.
    if e_in > 0:
        carried = distance(b.run(c), ref_b)  # the baseline's settings on the candidate's data
        out["carried_distance"] = carried
        if carried >= 0.5 * e_out:
            gain = carried / e_in if e_in else 0.0
            extra = ""
            if gain > birth_gain:
                extra = ("; it amplifies its inputs' difference %.3gx, more than --birth-gain "
                         "(%g) allows: raise birth-gain to %s" % (gain, birth_gain,
                                                                  _nice(2 * gain)))
            out.update(verdict="inputs_differ", cause=None, message=(
                "the op is accurate in both runs (%.3g and %.3g ULPs of %s) and its inputs "
                "differ by %.3g, which in float64 alone makes %.3g of the %.3g its output "
                "differs by: the op is not where the error is born%s"
                % (ub, uc, out["pair_dtype"], e_in, carried, e_out, extra)))
            return out

    if e_out == 0 and e_in == 0:
        out.update(verdict="identical", cause=None, message=(
            "the two runs' inputs and outputs are bit-identical: nothing is born here"))
        return out

    # (c) both within rounding: the collector's budget is too tight for this op. Its
    # rounding allowance is u x (birth-ulps + 2 sqrt(width)) over birth-gain x the inputs'
    # distance (docs/rules.md "Where the error is born"); the value named is twice what
    # this op needs, for the sketches' estimate and the other steps.
    u = _unit(max(b.coarsest(), c.coarsest(), key=_unit))
    need = (e_out - birth_gain * e_in) / u - 2 * math.sqrt(width)
    to = _nice(2 * need)
    out["setting"] = {"name": "birth-ulps", "from": birth_ulps, "to": max(to, birth_ulps),
                      "needed": need}
    how = ("raise birth-ulps (--birth-ulps of lockstep collect and compare, birth-ulps in "
           "the settings file's [rules]) from %g to %s" % (birth_ulps, to)) if to > birth_ulps \
        else ("birth-ulps %g already allows it (it needs %.3g): the collector that named it "
              "ran with a tighter setting (give it as --birth-ulps here)" % (birth_ulps, need))
    out.update(verdict="within_rounding", cause=None, message=(
        "both runs are within rounding of float64 (%.3g and %.3g ULPs of %s, budget %.3g); "
        "their outputs differ by %.3g (%.3g units of roundoff), which the birth-point budget "
        "took for an error of the op: %s" % (ub, uc, out["pair_dtype"], budget, e_out,
                                            e_out / u, how)))
    return out


def _nice(x):
    """x rounded up to 1, 2 or 5 times a power of ten (a setting a person types)."""
    if not x > 0 or not math.isfinite(x):
        return 1
    p = 10 ** math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if m * p >= x - 1e-12:
            v = m * p
            return int(v) if v >= 1 else float("%.3g" % v)
    return x


def _diff(a, b, prefix=""):
    """'key: A (baseline) vs B (candidate)' for each setting that differs."""
    out = []
    for k in sorted(set(a) | set(b), key=str):
        va, vb = a.get(k, "<unset>"), b.get(k, "<unset>")
        if va == vb:
            continue
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, prefix if k.startswith("$") else prefix + k + ".")
        else:
            out.append("%s%s: %s (baseline) vs %s (candidate)"
                       % (prefix, k, _show(va), _show(vb)))
    return out


def _show(v):
    if isinstance(v, dict):
        for tag in ("$dtype", "$float", "$device", "$torch"):
            if tag in v:
                return str(v[tag])
        if "$tuple" in v:
            return "(%s)" % ", ".join(_show(x) for x in v["$tuple"])
        if "$dict" in v:
            return "{%s}" % ", ".join("%s=%s" % (k, _show(x)) for k, x in v["$dict"].items())
    if isinstance(v, list):
        return "[%s]" % ", ".join(_show(x) for x in v)
    return repr(v)


def text(res):
    """The human report: one line per run, then the verdict."""
    lines = ["replay of %s at step %s (%s %s), float64 on the CPU, torch %s"
             % (res["row"], res["step"], res["kind"], res["op"], torch.__version__)]
    for r in res["runs"]:
        pair = "" if r["dtype"] == res["pair_dtype"] else " (%.3g of %s)" % (
            r["ulps_pair"], res["pair_dtype"])
        lines.append("  %-9s %s: max rel. error %.3g, %.3g ULPs of %s%s  [%s]"
                     % (r["role"], r["run"], r["max_rel_error"], r["ulps"], r["dtype"], pair,
                        r["file"]))
    for n in res["notes"]:
        lines.append("  note: " + n)
    lines.append("verdict: %s%s: %s" % (res["verdict"],
                                        " (cause %s)" % res["cause"] if res.get("cause") else "",
                                        res["message"]))
    return "\n".join(lines)


def main(args):
    """`python -m lockstep replay`: prints the report; returns the exit status."""
    try:
        base, cand = pick(args.captures)
        res = judge(base, cand, ulps=args.ulps, factor=args.factor, birth_ulps=args.birth_ulps,
                    birth_gain=args.birth_gain)
    except UsageError as e:
        print("lockstep replay: %s" % e)
        return EXIT_USAGE
    except ReplayError as e:
        msg = "cannot replay: %s" % e
        print(json.dumps({"verdict": "cannot_replay", "message": msg}) if args.json else msg)
        return EXIT_CANNOT
    print(json.dumps(res, sort_keys=True, default=str) if args.json else text(res))
    return EXIT_OK if res["verdict"] in ("within_rounding", "inputs_differ", "identical") \
        else EXIT_FINDING
