"""Sampling that follows the runs' state (issue 28 item 3; docs/rules.md "Sampling that
follows the runs' state"): `lockstep collect --sample-quiet 5` asks both runs of a pair,
once both are live agents of it, to record tensors every 5th step while they agree, and
every step again from the moment the pair's drift or incident opens.

- Twins: after the switch only the steps divisible by 5 have tensors, the same steps in
  both logs (the wire's Sampling says every 5); scalars stay every step.
- A candidate whose encoder.layers.1.linear2 output changes from step CHANGE: the first
  divergence is named at the first sampled step at or after the change, in that op; the
  collector then asks both runs for every step (within a few steps), and every 5th step
  again once the incident has been quiet for --incident-resolve-s; compare names the
  same first divergence and drift alerts from the logs.
Both runs train the TinyTransformer of scenario_lib in one process, 0.05 s apart per step
(time for a request's round trip).
"""
import json
import os
import subprocess
import time

from scenario_lib import Collector, batches, fmt_alerts, make_pair

K = 5
CHANGE = 21  # the candidate's change starts here: first sampled step at or after it is 25
STEPS = 60


def log_messages(col, run):
    out = subprocess.run([col.exe, "inspect", col.log_path(run)], capture_output=True, text=True,
                         timeout=60, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def tensor_steps(msgs):
    return sorted({m["body"]["step"] for m in msgs if m["type"] == "StepStats" and m["body"]["stats"]})


def sample_acks(msgs):
    """(step, detail) of the agent's "done" answers to sample requests."""
    return [(m["body"]["step"], m["body"]["detail"]) for m in msgs
            if m["type"] == "ControlAck" and m["body"]["status"] == "Done"
            and m["body"]["detail"].startswith("sample ")]


def run_pair(tmp_path, exp, steps, extra_args=(), prepare_cand=None):
    """Trains a baseline and a candidate (make_pair) for `steps` steps into a collector
    with --sample-quiet K and the control channel; returns (collector, alerts, the two
    logs' messages)."""
    with Collector(tmp_path, ["--sample-quiet", str(K), *extra_args], control=True) as col:
        mon = {"capture_dir": str(tmp_path / "captures")}  # the collector captures the birth op
        b, c = make_pair(col.endpoint, exp, baseline_kwargs={"monitor_kwargs": mon},
                         candidate_kwargs={"prepare": prepare_cand, "monitor_kwargs": mon})
        for x, y in batches(steps):
            b.train_step(x, y)
            c.train_step(x, y)
            time.sleep(0.05)
        assert b.close() and c.close()
        col.wait_goodbye([exp + "-base", exp + "-cand"])
    assert col.proc.returncode == 0, col.stderr()
    return col, col.alerts(), [log_messages(col, exp + r) for r in ("-base", "-cand")]


def test_twins_record_every_5th_step_once_asked(tmp_path):
    exp = "quiet-twins"
    col, alerts, logs = run_pair(tmp_path, exp, 30)
    assert not alerts, fmt_alerts(alerts)
    acks = [sample_acks(m) for m in logs]
    assert len(acks[0]) == 1 and acks[0] == acks[1], acks  # asked once, same step
    first = acks[0][0][0]
    assert acks[0][0][1] == "sample every %d steps from step %d" % (K, first), acks
    assert first <= 6, acks  # live from step 0: two past the later run's last step
    for msgs in logs:
        steps = tensor_steps(msgs)
        assert steps == list(range(first)) + [s for s in range(first, 30) if s % K == 0], steps
        sampling = [m["body"]["sampling"]["every"] for m in msgs if m["type"] == "Sampling"]
        assert sampling[0] == 1 and sampling[-1] == K, sampling
        scalars = sorted({m["body"]["step"] for m in msgs if m["type"] == "StepScalars"})
        assert scalars == list(range(30)), scalars
    assert "the runs are live agents and agree: asked runs quiet-twins-base and quiet-twins-cand " \
           "to record tensors every 5 steps from step %d (--sample-quiet)" % first in col.stderr()


def scale_from_change(factor):
    """The candidate's second encoder layer's linear2 hands on its output times `factor`
    from step CHANGE on (run.step_no: the step being trained)."""
    def prepare(run):
        def hook(_module, _inputs, out):
            return out * factor if run.step_no >= CHANGE else out
        run.model.encoder.layers[1].linear2.register_forward_hook(hook)
    return prepare


def test_a_change_raises_both_runs_to_every_step_until_its_incident_resolves(tmp_path):
    """--incident-resolve-s 1: once no alert has joined the pair's incident for a second,
    both runs go back to every 5th step."""
    exp = "quiet-change"
    col, alerts, logs = run_pair(tmp_path, exp, STEPS, ["--incident-resolve-s", "1"],
                                 prepare_cand=scale_from_change(1.0005))
    fd = [a for a in alerts if a["rule"] == "first_divergence"]
    assert len(fd) >= 1, fmt_alerts(alerts)
    first_sampled = -(-CHANGE // K) * K
    assert fd[0]["step"] == first_sampled, fmt_alerts(alerts)
    assert fd[0]["tensor"].startswith("encoder.layers.1.linear2"), fmt_alerts(alerts)
    assert min(a["step"] for a in alerts) == first_sampled, fmt_alerts(alerts)
    acks = [sample_acks(m) for m in logs]
    assert acks[0] == acks[1] and len(acks[0]) == 3, acks
    (quiet_at, quiet), (loud_at, loud), (again_at, again) = acks[0]
    assert quiet == "sample every %d steps from step %d" % (K, quiet_at), acks
    assert loud == "sample every 1 steps from step %d" % loud_at, acks
    assert again == "sample every %d steps from step %d" % (K, again_at), acks
    # Detected at a sampled step, then every step from a few steps later, until the
    # incident has been quiet for a second.
    assert first_sampled < loud_at <= first_sampled + 6, (acks, fmt_alerts(alerts))
    assert again_at > max(a["step"] for a in alerts if a["rule"] != "replay"), (acks, fmt_alerts(alerts))
    for msgs in logs:
        steps = tensor_steps(msgs)
        want = list(range(quiet_at)) + [s for s in range(quiet_at, loud_at) if s % K == 0] + \
            list(range(loud_at, again_at)) + [s for s in range(again_at, STEPS) if s % K == 0]
        assert steps == want, steps
    assert "the pair's incidents resolved: asked runs" in col.stderr(), col.stderr()
    print("\nfirst divergence at step %d (change from step %d); every step from step %d, every %d "
          "again from step %d" % (fd[0]["step"], CHANGE, loud_at, K, again_at))
    # compare reads the same logs to the same first divergence.
    out = subprocess.run([col.exe, "compare", "--json", col.log_path(exp + "-base"),
                          col.log_path(exp + "-cand")], capture_output=True, text=True, timeout=60)
    rep = json.loads(out.stdout)
    assert (rep["first_divergence"]["tensor"], rep["first_divergence"]["step"]) == \
        (fd[0]["tensor"], fd[0]["step"]), (rep["first_divergence"], fmt_alerts(alerts))
    offline = sorted((a["rule"], a["tensor"], a["step"]) for a in rep["alerts"]
                     if a["rule"] in ("first_divergence", "tensor_drift", "trend", "loss_drift"))
    live = sorted((a["rule"], a["tensor"], a["step"]) for a in alerts
                  if a["rule"] in ("first_divergence", "tensor_drift", "trend", "loss_drift"))
    assert offline == live, (offline, live)
