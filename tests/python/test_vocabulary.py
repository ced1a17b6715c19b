"""One vocabulary: the wire's enums (schema/lockstep.fbs) and the packed row layout are
defined once, in the schema and C++, and the Python package uses what lockstep._core
exports instead of restating them."""
import pathlib
import re

import torch

from lockstep import _config, _core, _recorder, _torch_stats

SCHEMA = pathlib.Path(__file__).resolve().parents[2] / "schema" / "lockstep.fbs"
PACKED_ROWS_H = (pathlib.Path(__file__).resolve().parents[2] / "agent" / "include" / "lockstep"
                 / "agent" / "packed_rows.h")


def schema_enum(name):
    """{member: value} of `enum <name>` in the schema (explicit values, as written)."""
    text = SCHEMA.read_text()
    body = re.search(r"enum %s\s*:\s*\w+\s*\{([^}]*)\}" % name, text).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    members = {}
    for item in body.split(","):
        if item.strip():
            member, value = (part.strip() for part in item.split("="))
            members[member] = int(value)
    return members


def snake(name):
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def test_kinds_roles_and_flags_are_the_schemas():
    kinds = {snake(m): v for m, v in schema_enum("TensorKind").items()}
    assert kinds["act_grad"] == 1 and kinds["act_in"] == 7 and kinds["grad_reduced"] == 8
    assert len(kinds) == 9
    assert _core.KINDS == kinds
    assert _recorder.KIND == kinds
    roles = {snake(m): v for m, v in schema_enum("Role").items() if m != "Unknown"}
    assert _core.ROLES == roles
    assert _config.ROLES == ("baseline", "candidate", "solo") == tuple(roles)
    assert _core.STAT_FLAGS == {"repeat": schema_enum("StatFlags")["kRepeat"]}
    assert _core.STAT_REPEAT == 1


def test_dtypes_cover_every_wire_dtype_with_its_value():
    wire = schema_enum("DType")
    torch_names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
                   "I8": "int8", "U8": "uint8", "I16": "int16", "I32": "int32",
                   "I64": "int64", "Bool": "bool", "F8E4M3": "float8_e4m3fn",
                   "F8E5M2": "float8_e5m2"}
    assert set(wire) - {"Unknown"} == set(torch_names)
    assert _core.DTYPES == {torch_names[m]: v for m, v in wire.items() if m != "Unknown"}
    codes = _recorder.DTYPE_CODES
    assert codes[torch.float32] == wire["F32"] and codes[torch.bfloat16] == wire["BF16"]
    assert _torch_stats.limits(torch.bfloat16)[0] == wire["BF16"]
    assert _torch_stats.limits(torch.float32)[0] == wire["F16"]


def test_packed_row_layout_is_the_one_in_packed_rows_h():
    text = PACKED_ROWS_H.read_text()
    names = re.search(r"kPackedColumnNames\[kPackedFixed\] = \{([^}]*)\}", text).group(1)
    fields = tuple(re.findall(r'"(\w+)"', names))
    assert fields[0] == "numel" and fields[-1] == "limit_dtype"
    assert _core.PACKED_FIXED_FIELDS == fields
    assert _core.PACKED_FIXED_COLUMNS == len(fields)
    assert _torch_stats.FIELDS == fields
    assert _torch_stats.SKETCH_COL == len(fields)
    assert (_torch_stats.DEFAULT_SKETCH_K, _torch_stats.MAX_SKETCH_K, _torch_stats.HIST_BINS) \
        == (_core.DEFAULT_SKETCH_K, _core.MAX_SKETCH_K, _core.HIST_BINS) == (32, 256, 16)


def test_dead_names_are_gone():
    from lockstep import Monitor  # pylint: disable=import-outside-toplevel
    assert not hasattr(_torch_stats, "DTYPE_CODE")
    assert not hasattr(Monitor, "current_step")


def test_the_agents_defaults_come_from_cpp():
    d = _core.AGENT_DEFAULTS
    assert d["queue_capacity"] == 16384 and d["send_buffer_mb"] == 32
    assert d["heartbeat_interval"] == 1.0 and d["endpoint"] == "tcp://127.0.0.1:6200"
    for name, value in d.items():
        assert _config.OPTIONS[name][1] == value, name


def test_the_agents_ranges_come_from_cpp():
    limits = _core.AGENT_LIMITS
    assert limits["queue_capacity"] == (1, 65536)
    assert limits["max_records_per_message"] == (1, 8192)
    for name in ("queue_capacity", "sketch_k"):
        assert _config.OPTIONS[name][2] == limits[name], name
