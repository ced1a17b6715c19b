"""detect_latency bench: how long after the candidate's training step a divergence is
reported. Run by scripts/bench (PYTHONPATH=build/python, LOCKSTEP_BIN=build/lockstep).

Scenario, repeated REPS times against one real `lockstep collect --alerts-file F`, each
repetition a fresh experiment (so the dispatcher's dedup never holds an alert back):
the baseline (TinyTransformer of the scenario tests, CPU) trains steps 0..S and closes;
the candidate, identical until then, trains steps 0..S with encoder.layers.1.norm1's eps
switched 1e-5 -> 1e-1 at step S, so `first_divergence` fires at step S. The candidate
then sits idle (no further step, no close) until the alert is seen: a decoder that waits
for the next step or for the 2 s silence timeout shows up here in full.

Figures (BENCH lines, last):
- detect_latency_ms_p99 / _p50: from the moment the candidate's Monitor.step() for step S
  returns (time.time_ns() right after it) to the moment the alert's JSON line is visible
  in the alerts file (polled every 0.2 ms; time.time_ns() when read): agent queue and
  sender, ZeroMQ, collector ingest and run log, step close, comparison, dispatcher, file.
- detect_emit_ms_p99: from the same start to the alert's first_seen_unix_ns, the
  collector's clock when the analyzer emitted it (same host, same system clock):
  the part before the dispatcher and the file.
- detect_latency_device_path_ms_p99: detect_latency_ms_p99 over REPS/4 repetitions with
  both monitors on the device path (Monitor(_force_device_path=True): CPU tensors go
  through device_stats and one record_packed per step, as CUDA/NPU tensors do): the
  step's records reach the agent all at once at step(), so they are all still pending
  when the scalars go out — the case where a decoder that closes on "scalars after
  stats" waits for the next step or the 2 s timeout.
A latency can be at or below zero: the sender thread ships the scalars and the last batch
while step() is still returning, and the collector may compare the step before it has.
"""
import json
import os
import sys
import tempfile
import time

from scenario_lib import Collector, batches, make_pair

REPS = int(os.environ.get("LOCKSTEP_BENCH_REPS", "100"))
DEVICE_REPS = max(1, REPS // 4)
S = 3
WAIT_S = 5.0


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q / 100.0 * len(xs) + 0.5)) - 1))]


def wait_alert(path, offset, experiment, deadline):
    """Polls the alerts file from `offset` for the first_divergence of `experiment`.
    Returns (alert, time_ns seen, new offset) or (None, None, offset)."""
    buf = b""
    while time.monotonic() < deadline:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except OSError:
            chunk = b""
        if chunk:
            seen = time.time_ns()
            buf += chunk
            offset += len(chunk)
            *lines, buf = buf.split(b"\n")
            offset -= len(buf)
            buf = b""
            for line in lines:
                if not line.strip():
                    continue
                a = json.loads(line)
                if a.get("rule") == "first_divergence" and a.get("experiment") == experiment:
                    return a, seen, offset
        time.sleep(0.0002)
    return None, None, offset


def measure(col, offset, mode, rep, data):
    """One repetition; returns (file ms, emit ms, offset) or (None, None, offset)."""
    exp = "lat-%s-%d" % (mode, rep)
    kwargs = {"_force_device_path": True} if mode == "device" else {}
    b, c = make_pair(col.endpoint, exp, baseline_kwargs={"monitor_kwargs": kwargs},
                     candidate_kwargs={"monitor_kwargs": kwargs})
    for x, y in data:
        b.train_step(x, y)
    b.close()
    for s, (x, y) in enumerate(data):
        if s == S:
            c.model.encoder.layers[1].norm1.eps = 1e-1
        c.train_step(x, y)  # ends with Monitor.step()
    t0 = time.time_ns()
    alert, seen, offset = wait_alert(col.alerts_path, offset, exp, time.monotonic() + WAIT_S)
    c.close()
    if alert is None or alert["step"] != S:
        return None, None, offset
    return (seen - t0) / 1e6, (alert["first_seen_unix_ns"] - t0) / 1e6, offset


def main():
    data = batches(S + 1)
    file_ms, emit_ms, device_ms, missed = [], [], [], 0
    with tempfile.TemporaryDirectory() as tmp, Collector(tmp) as col:
        offset = 0
        for rep in range(REPS):
            f, e, offset = measure(col, offset, "host", rep, data)
            if f is None:
                missed += 1
            else:
                file_ms.append(f)
                emit_ms.append(e)
        for rep in range(DEVICE_REPS):
            f, _, offset = measure(col, offset, "device", rep, data)
            if f is None:
                missed += 1
            else:
                device_ms.append(f)
    if missed or not file_ms:
        print("detect_latency_bench: %d of %d repetitions saw no first_divergence at step %d "
              "within %.0f s" % (missed, REPS + DEVICE_REPS, S, WAIT_S), file=sys.stderr)
        return 1
    print("repetitions %d; file latency ms min %.2f p50 %.2f p99 %.2f max %.2f" % (
        len(file_ms), min(file_ms), percentile(file_ms, 50), percentile(file_ms, 99),
        max(file_ms)))
    print("slowest ms: %s" % " ".join("%.1f" % v for v in sorted(file_ms)[-10:]))
    print("BENCH detect_latency_ms_p99 %.2f ms" % percentile(file_ms, 99))
    print("BENCH detect_latency_ms_p50 %.2f ms" % percentile(file_ms, 50))
    print("BENCH detect_emit_ms_p99 %.2f ms" % percentile(emit_ms, 99))
    print("BENCH detect_latency_device_path_ms_p99 %.2f ms" % percentile(device_ms, 99))
    return 0


if __name__ == "__main__":
    sys.exit(main())
