"""log size bench: what a run log costs on disk per record and per step (issue 28).

One real `lockstep collect` and one `lockstep-loadgen` rank recording a GPT-2-small-sized
step: 750 tensor records (the model zoo's GPT-2 config with act_in, as the issue counts
it) and one step-scalars record, STEPS steps at RATE steps/s (paced, so that the
collector flushes each step as it comes, as it does for a training job whose steps take
some time: one block per step, not one per 256 KiB). Run twice: with the default
`--log-compression zstd` and with `none` (plain records, format 1).

The loadgen's statistics are synthetic: deterministic noise, its sketches random-like.
Real logs compress better (the demo's two runs: 2.3x and 3.1x against 1.9x here), so
these figures are an upper bound of what a real run costs.

Figures:
- log_bytes_per_record: log file bytes / records in it (compressed)
- log_bytes_per_record_plain: the same with --log-compression none
- log_bytes_per_step_gpt2_rank: compressed log bytes / steps, for one rank
- log_compression_ratio: plain bytes / compressed bytes

Environment: LOGSIZE_STEPS (200), LOGSIZE_RATE (20), LOGSIZE_TENSORS (750)."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load_lib  # noqa: E402

STEPS = int(os.environ.get("LOGSIZE_STEPS", "200"))
RATE = float(os.environ.get("LOGSIZE_RATE", "20"))
TENSORS = int(os.environ.get("LOGSIZE_TENSORS", "750"))


def log_bytes(compression, work):
    """(log file bytes, records in it) of one rank's run written with `compression`."""
    os.makedirs(work)
    col = load_lib.Collector(work, ["--log-compression", compression])
    try:
        gen = subprocess.run(
            [load_lib.LOADGEN, "--endpoint", col.endpoint, "--run", "gpt2-size", "--role", "solo",
             "--tensors", str(TENSORS), "--steps", str(STEPS), "--steps-per-s", str(RATE),
             "--backpressure", "--close-timeout-ms", "30000"],
            capture_output=True, text=True, timeout=STEPS / RATE + 120)
        if gen.returncode != 0:
            raise RuntimeError("lockstep-loadgen failed: " + gen.stdout + gen.stderr)
    finally:
        col.stop()
    path = os.path.join(col.data_dir, "gpt2-size.lslog")
    out = subprocess.run([load_lib.LOCKSTEP, "inspect", "--summary", path], capture_output=True,
                         text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError("lockstep inspect failed: " + out.stderr)
    # One summary line per rank: {"records": N (tensor records), ...}
    records = sum(json.loads(line)["records"] for line in out.stdout.splitlines() if line.strip())
    return os.path.getsize(path), records + STEPS  # + the step-scalars records


def main():
    with tempfile.TemporaryDirectory(prefix="lockstep-logsize-") as tmp:
        z_bytes, z_records = log_bytes("zstd", os.path.join(tmp, "zstd"))
        p_bytes, p_records = log_bytes("none", os.path.join(tmp, "none"))
    print("log size: %d steps x %d tensors, one rank: zstd %d bytes (%d records), plain %d bytes "
          "(%d records)" % (STEPS, TENSORS, z_bytes, z_records, p_bytes, p_records), file=sys.stderr)
    print("BENCH log_bytes_per_record %.1f bytes" % (z_bytes / z_records))
    print("BENCH log_bytes_per_record_plain %.1f bytes" % (p_bytes / p_records))
    print("BENCH log_bytes_per_step_gpt2_rank %.0f bytes" % (z_bytes / STEPS))
    print("BENCH log_compression_ratio %.2f ratio" % (p_bytes / z_bytes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
