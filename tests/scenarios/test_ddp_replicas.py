"""The replica check (issue 28 item 4; docs/python.md "The replica check", docs/rules.md
"replicas"): a real 2-rank DistributedDataParallel job (gloo on CPU, torch >= 2.0 for the
optimizer's pre-step hook) into a real `lockstep collect`.

Three runs train side by side in each process, each its own DDP model, with
replica_check_every=5: the baseline, clean, and a candidate whose rank 1 has one bit of
one element of `2.weight`'s gradient flipped at step FLIP_AT, after the all-reduce and
before lockstep reads it (an optimizer pre-step hook the job registers before watch():
torch runs pre-step hooks in the order they were registered), as a rank whose reduction
went wrong would hold it. Asserted: grad_reduced records every 5th step on both ranks
(and only those), no replicas alert for the baseline, and for the candidate exactly one,
critical, naming `2.weight`, rank 1 and step FLIP_AT, live and in `lockstep compare` of
the same logs (the bit flipped is one the statistics cannot round away). A third run (solo) takes the batched device path on the CPU
(Monitor(_force_device_path=True): its records say StatFlags.kDevice) and gets one
element of `0.bias`'s gradient set far past its range on rank 1: judged on what the
device path repeats bit for bit, the alert names `max`. A fourth (solo), with the
candidate's flip, leaves the check to LOCKSTEP_REPLICA_CHECK_EVERY=0: no grad_reduced
record, no alert."""
import collections
import json
import subprocess

import pytest
import torch
from torch import nn

import lockstep
from scenario_lib import collect_ranks, fmt_alerts, run_of

pytestmark = pytest.mark.skipif(not hasattr(torch.optim.Optimizer, "register_step_pre_hook"),
                                reason="the replica check needs torch >= 2.0 (optimizer pre-step hooks)")

WORLD = 2
STEPS = 16
EVERY = 5
FLIP_AT = 10
FLIP_RANK = 1
FLIP_PARAM = "2.weight"  # in the DDP model: module.2.weight
RUNS = (("rep-base", "baseline"), ("rep-cand", "candidate"), ("rep-dev", "solo"), ("rep-off", "solo"))


def _worker(rank, endpoint):
    """One rank: the two runs trained side by side (scenario_lib.collect_ranks)."""
    runs = []
    for run, role in RUNS:
        torch.manual_seed(0)  # the same weights in both runs and on both ranks
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        steps = [0]
        if run in ("rep-cand", "rep-off") and rank == FLIP_RANK:
            def corrupt(_opt, _args, _kwargs, steps=steps, model=model):
                if steps[0] == FLIP_AT:
                    g = model[2].weight.grad
                    # One bit of one element: the 14th of its mantissa (2^13 ulps, ~1e-4
                    # of the value). One ulp can round away in the kernel's float partial
                    # sums (it does on the AVX2 kernel here: docs/python.md "The replica
                    # check"), and then no statistic differs.
                    g.view(torch.int32).view(-1)[5] ^= 1 << 13
            opt.register_step_pre_hook(corrupt)
        if run == "rep-dev" and rank == FLIP_RANK:
            def overflow(_opt, _args, _kwargs, steps=steps, model=model):
                if steps[0] == FLIP_AT:
                    model[0].bias.grad[3] = 1e3
            opt.register_step_pre_hook(overflow)
        # rep-off: the environment's 0 (the argument wins where given).
        every = {} if run == "rep-off" else {"replica_check_every": EVERY}
        mon = lockstep.Monitor(run=run, role=role, experiment="rep", endpoint=endpoint,
                               host_stats_thread="off", strict=True,
                               _force_device_path=run == "rep-dev", **every)
        assert mon.enabled and mon.rank == rank, (mon.rank, rank)
        mon.watch(ddp, optimizer=opt)
        runs.append((ddp, opt, mon, steps))
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(4, 8, generator=g)
        y = torch.randn(4, 4, generator=g)
        for ddp, opt, mon, steps in runs:
            steps[0] = step
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss=loss)
    for _, _, mon, _ in runs:
        assert mon.close(10.0)
        assert mon.counters()["python_errors"] == 0, mon.counters()["last_python_error"]


def _reduced_records(col, run):
    """{(rank, step): {(name, device flag)}} of the run's grad_reduced records, from
    `lockstep inspect`."""
    out = subprocess.run([col.exe, "inspect", col.log_path(run)], capture_output=True, text=True,
                         timeout=60, check=True)
    found = collections.defaultdict(set)
    for line in out.stdout.splitlines():
        msg = json.loads(line)
        if msg["type"] != "StepStats":
            continue
        for s in msg["body"]["stats"]:
            if s["kind"] == "grad_reduced":
                found[(msg["rank"], msg["body"]["step"])].add((s["name"], s.get("device", False)))
    return found


def _sampled_kinds(col, run):
    """{rank: kinds of the rank's last Sampling message}, from `lockstep inspect`."""
    out = subprocess.run([col.exe, "inspect", col.log_path(run)], capture_output=True, text=True,
                         timeout=60, check=True)
    kinds = {}
    for line in out.stdout.splitlines():
        msg = json.loads(line)
        if msg["type"] == "Sampling":
            kinds[msg["rank"]] = set(msg["body"]["sampling"]["kinds"])
    return kinds


def _identity(a):
    return (a["rule"], a["severity"], run_of(a), a["step"], a["rank"], a["tensor"], a["kind"],
            a.get("metric"))


def test_ddp_replica_check(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_REPLICA_CHECK_EVERY", "0")  # inherited by the spawned ranks
    alerts, col = collect_ranks(tmp_path, monkeypatch, WORLD, _worker, [run for run, _ in RUNS])
    replicas = [a for a in alerts if a["rule"] == "replicas"]

    # Records: every 5th step, on both ranks, every watched parameter (DDP's names).
    params = {"module.0.weight", "module.0.bias", "module.2.weight", "module.2.bias"}
    assert _reduced_records(col, "rep-off") == {}
    # The wire's Sampling says what each rank records: the check's kind too, where it runs.
    for run, listed in (("rep-base", True), ("rep-off", False)):
        kinds = _sampled_kinds(col, run)
        assert set(kinds) == set(range(WORLD)), (run, kinds)
        assert all(("grad_reduced" in k) == listed and "param_grad" in k for k in kinds.values()), \
            (run, kinds)
    for run, _ in RUNS[:3]:
        found = _reduced_records(col, run)
        want = {(r, s) for r in range(WORLD) for s in range(0, STEPS, EVERY)}
        assert set(found) == want, (run, sorted(found))
        device = run == "rep-dev"
        assert all(names == {(p, device) for p in params} for names in found.values()), (run, found)

    # The clean run: nothing. The corrupted one: one alert, at the step, rank and parameter.
    assert [a for a in replicas if run_of(a) == "rep-base"] == [], fmt_alerts(replicas)
    cand = [a for a in replicas if run_of(a) == "rep-cand"]
    assert len(cand) == 1, fmt_alerts(replicas)
    a = cand[0]
    assert (a["severity"], a["step"], a["rank"], a["tensor"], a["kind"]) == \
        ("critical", FLIP_AT, FLIP_RANK, FLIP_PARAM, "grad_reduced"), fmt_alerts(cand)
    assert "on rank 1 differs from rank 0" in a["message"], a["message"]
    assert a["incident"] == "replicas/rep/rep-cand", a
    dev = [a for a in replicas if run_of(a) == "rep-dev"]
    assert len(dev) == 1, fmt_alerts(replicas)
    assert (dev[0]["step"], dev[0]["rank"], dev[0]["tensor"], dev[0]["metric"]) == \
        (FLIP_AT, FLIP_RANK, "0.bias", "max"), fmt_alerts(dev)
    assert [a for a in replicas if run_of(a) == "rep-off"] == [], fmt_alerts(replicas)
    # No other rule mistakes the check's rows for anything: no alert names the kind.
    assert [x for x in alerts if x["kind"] == "grad_reduced" and x["rule"] != "replicas"] == [], \
        fmt_alerts(alerts)

    # Offline, the same logs: the same replicas alert (compare names the experiment
    # "compare"), and no row of the check in the cross-run table.
    out = subprocess.run([col.exe, "compare", "--json", col.log_path("rep-base"), col.log_path("rep-cand")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 1), out.stdout + out.stderr
    rep = json.loads(out.stdout)
    offline = [x for x in rep["alerts"] if x["rule"] == "replicas"]
    live = [x for x in replicas if run_of(x) in ("rep-base", "rep-cand")]
    assert collections.Counter(map(_identity, offline)) == collections.Counter(map(_identity, live)), \
        (fmt_alerts(offline), fmt_alerts(live))
    assert [t for t in rep["tensors"] if t["kind"] == "grad_reduced"] == [], rep["tensors"]
    text = subprocess.run([col.exe, "compare", col.log_path("rep-base"), col.log_path("rep-cand")],
                          capture_output=True, text=True, timeout=60)
    assert "replicas" in text.stdout and FLIP_PARAM in text.stdout, text.stdout
