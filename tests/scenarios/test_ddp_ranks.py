"""Many ranks end to end (issue 20): real DistributedDataParallel jobs, gloo on CPU, 4
ranks per run (torch.multiprocessing spawn), into a real `lockstep collect`.

Four runs of one experiment train side by side in each of the 4 processes (each its own
DDP model, stepped in the same order on every rank): the baseline, a twin, a candidate
whose rank 2 is fed other data at the last step (only there: from the next step on, the
all-reduced update moves every rank), and a candidate whose first layer computes
differently from step 3 on every rank. Asserted: the twin raises no alert; the data
candidate's alerts name rank 2 (the other ranks see only the all-reduced gradients);
the layer candidate's first divergence names the layer with its module type and a rank,
and `lockstep compare` says it parts on all 4 ranks, in "6 steps × 4 ranks"."""
import json
import subprocess

import torch
from torch import nn

import lockstep
from scenario_lib import collect_ranks, fmt_alerts, run_of

WORLD = 4
STEPS = 6
CHANGE_AT = 3
DATA_AT = STEPS - 1
DATA_RANK = 2
RUNS = (("ddp-base", "baseline"), ("ddp-twin", "candidate"), ("ddp-data", "candidate"),
        ("ddp-layer", "candidate"))


class Linear(nn.Linear):
    """nn.Linear whose output is off by 5 % once `broken` (a kernel computing differently);
    named Linear so the messages say "0 (Linear)"."""
    broken = False

    def forward(self, x):
        y = super().forward(x)
        return y * 1.05 if self.broken else y


def _worker(rank, endpoint):
    """One rank (in its gloo group, scenario_lib.collect_ranks): the four runs trained side
    by side."""
    runs = []
    for run, role in RUNS:
        torch.manual_seed(0)  # the same weights in every run and on every rank
        model = nn.Sequential(Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        mon = lockstep.Monitor(run=run, role=role, experiment="ddp", endpoint=endpoint,
                               host_stats_thread="off", strict=True)
        assert mon.enabled and mon.rank == rank, (mon.rank, rank)
        mon.watch(ddp, optimizer=opt)
        runs.append((run, model, ddp, opt, mon))
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(4, 8, generator=g)
        y = torch.randn(4, 4, generator=g)
        for run, model, ddp, opt, mon in runs:
            xi = x
            if run == "ddp-data" and rank == DATA_RANK and step == DATA_AT:
                xi = x * 1.5
            model[0].broken = run == "ddp-layer" and step >= CHANGE_AT
            loss = nn.functional.mse_loss(ddp(xi), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss=loss)
    for *_, mon in runs:
        assert mon.close(10.0)


def _compare(col, cand):
    out = subprocess.run([col.exe, "compare", col.log_path("ddp-base"), col.log_path(cand)],
                         capture_output=True, text=True, timeout=60)
    js = subprocess.run([col.exe, "compare", "--json", col.log_path("ddp-base"), col.log_path(cand)],
                        capture_output=True, text=True, timeout=60)
    return out, json.loads(js.stdout)


def test_ddp_four_ranks(tmp_path, monkeypatch):
    alerts, col = collect_ranks(tmp_path, monkeypatch, WORLD, _worker, [run for run, _ in RUNS])
    by_run = {}
    for a in alerts:
        by_run.setdefault(run_of(a), []).append(a)
    # Twins: nothing at all, on any rank.
    assert "ddp-twin" not in by_run, fmt_alerts(by_run["ddp-twin"])
    assert "ddp-base" not in by_run, fmt_alerts(by_run["ddp-base"])

    # One rank's data: the forward tensors drift on rank 2 only (every rank's gradients
    # drift too, after the all-reduce).
    data = by_run.get("ddp-data", [])
    forward = [a for a in data if a["kind"] in ("input", "act")]
    assert forward, fmt_alerts(data)
    assert {a["rank"] for a in forward} == {DATA_RANK}, fmt_alerts(forward)
    assert {a["step"] for a in data} == {DATA_AT}, fmt_alerts(data)
    # Ids never repeat, across ranks included.
    assert len({a["id"] for a in alerts}) == len(alerts), fmt_alerts(alerts)

    # One layer: the first divergence is layer 0 at step 3, named with its type and rank.
    layer = by_run.get("ddp-layer", [])
    first = [a for a in layer if a["rule"] == "first_divergence"]
    assert len(first) == 1, fmt_alerts(layer)
    f = first[0]
    assert (f["tensor"], f["kind"], f["step"]) == ("0", "act", CHANGE_AT), fmt_alerts(first)
    # Every rank parts there: the live alert says so, as `compare` does (held until every
    # rank was compared at that step), and carries the lowest rank.
    assert "0 (Linear)" in f["message"] and "at step %d on all %d ranks" % (CHANGE_AT, WORLD) in f["message"], \
        f["message"]
    assert f["rank"] == 0, f
    assert f["micro_step"] == 0

    # Offline, the same logs: ranks shown.
    out, rep = _compare(col, "ddp-twin")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "%d steps × %d ranks" % (STEPS, WORLD) in out.stdout, out.stdout
    assert rep["ranks"] == WORLD and rep["steps_compared"] == STEPS * WORLD, rep["steps_compared"]

    out, rep = _compare(col, "ddp-layer")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "at step %d on all %d ranks" % (CHANGE_AT, WORLD) in out.stdout, out.stdout
    assert "FIRST DIVERGENCE (critical): step %d on all %d ranks: 0 act" % (CHANGE_AT, WORLD) in out.stdout, \
        out.stdout
    assert "0 (Linear)" in out.stdout, out.stdout

    out, rep = _compare(col, "ddp-data")
    rows = [t for t in rep["tensors"] if t["kind"] in ("input", "act") and t["status"] != "ok"]
    assert rows and {t["rank"] for t in rows} == {DATA_RANK}, rows
    assert "on all %d ranks" % WORLD not in out.stdout, out.stdout
