"""`lockstep import msprobe` and compare / report / collect on msprobe's own dumps
(docs/msprobe.md), made here by msprobe's PrecisionDebugger (msprobe_dump.py, the
`msprobe_dumps` fixture), against live lockstep runs of the same model, seed and data
recorded by a real `lockstep collect` (tests/scenarios/scenario_lib.py).

- every level imports and `inspect` reads it: names and kinds as a live run's, the dump's
  own statistics, statistics-only records, steps and ranks (2 ranks over gloo);
- twins (the dump and a live run of the same training) give zero alerts, whatever the
  level; one side's GELU with approximation='tanh' is named at step 0, against a live
  run, between two dumps, and live through `collect --baseline`;
- compare --format msprobe-csv has msprobe's own header (read from its package);
- tensor mode: python -m lockstep import-msprobe computes full rows from the dumped
  tensors (the agent's kernel): bit-identical to a live twin's, sketch and histogram included;
- a folder that is not a dump, a truncated dump.json, a MindSpore dump: one line, exit 3,
  no file.
"""
import csv
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scenarios"))

import msprobe_dump as md  # noqa: E402
import scenario_lib as sl  # noqa: E402  (imports lockstep)

import lockstep  # noqa: E402

STEPS = 2
BIN = sl.lockstep_bin()
pytestmark = pytest.mark.skipif(BIN is None, reason="LOCKSTEP_BIN does not name the built lockstep binary")


def run(*args, check=True):
    out = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def import_dump(root, out, *extra):
    run("import", "msprobe", root, "-o", out, *extra)
    return out


def inspect(path):
    return [json.loads(x) for x in run("inspect", path).stdout.splitlines() if x.strip()]


def rows(path):
    """{(rank, step, kind, name): stat} of a log's StepStats."""
    out = {}
    for rec in inspect(path):
        if rec["type"] == "StepStats":
            for st in rec["body"]["stats"]:
                out[(rec["rank"], rec["body"]["step"], st["kind"], st["name"])] = st
    return out


def compare_json(a, b):
    out = run("compare", "--json", a, b, check=False)
    assert out.returncode in (0, 1), out.stdout + out.stderr
    return out.returncode, json.loads(out.stdout)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Live lockstep runs of msprobe_dump's training (seed 0, rank 0's data), recorded by
    a real collector: {"none": log, "tanh": log} by GELU approximation."""
    tmp = tmp_path_factory.mktemp("live")
    logs = {}
    with sl.Collector(tmp) as col:
        for gelu in ("none", "tanh"):
            model = md.build_model(0, gelu)
            opt = md.make_optimizer(model)
            mon = lockstep.Monitor(run="live-" + gelu, role="candidate", experiment="msprobe-" + gelu,
                                   endpoint=col.endpoint, strict=True)
            mon.watch(model, optimizer=opt)
            for batch in md.batches(STEPS):
                mon.step(loss=md.train_step(model, opt, batch))
            assert sl.close_checked(mon)
            logs[gelu] = col.log_path("live-" + gelu)
        col.wait_goodbye(["live-none", "live-tanh"])
    return logs


def test_levels_import_and_inspect_reads_them(msprobe_dumps, tmp_path):
    # L0: modules only, one process (proc<PID>): rank 0.
    root = msprobe_dumps("statistics", "L0", STEPS)
    log = import_dump(root, str(tmp_path / "l0.lslog"), "--run", "npu-l0", "--role", "candidate")
    r = rows(log)
    assert {s for (_, s, _, _) in r} == {0, 1}
    for kind, name in (("act", "blocks.0.fc1"), ("act_in", "blocks.0.fc1"), ("act_grad", "blocks.0.fc1"),
                       ("param_grad", "blocks.0.fc1.weight"), ("act", "head"), ("param", "embed.weight")):
        assert (0, 1, kind, name) in r, (kind, name)
    st = r[(0, 0, "act", "blocks.1.fc2")]
    assert st["stats_only"] is True and st["std"] is None and st["sketch"] == [] and st["hist"] == []
    (proc,) = os.listdir(os.path.join(root, "step0"))
    dump = json.load(open(os.path.join(root, "step0", proc, "dump.json")))["data"]
    (out,) = dump["Module.blocks.1.fc2.Linear.forward.0"]["output"]
    assert (st["max"], st["min"], st["mean"], st["l2"]) == (out["Max"], out["Min"], out["Mean"], out["Norm"])
    assert st["shape"] == out["shape"] and st["numel"] == md.BATCH * md.SEQ * md.D_MODEL
    summary = [json.loads(x) for x in run("inspect", "--summary", log).stdout.splitlines()]
    assert [(s["run"], s["rank"], s["role"], s["last_step"], s["goodbye"], s["gaps"]) for s in summary] == [
        ("npu-l0", 0, "candidate", 1, True, 0)]

    # mix: the API calls are ops inside their modules, as lockstep's zoom names them.
    r = rows(import_dump(msprobe_dumps("statistics", "mix", STEPS), str(tmp_path / "mix.lslog")))
    for kind, name in (("act", "blocks.0.fc1/linear#0"), ("act_in", "blocks.0.fc1/linear#0(0)"),
                       ("act", "blocks.1/add#0"), ("act", "blocks.0.act/gelu#0"), ("act", "<root>/mse_loss#0"),
                       ("act_grad", "blocks.0.fc1/linear#0"), ("act", "blocks.0.fc1")):
        assert (0, 0, kind, name) in r, (kind, name)
    assert r[(0, 0, "act_in", "blocks.0.fc1")]["order"] < r[(0, 0, "act_in", "blocks.0.fc1/linear#0(0)")]["order"] \
        < r[(0, 0, "act", "blocks.0.fc1/linear#0")]["order"] < r[(0, 0, "act", "blocks.0.fc1")]["order"]

    # L1 on 2 ranks (gloo): APIs only, numbered in the step under <root>; each rank its data.
    r = rows(import_dump(msprobe_dumps("statistics", "L1", STEPS, ranks=2), str(tmp_path / "l1.lslog")))
    assert {(rank, s) for (rank, s, _, _) in r} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert not any("/" not in name for (_, _, kind, name) in r if kind == "act")
    a0, a1 = r[(0, 0, "act", "<root>/linear#0")], r[(1, 0, "act", "<root>/linear#0")]
    assert a0["l2"] != a1["l2"]
    assert (0, 0, "act", "<root>/all_reduce#0") in r


def test_twins_give_no_alerts(msprobe_dumps, live, tmp_path):
    for level in ("L0", "mix"):
        log = import_dump(msprobe_dumps("statistics", level, STEPS), str(tmp_path / (level + ".lslog")))
        code, rep = compare_json(log, live["none"])
        assert code == 0, rep["verdict"]
        assert rep["alerts"] == [] and rep["first_divergence"] is None, rep["alerts"]
        assert rep["statistics_only"] is True
        assert rep["steps_compared"] == STEPS
        by = {(t["name"], t["kind"]): t for t in rep["tensors"]}
        for key in (("blocks.0.fc1", "act"), ("blocks.0.fc1", "act_in"), ("blocks.1.act", "act_grad"),
                    ("head.weight", "param_grad")):
            assert by[key]["status"] == "ok" and by[key]["steps"] == STEPS, (key, by.get(key))
            assert by[key]["rel_err_std"] is None and by[key]["cosine"] is None  # not judged: not in the dump
    text = run("compare", log, live["none"]).stdout
    assert text.count("note: statistics only") == 1


def test_a_changed_gelu_is_named_at_step_0(msprobe_dumps, live, tmp_path):
    # A dump (exact GELU) against a live run whose GELUs are tanh; the dump's folder given
    # to compare directly.
    root = msprobe_dumps("statistics", "L0", STEPS)
    code, rep = compare_json(root, live["tanh"])
    fd = rep["first_divergence"]
    assert fd is not None and (fd["tensor"], fd["kind"], fd["step"]) == ("blocks.0.act", "act", 0), fd
    # Two dumps (the candidate's made with tanh): compare and report on the folders.
    tanh = msprobe_dumps("statistics", "L0", STEPS, gelu="tanh")
    code, rep = compare_json(root, tanh)
    fd = rep["first_divergence"]
    assert (fd["tensor"], fd["step"]) == ("blocks.0.act", 0), fd
    assert rep["baseline"] != rep["candidate"]
    page = str(tmp_path / "r.html")
    run("report", root, tanh, "-o", page)
    html = open(page).read()
    assert "blocks.0.act" in html and html.count("statistics only: a run is an import") == 1


def test_collect_with_an_imported_baseline(msprobe_dumps, tmp_path):
    """A live candidate against an imported dump as the recorded baseline: the first
    divergence is found live, as for any recorded run."""
    base = import_dump(msprobe_dumps("statistics", "L0", STEPS), str(tmp_path / "gpu.lslog"),
                       "--experiment", "mig", "--run", "gpu-dump")
    with sl.Collector(tmp_path, ["--baseline", base]) as col:
        model = md.build_model(0, "tanh")
        opt = md.make_optimizer(model)
        mon = lockstep.Monitor(run="npu-live", role="candidate", experiment="mig", endpoint=col.endpoint,
                               strict=True)
        mon.watch(model, optimizer=opt)
        for batch in md.batches(STEPS):
            mon.step(loss=md.train_step(model, opt, batch))
        assert sl.close_checked(mon)
        col.wait_goodbye(["npu-live"])
    alerts = [a for a in col.alerts() if a["rule"] == "first_divergence"]
    assert alerts, col.alerts()
    assert (alerts[0]["tensor"], alerts[0]["step"], alerts[0]["runs"]) == ("blocks.0.act", 0, ["gpu-dump", "npu-live"])


def test_tensor_mode_full_rows_compare_element_wise(msprobe_dumps, live, tmp_path):
    """python -m lockstep import-msprobe: rows computed from the dumped tensors by the
    agent's kernel, so the import compares against a live run with sketch and histogram:
    the twin's rows are bit-identical, the tanh run's GELU is named at step 0."""
    root = msprobe_dumps("tensor", "L0", STEPS)
    log = str(tmp_path / "tensor.lslog")
    out = subprocess.run([sys.executable, "-m", "lockstep", "import-msprobe", root, "-o", log, "--run", "npu-t"],
                         capture_output=True, text=True, timeout=240, env=dict(os.environ, LOCKSTEP_BIN=BIN))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "full rows from the tensors" in out.stdout, out.stdout
    r = rows(log)
    st = r[(0, 0, "act", "blocks.1.fc2")]
    assert "stats_only" not in st and st["std"] is not None
    assert len(st["sketch"]) == 32 and len(st["hist"]) == 16 and sum(st["hist"]) == st["numel"]
    code, rep = compare_json(log, live["none"])
    assert code == 0 and rep["alerts"] == [] and rep["statistics_only"] is False, rep["alerts"]
    by = {(t["name"], t["kind"]): t for t in rep["tensors"]}
    for key in (("blocks.0.fc1", "act"), ("blocks.1.act", "act_grad"), ("head.weight", "param_grad")):
        assert by[key]["rel_dist"] == 0 and by[key]["cosine"] == 1, (key, by[key])
    code, rep = compare_json(log, live["tanh"])
    fd = rep["first_divergence"]
    assert (fd["tensor"], fd["kind"], fd["step"]) == ("blocks.0.act", "act", 0), fd
    gelu = next(t for t in rep["tensors"] if (t["name"], t["kind"]) == ("blocks.0.act", "act"))
    assert gelu["cosine"] is not None and gelu["cosine"] < 1


def test_msprobe_csv_has_msprobes_own_header(msprobe_dumps, live):
    header = json.loads(subprocess.run(
        [sys.executable, "-c", "import json; from msprobe.core.common.const import CompareConst as C; "
                               "print(json.dumps(C.SUMMARY_COMPARE_RESULT_HEADER))"],
        capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()[-1])
    out = run("compare", "--format", "msprobe-csv", msprobe_dumps("statistics", "L0", STEPS), live["tanh"],
              check=False)
    assert out.returncode in (0, 1), out.stderr
    table = list(csv.reader(io.StringIO(out.stdout)))
    assert table[0][:len(header)] == header
    assert table[0][len(header):][:4] == ["kind", "order", "step", "rank"]
    col = {name: i for i, name in enumerate(table[0])}
    row = next(r for r in table[1:] if r[col["NPU Name"]] == "blocks.0.act:act")
    assert row[col["NPU Tensor Shape"]] == "[%d, %d, %d]" % (md.BATCH, md.SEQ, 2 * md.D_MODEL)
    assert row[col["Result"]] == "Warning" and row[col["statistics_only"]] == "true"
    npu, bench = float(row[col["NPU l2norm"]]), float(row[col["Bench l2norm"]])
    assert float(row[col["L2norm diff"]]) == pytest.approx(npu - bench, rel=1e-9)
    assert row[col["NormRelativeErr"]].endswith("%")
    ok = next(r for r in table[1:] if r[col["NPU Name"]] == "embed:act")
    assert ok[col["Result"]] == "pass" and ok[col["Err_message"]] == ""


def test_errors_are_one_line_and_leave_no_file(msprobe_dumps, tmp_path):
    out_log = str(tmp_path / "out.lslog")

    def fails(folder, want):
        r = run("import", "msprobe", folder, "-o", out_log, check=False)
        assert r.returncode == 3, r.stdout + r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and want in lines[0], r.stderr
        assert not [f for f in os.listdir(str(tmp_path)) if f.startswith("out.lslog")]
        return lines[0]

    os.makedirs(str(tmp_path / "empty"))
    fails(str(tmp_path / "empty"), "empty: not an msprobe dump")
    copy = str(tmp_path / "copy")
    shutil.copytree(msprobe_dumps("statistics", "L0", STEPS), copy)
    (proc,) = os.listdir(os.path.join(copy, "step1"))
    dump_json = os.path.join(copy, "step1", proc, "dump.json")
    text = open(dump_json).read()
    with open(dump_json, "w") as f:
        f.write(text[:len(text) // 2])
    fails(copy, dump_json + ": truncated at byte")
    with open(dump_json, "w") as f:
        f.write(text.replace('"framework": "pytorch"', '"framework": "mindspore"'))
    fails(copy, dump_json + ': a MindSpore dump (framework "mindspore"): not supported yet')
    # compare on a broken dump says the same, exit 3
    r = run("compare", copy, copy, check=False)
    assert r.returncode == 3 and "not supported yet" in r.stderr
