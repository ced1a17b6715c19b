"""`lockstep compare` over logs of real training runs, as a CI gate (issue 16).

One real collector with a non-default tolerance (--tol-fp32 1e-5) records a baseline,
a candidate whose block 1 switches GELU to its tanh approximation at step ONSET (a
~2e-4 relative change: a divergence at 1e-5, none at the default 1e-3) and an unrelated
model. Then the real CLI:
- reproduces the live first divergence from the settings recorded next to the logs,
  prints them, and lets a flag or --default-settings override them;
- puts its verdict first and exits 3 for a log with flipped bytes or a cut tail, 5 for a
  log with steps left out, 6 for two unrelated models, 2 for two recordings of one run id
  unless one is renamed.
"""
import json
import os
import shutil
import subprocess

import torch
from torch import nn

import lockstep
from scenario_lib import Collector, fmt_alerts, make_pair, train_pair

ONSET = 7
STEPS = 12
# lockstep/common/exit_codes.h
EXIT_FINDING, EXIT_USAGE, EXIT_BAD_INPUT, EXIT_TOO_FEW_STEPS, EXIT_NOT_SAME_MODEL = 1, 2, 3, 5, 6


def compare(col, *args):
    return subprocess.run([col.exe, "compare", *args], capture_output=True, text=True, timeout=60)


def train_unrelated(endpoint, steps):
    """A small MLP with its own names, recorded as a solo run."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon = lockstep.Monitor(run="mlp", role="solo", experiment="mlp", endpoint=endpoint, strict=True)
    mon.watch(model, optimizer=opt)
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.step(loss=loss)
    assert mon.close(timeout=10.0)


def test_compare_reproduces_the_live_answer_and_gates(tmp_path):
    # Plain records (format 1, --log-compression none): the copy with holes below is made
    # record by record at the byte offsets `inspect` gives, and compare reads format 1 too.
    with Collector(tmp_path, ["--tol-fp32", "1e-5", "--log-compression", "none"]) as col:
        b, c = make_pair(col.endpoint, "gate")

        def switch(s):
            if s == ONSET:
                c.model.encoder.layers[1].activation.approximate = "tanh"

        train_pair(b, c, STEPS, before_candidate_step=switch)
        assert b.close() and c.close()
        train_unrelated(col.endpoint, STEPS)
        col.wait_goodbye(["gate-base", "gate-cand", "mlp"])
    alerts = col.alerts()
    live = [a for a in alerts if a["rule"] == "first_divergence"]
    assert len(live) == 1, fmt_alerts(alerts)
    live = live[0]
    assert (live["step"], live["tensor"]) == (ONSET, "encoder.layers.1.activation"), fmt_alerts(alerts)

    base, cand = col.log_path("gate-base"), col.log_path("gate-cand")
    settings = cand[:-len(".lslog")] + ".settings.toml"
    with open(settings, encoding="utf-8") as f:
        text = f.read()
    assert "tol-fp32 = 1e-05" in text and "lockstep_version" in text, text

    # The recorded settings reproduce the live answer, and the header says so.
    out = compare(col, base, cand)
    assert out.returncode == EXIT_FINDING, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("verdict: FAIL (exit 1): a critical finding between gate-base and gate-cand"), out.stdout
    # the producer, with the container that passes its output on as an alias
    assert lines[1].startswith("  first divergence (critical): encoder.layers.1.activation "), out.stdout
    assert "(act, order" in lines[1], out.stdout
    assert ("at step %d rank 0" % ONSET) in lines[1], out.stdout
    assert lines[2] == "  first NaN/Inf: none", out.stdout
    assert lines[3].startswith("  loss at the last compared step: "), out.stdout
    assert lines[4].startswith("  steps compared: %d of %d expected (100 %%)" % (STEPS, STEPS)), out.stdout
    assert "settings: recorded by lockstep" in out.stdout and settings in out.stdout, out.stdout
    assert "tol-fp32=1e-05 (recorded)" in out.stdout, out.stdout
    rep = json.loads(compare(col, "--json", base, cand).stdout)
    fd = rep["first_divergence"]
    assert (fd["step"], fd["tensor"], fd["kind"]) == (live["step"], live["tensor"], live["kind"])
    assert rep["verdict"]["exit"] == EXIT_FINDING and rep["settings"]["rules"]["tol-fp32"] == "1e-05"

    # Overridden: at the default tolerance the change is within it, with a flag or by
    # ignoring the file.
    for args in (["--tol-fp32", "1e-3"], ["--default-settings"]):
        out = compare(col, *args, base, cand)
        assert out.returncode == 0, (args, out.stdout + out.stderr)
        assert out.stdout.startswith("verdict: PASS: gate-base and gate-cand agree within their tolerances"), out.stdout
        # ... and still named where it is born, as a warning (issue 14): no exit 1.
        assert "  first divergence (warning): encoder.layers.1.activation " in out.stdout, out.stdout
    assert "tol-fp32=0.001 (flag)" in compare(col, "--tol-fp32", "1e-3", base, cand).stdout

    # 192 flipped bytes in a copy of the candidate: exit 3, named first.
    data = open(cand, "rb").read()
    flipped = bytearray(data)
    mid = len(data) // 2
    for i in range(192):
        flipped[mid + i] ^= 0xA5
    bad = str(tmp_path / "flipped.lslog")
    open(bad, "wb").write(bytes(flipped))
    out = compare(col, base, bad)
    assert out.returncode == EXIT_BAD_INPUT, out.stdout + out.stderr
    assert out.stdout.startswith("verdict: FAIL (exit 3): the candidate log '%s' is corrupt" % bad), out.stdout
    assert "expected steps were compared" in out.stdout.splitlines()[0], out.stdout

    # A copy cut inside its last record: exit 3 as truncated.
    cut = str(tmp_path / "cut.lslog")
    open(cut, "wb").write(data[:-5])
    out = compare(col, base, cut)
    assert out.returncode == EXIT_BAD_INPUT, out.stdout + out.stderr
    assert "is truncated" in out.stdout.splitlines()[0], out.stdout

    # A copy of the candidate without steps 4..6 (records copied byte for byte, so the
    # log is intact): 9 of 12 steps compared, under 90 %: exit 5.
    holes = str(tmp_path / "holes.lslog")
    with open(holes, "wb") as f:
        f.write(data[:16])  # the file header
        for line in subprocess.run([col.exe, "inspect", cand], capture_output=True, text=True,
                                   check=True).stdout.splitlines():
            r = json.loads(line)
            if r["type"] in ("StepStats", "StepScalars") and 4 <= r["body"]["step"] <= 6:
                continue
            f.write(data[r["offset"]:r["offset"] + 16 + r["bytes"]])
    out = compare(col, base, holes)
    assert out.returncode == EXIT_TOO_FEW_STEPS, out.stdout + out.stderr
    assert out.stdout.startswith("verdict: FAIL (exit 5): only 9 of 12 expected steps were compared (75 %, "
                                 "under 90 %)"), out.stdout

    # Two unrelated models: exit 6, not a "critical first divergence".
    out = compare(col, base, col.log_path("mlp"))
    assert out.returncode == EXIT_NOT_SAME_MODEL, out.stdout + out.stderr
    assert out.stdout.startswith("verdict: FAIL (exit 6): these do not look like the same model: they share "), \
        out.stdout

    # Two recordings of one run id: refused with the way out, which works.
    other_dir = tmp_path / "rerun"
    other_dir.mkdir()
    again = str(other_dir / "gate-cand.lslog")
    shutil.copyfile(cand, again)
    out = compare(col, cand, again)
    assert out.returncode == EXIT_USAGE and "--rename-baseline" in out.stderr, out.stdout + out.stderr
    out = compare(col, "--rename-baseline", "gate-cand-first", cand, again)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("verdict: PASS: gate-cand-first and gate-cand agree"), out.stdout
    assert os.path.exists(settings)
