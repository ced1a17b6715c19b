"""A strict checker of the Prometheus text exposition format 0.0.4, as lockstep
writes it (stricter than Prometheus itself where lockstep promises more):

- the body ends with a newline; no blank lines; every line is `# HELP`, `# TYPE`
  or a sample `name{label="value",...} value`;
- metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]*
  and do not start with "__"; a label appears once per sample;
- label values use only the escapes \\\\, \\" and \\n; HELP only \\\\ and \\n;
- every family has exactly one HELP and one TYPE, HELP then TYPE, before its
  samples, and its samples are contiguous; no sample without a family;
- a sample's name is its family's (or family_sum / family_count for a summary);
- counters end in _total, nothing else does; no (name, labels) twice;
- values parse as floats (NaN, +Inf, -Inf allowed).

parse(text) returns {family: {"type", "help", "samples": [(name, labels, value)]}}
and raises FormatError naming the line."""
import math
import re

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
LVALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf"^({NAME})(?:\{{((?:{LABEL}={LVALUE})(?:,{LABEL}={LVALUE})*)?\}})? (\S+)$")
PAIR = re.compile(rf"({LABEL})=({LVALUE})")
HELP = re.compile(rf"^# HELP ({NAME}) ((?:[^\\\n]|\\[\\n])*)$")
TYPE = re.compile(rf"^# TYPE ({NAME}) (counter|gauge|summary|histogram|untyped)$")
TYPES_WITH_SUFFIXES = {"summary": ("_sum", "_count", ""), "histogram": ("_sum", "_count", "_bucket")}


class FormatError(AssertionError):
    pass


def unescape(v):
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "\\": "\\", '"': '"'}[m.group(1)], v[1:-1])


def parse_value(s, where):
    if s in ("NaN", "+Inf", "-Inf"):
        return float(s.replace("+", ""))
    try:
        v = float(s)
    except ValueError:
        raise FormatError(f"{where}: value '{s}' is not a number")
    if math.isinf(v) or math.isnan(v):
        raise FormatError(f"{where}: spell infinities and NaN as +Inf, -Inf, NaN")
    return v


def parse(text):
    if not text.endswith("\n"):
        raise FormatError("the body does not end with a newline")
    families = {}
    current = None
    seen = set()
    for n, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {n} '{line[:120]}'"
        if line == "":
            raise FormatError(f"{where}: blank line")
        if line.startswith("#"):
            m = HELP.match(line)
            if m:
                name = m.group(1)
                if name in families:
                    raise FormatError(f"{where}: second HELP for {name} (families must be contiguous)")
                families[name] = {"help": m.group(2), "type": None, "samples": []}
                current = name
                continue
            m = TYPE.match(line)
            if m:
                name, typ = m.groups()
                if name != current or families[name]["type"] is not None:
                    raise FormatError(f"{where}: TYPE must follow its HELP, once")
                if families[name]["samples"]:
                    raise FormatError(f"{where}: TYPE after samples")
                if typ == "counter" and not name.endswith("_total"):
                    raise FormatError(f"{where}: counter {name} does not end in _total")
                if typ != "counter" and name.endswith("_total"):
                    raise FormatError(f"{where}: {typ} {name} ends in _total")
                families[name]["type"] = typ
                continue
            raise FormatError(f"{where}: a comment that is neither HELP nor TYPE")
        m = SAMPLE.match(line)
        if not m:
            raise FormatError(f"{where}: not a sample line name{{labels}} value")
        name, labels_text, value = m.groups()
        if current is None or families[current]["type"] is None:
            raise FormatError(f"{where}: sample before its family's HELP and TYPE")
        fam = families[current]
        if not any(name == current + s for s in TYPES_WITH_SUFFIXES.get(fam["type"], ("",))):
            raise FormatError(f"{where}: sample {name} inside family {current}")
        labels = {}
        if labels_text:
            consumed = 0
            for pm in PAIR.finditer(labels_text):
                k, v = pm.groups()
                if k.startswith("__"):
                    raise FormatError(f"{where}: reserved label name {k}")
                if k in labels:
                    raise FormatError(f"{where}: label {k} twice")
                labels[k] = unescape(v)
                consumed += len(pm.group(0)) + 1
            if consumed - 1 != len(labels_text):
                raise FormatError(f"{where}: malformed labels")
        key = (name, tuple(sorted(labels.items())))
        if key in seen:
            raise FormatError(f"{where}: duplicate series")
        seen.add(key)
        fam["samples"].append((name, labels, parse_value(value, where)))
    for name, fam in families.items():
        if fam["type"] is None:
            raise FormatError(f"family {name} has HELP but no TYPE")
    return families


def value(families, name, **labels):
    """The value of the one sample of `name` whose labels include `labels`."""
    family = name
    if family not in families:
        for suffix in ("_sum", "_count", "_bucket"):
            if name.endswith(suffix) and name[: -len(suffix)] in families:
                family = name[: -len(suffix)]
    fam = families[family]
    hits = [v for n, l, v in fam["samples"] if n == name and all(l.get(k) == x for k, x in labels.items())]
    if len(hits) != 1:
        raise AssertionError(f"{name}{labels}: {len(hits)} samples, expected 1")
    return hits[0]
