"""Where a watched GPT-2 bf16 step spends its time on a CUDA GPU (issue 24 item 3).

Builds gpu_model_bench.py's GPT-2 configuration, warms it, then profiles PLAIN_STEPS plain
steps and WATCHED_STEPS watched ones (Monitor.watch, the fused kernel) with torch.profiler,
and prints, per step:
  * wall time, GPU kernel time (sum of kernel durations), and the GPU's idle share
    (1 - kernel time / wall time): launch gaps and host-side work show up there;
  * kernel launches and host syncs (cudaStreamSynchronize, cudaDeviceSynchronize,
    cudaEventSynchronize, cudaMemcpy);
  * the kernels added by watching (watched minus plain, by name), and the host functions
    of the lockstep package by self CPU time (the profiler's Python stack).
Writes the tables to OUT_DIR (argument, default the current folder) as profile_*.txt.

    python3 tests/python/gpu_profile.py [OUT_DIR]    # on a machine with a CUDA device
Without CUDA it prints a note and exits 0.
"""
import collections
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_model_bench as gmb  # noqa: E402  (its Config, model shapes and batches)
import model_zoo  # noqa: E402
from bench_util import start_collector  # noqa: E402

PLAIN_STEPS, WATCHED_STEPS, WARMUP = 3, 3, 3
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def profile(cfg, kind, steps):
    from torch.profiler import ProfilerActivity, profile as prof  # pylint: disable=import-outside-toplevel
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with prof(activities=acts, with_stack=(kind != "plain")) as p:
        t0 = time.perf_counter()
        for _ in range(steps):
            cfg.step(kind)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps
    return p, wall


def kernel_times(p):
    """{kernel name: (count, total microseconds)} of the GPU kernels."""
    out = collections.defaultdict(lambda: [0, 0.0])
    for e in p.events():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA and e.name:
            if "Memcpy" in e.name or "Memset" in e.name:
                key = e.name
            else:
                key = e.name[:90]
            out[key][0] += 1
            out[key][1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    return out


def count(p, names):
    return sum(1 for e in p.events() if e.name in names)


def lockstep_host(p):
    """Self CPU microseconds of the profiler's Python frames inside the lockstep package."""
    out = collections.Counter()
    for e in p.events():
        stack = getattr(e, "stack", None) or []
        frame = next((f for f in stack if "/lockstep/" in f), None)
        if frame is not None and getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            out[frame.split("/lockstep/")[-1][:90]] += e.self_cpu_time_total
    return out


def main():
    if not torch.cuda.is_available():
        print("gpu_profile: no CUDA device; nothing profiled")
        return 0
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out_dir, exist_ok=True)
    proc, endpoint = start_collector(tempfile.mkdtemp(prefix="lockstep-gpu-profile-"))
    cfg = gmb.Config("gpt2_bf16", model_zoo.GPT2, model_zoo.GPT2_SMALL, 8, True, endpoint)
    for _ in range(WARMUP):
        cfg.step("plain")
        cfg.step("triton")
    rows = {}
    lines = []
    for kind, steps in (("plain", PLAIN_STEPS), ("triton", WATCHED_STEPS)):
        p, wall = profile(cfg, kind, steps)
        kt = kernel_times(p)
        busy = sum(v[1] for v in kt.values()) / steps / 1e6
        rows[kind] = kt
        lines.append("%-7s wall %.2f ms/step, GPU kernels %.2f ms/step (idle %.0f %%), "
                     "launches %.0f/step, syncs %.1f/step"
                     % (kind, wall * 1e3, busy * 1e3, 100 * max(0.0, 1 - busy / wall),
                        count(p, LAUNCHES) / steps, count(p, SYNCS) / steps))
        table = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        with open(os.path.join(out_dir, "profile_%s_cpu.txt" % kind), "w") as f:
            f.write(table)
        if kind == "triton":
            host = lockstep_host(p)
            with open(os.path.join(out_dir, "profile_lockstep_host.txt"), "w") as f:
                for frame, us in host.most_common(60):
                    f.write("%10.0f us/step  %s\n" % (us / steps, frame))
            lines.append("lockstep host frames, self CPU per step (top 12):")
            lines += ["  %8.0f us  %s" % (us / steps, fr) for fr, us in host.most_common(12)]
    added = []
    for name, (n, us) in rows["triton"].items():
        n0, us0 = rows["plain"].get(name, (0, 0.0))
        if n / WATCHED_STEPS - n0 / PLAIN_STEPS > 0.5 or us / WATCHED_STEPS - us0 / PLAIN_STEPS > 50:
            added.append((us / WATCHED_STEPS - us0 / PLAIN_STEPS,
                          n / WATCHED_STEPS - n0 / PLAIN_STEPS, name))
    added.sort(reverse=True)
    lines.append("kernels added by watching, per step (us, launches, name):")
    lines += ["  %9.0f us %6.0f x  %s" % a for a in added[:20]]
    text = "\n".join(lines)
    with open(os.path.join(out_dir, "profile_summary.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    cfg.close()
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
