"""The end of a step and the sampling on the wire, against a real `lockstep collect`:
- every step() sends a StepEnd after the step's statistics and scalars, counting the
  records the agent sent for it; watch() sends the sampling (after the Hello);
- a job run twice under one run id without start_step is the `restart` finding, and
  `lockstep compare` fails on it naming it (the same logs without the restart pass)."""
import json
import subprocess
import time

import torch
from torch import nn

import lockstep
from conftest import fake_monitor, lockstep_bin


def train(run, role, endpoint, steps, every=1, include=None, start_step=None):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    kw = {} if start_step is None else {"start_step": start_step}
    mon = lockstep.Monitor(run=run, role=role, experiment="se", endpoint=endpoint, rank=0,
                           world_size=1, strict=True, **kw)
    mon.watch(m, include=include, every=every)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(steps):
        loss = nn.functional.mse_loss(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mon.step(loss=loss)
    assert mon.close(timeout=5.0)


def test_step_end_follows_each_steps_records_and_the_sampling_follows_watch(collector):
    train("se-wire", "solo", collector.endpoint, 4, every=2, include="^0|^2")
    records = collector.inspect("se-wire")
    types = [r["type"] for r in records]
    assert types[0] == "Hello"
    samp = [r for r in records if r["type"] == "Sampling"]
    assert len(samp) == 1 and types.index("Sampling") < types.index("StepStats"), types
    s = samp[0]["body"]["sampling"]
    assert s["every"] == 2 and s["include"] == "^0|^2" and s["exclude"] == ""
    assert {"act", "act_grad", "param_grad", "loss", "input", "param"} <= set(s["kinds"]), s
    ends = [r for r in records if r["type"] == "StepEnd"]
    assert [e["body"]["step"] for e in ends] == [0, 1, 2, 3], ends
    for e in ends:
        step, at = e["body"]["step"], records.index(e)
        rows = sum(len(r["body"]["stats"]) for r in records
                   if r["type"] == "StepStats" and r["body"]["step"] == step)
        assert e["body"]["records"] == rows, (step, e, rows)
        assert (rows > 0) == (step % 2 == 0), (step, rows)  # every=2: odd steps have none
        assert e["body"]["micro_records"] == ([rows] if rows else [])
        # Every record and the scalars of the step came before its end.
        assert all(records.index(r) < at for r in records
                   if r["type"] in ("StepStats", "StepScalars") and r["body"]["step"] == step)
        # StepEnd came with schema 1.5; the agent writes its own (current) schema on each.
        assert e["schema"] == records[0]["schema"], (e["schema"], records[0]["schema"])
        assert tuple(int(x) for x in e["schema"].split(".")) >= (1, 5), e["schema"]


def test_each_watch_updates_the_sampling_with_every_watchs_patterns_and_kinds():
    mon, fake = fake_monitor()
    kinds = dict(lockstep._core.KINDS)
    a, b = nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.Linear(2, 2))
    mon.watch(a, include="^0", kinds=("act",), every=3)
    assert fake.sampling == dict(every=3, include="^0", exclude="", kinds=[kinds["act"]])
    mon.watch(b, include="^1", exclude="bias", kinds=("param_grad", "init"), every=2)
    assert fake.sampling == dict(every=2, include="(?:^0)|(?:^1)", exclude="bias",
                                 kinds=sorted({kinds["act"], kinds["param_grad"], kinds["param"]}))
    mon.watch(nn.Sequential(nn.Linear(2, 2)))  # no include: every module of it
    assert fake.sampling["include"] == "" and fake.sampling["exclude"] == "bias"
    assert mon.counters()["python_errors"] == 0
    mon.close(timeout=1.0)


def logged(col, run, goodbyes):
    """The run's log once it holds `goodbyes` Goodbyes (each session's last message)."""
    deadline = time.monotonic() + 15
    while True:
        out = subprocess.run([lockstep_bin(), "inspect", col.log_path(run)], capture_output=True,
                             text=True, timeout=30, check=False)
        records = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
        if sum(r["type"] == "Goodbye" for r in records) >= goodbyes:
            return records
        assert time.monotonic() < deadline, "run %s: %d Goodbye(s) not logged" % (run, goodbyes)
        time.sleep(0.05)


def compare(col, base, cand):
    out = subprocess.run([lockstep_bin(), "compare", col.log_path(base), col.log_path(cand)],
                         capture_output=True, text=True, timeout=60, check=False)
    return out.returncode, out.stdout + out.stderr


def test_a_restart_without_start_step_is_a_finding_and_compare_fails_on_it(collector):
    train("se-base", "baseline", collector.endpoint, 6)
    train("se-cand", "candidate", collector.endpoint, 6)
    logged(collector, "se-base", 1)
    logged(collector, "se-cand", 1)
    code, text = compare(collector, "se-base", "se-cand")
    assert code == 0, text  # twins, one session each: no finding
    assert " restarted" not in text, text
    # The candidate's job runs again under its run id, numbering its steps from 0.
    train("se-cand", "candidate", collector.endpoint, 6)
    logged(collector, "se-cand", 2)
    code, text = compare(collector, "se-base", "se-cand")
    assert code == 1, text
    verdict = text.splitlines()[0]
    assert verdict.startswith("verdict: FAIL (exit 1)") and "restart" in verdict, text
    assert "rank 0 restarted" in verdict and "steps 0..5" in verdict and "start_step" in verdict, verdict
    # A resume that passes start_step continues the numbering: no finding.
    train("se-res", "candidate", collector.endpoint, 3)
    train("se-res", "candidate", collector.endpoint, 3, start_step=3)
    records = logged(collector, "se-res", 2)
    assert [r["body"]["step"] for r in records if r["type"] == "StepEnd"] == list(range(6))
    code, text = compare(collector, "se-base", "se-res")
    assert " restarted" not in text, text
