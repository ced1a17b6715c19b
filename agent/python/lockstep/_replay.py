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
Loading and rebuilding are lockstep._replay_op; nothing runs code from the files.
"""
from __future__ import annotations

import json
import math

import torch

from lockstep import _capture_file as cf
from lockstep._replay_op import (MANTISSA, MIN_EXP, Op, ReplayError, UsageError, load, pick,
                                 unit)

EXIT_OK, EXIT_FINDING, EXIT_USAGE, EXIT_CANNOT = 0, 1, 2, 3
EXIT_TEXT = ("exit 0: the op is accurate in both runs (within rounding, identical, or its inputs "
             "differ); 1: the runs compute different functions, one is less accurate, or "
             "inconclusive; 2: a usage error (bad flag, a file that is not a capture, two "
             "captures of different ops); 3: the op cannot be replayed")

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
    e = (exp.double() - 1).clamp(min=MIN_EXP.get(dtype, -126))
    ulp = torch.pow(2.0, e - MANTISSA.get(dtype, 23))
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
    pair_dtype = min(b.coarsest(), c.coarsest(), key=unit)  # the finer of the two
    width = b.width()
    budget = ulps + math.sqrt(width)
    ref_b, ref_c = b.run(b), c.run(c)
    runs = []
    for role, op, outs, ref in (("baseline", b, out_b, ref_b), ("candidate", c, out_c, ref_c)):
        own_dtype = max((t.dtype for t in outs if t.is_floating_point()), key=unit,
                        default=torch.float32)
        rel, u_own = error(outs, ref, own_dtype)
        _, u_pair = error(outs, ref, pair_dtype)
        runs.append({"role": role, "run": op.meta.get("run"), "file": op.meta["path"],
                     "device": ", ".join(sorted({e.get("device", "?") for e in
                                                 op.meta.get("tensors", {}).values()})),
                     "torch": op.meta.get("torch"), "dtype": cf.dtype_name(own_dtype),
                     "max_rel_error": rel, "ulps": u_own, "ulps_pair": u_pair})
    out = {"row": mb.get("row"), "step": mb.get("step"), "kind": b.kind,
           "op": mb.get("func") if b.kind == "call" else mb.get("module_type"),
           "pair_dtype": cf.dtype_name(pair_dtype), "width": width,
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
    u = unit(max(b.coarsest(), c.coarsest(), key=unit))
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
    except Exception as e:  # pylint: disable=broad-except  (one line, never a traceback)
        if isinstance(e, ReplayError):
            msg = "cannot replay: %s" % e
        elif isinstance(e, RuntimeError):  # torch refused the rebuilt call
            msg = "cannot replay: the op failed when re-run in float64 (%s)" % (
                str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
        else:  # a header this replay does not understand
            msg = "cannot replay: the capture's header is not as this replay expects (%s: %s)" \
                % (type(e).__name__, str(e)[:200])
        print(json.dumps({"verdict": "cannot_replay", "message": msg}) if args.json else msg)
        return EXIT_CANNOT
    print(json.dumps(res, sort_keys=True, default=str) if args.json else text(res))
    return EXIT_OK if res["verdict"] in ("within_rounding", "inputs_differ", "identical") \
        else EXIT_FINDING
