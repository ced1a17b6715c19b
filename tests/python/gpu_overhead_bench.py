"""Overhead of the lockstep agent on a small transformer training step on a CUDA GPU.

Identical models train in the same process, interleaved step by step (rotating which
runs first, so drift in clocks or load hits all alike): `plain` (no hooks), `lockstep`
(Monitor.watch: every module output, output gradient and parameter gradient, plus the
loss, every step, through the device pipeline, sending to a real `lockstep collect` when
LOCKSTEP_BIN is set) and `naive` (the msprobe-style statistics mode: in each hook,
per-tensor torch ops each read with .item(), i.e. a host sync per statistic). A step is
forward + backward + optimizer step (+ Monitor.step()), timed in wall time between two
torch.cuda.synchronize() calls; each figure is the median over the measured rounds.
Run twice: fp32, and AMP (autocast fp16 + GradScaler). Exits 0 with a note, printing no
BENCH line, where no CUDA device is present (CI).

BENCH gpu_step_ms                 median plain step time (fp32), for context
BENCH gpu_tensors_per_step        tensors lockstep records per step
BENCH gpu_overhead_added_ms       median over rounds of lockstep step - plain step (fp32)
BENCH gpu_overhead_ratio          median over rounds of lockstep step / plain step (fp32)
BENCH gpu_overhead_ratio_amp      the same with AMP (fp16 autocast, GradScaler)
BENCH gpu_overhead_vs_naive       median(lockstep - plain) / median(naive - plain), fp32
BENCH gpu_lockstep_host_syncs_per_step  host syncs made inside the lockstep package per
                                  watched step: torch.cuda's sync debug mode ("warn")
                                  warnings whose frame is in lockstep (target 0)
BENCH gpu_sync_calls_added_per_step  cudaStreamSynchronize / cudaDeviceSynchronize /
                                  cudaEventSynchronize / synchronous cudaMemcpy calls per
                                  step, watched minus plain, counted by torch.profiler
                                  (target 0; the naive mode's figure is printed beside it)
BENCH gpu_launches_per_tensor     CUDA kernel launches per recorded tensor (profiler,
                                  watched minus plain, divided by tensors per step)
"""
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lockstep  # noqa: E402
from bench_util import attach_hooks, naive_stats, start_collector  # noqa: E402
from model_zoo import TinyTransformer  # noqa: E402

WARMUP = int(os.environ.get("LOCKSTEP_BENCH_WARMUP", "8"))
STEPS = int(os.environ.get("LOCKSTEP_BENCH_STEPS", "30"))
SHAPE = dict(d_in=256, d_model=512, nhead=8, d_ff=2048, layers=4)
BATCH, SEQ = 32, 128
SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
               "cudaMemcpy")
LAUNCH_EVENTS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                 "cuLaunchKernelEx")


def attach_naive(model):
    attach_hooks(model, naive_stats)


def grad_scaler():
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        return amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


class Setup:
    """The three models of one precision mode, and a step function per model."""

    def __init__(self, amp, endpoint):
        torch.manual_seed(0)
        self.amp = amp
        self.models = {k: TinyTransformer(**SHAPE).cuda() for k in ("plain", "lockstep", "naive")}
        for m in self.models.values():
            m.load_state_dict(self.models["plain"].state_dict())
        self.opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4)
                     for k, m in self.models.items()}
        self.scalers = {k: grad_scaler() for k in self.models} if amp else {}
        self.mon = lockstep.Monitor(run="gpu-bench-%s" % ("amp" if amp else "fp32"),
                                    endpoint=endpoint)
        self.mon.watch(self.models["lockstep"], optimizer=self.opts["lockstep"])
        attach_naive(self.models["naive"])
        self.x = torch.randn(BATCH, SEQ, SHAPE["d_in"], device="cuda")
        self.y = torch.randn(BATCH, SEQ, device="cuda")

    def step(self, kind):
        model, opt = self.models[kind], self.opts[kind]
        if self.amp:
            scaler = self.scalers[kind]
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(self.x).float(), self.y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            scaler = None
            loss = torch.nn.functional.mse_loss(model(self.x), self.y)
            loss.backward()
            opt.step()
        opt.zero_grad()
        if kind == "lockstep":
            self.mon.step(loss=loss, lr=opt.param_groups[0]["lr"], loss_scale=scaler)

    def timed(self, kind):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.step(kind)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def run(self, kinds):
        times = {k: [] for k in kinds}
        order = list(kinds)
        for i in range(WARMUP + STEPS):
            order = order[1:] + order[:1]
            for kind in order:
                dt = self.timed(kind)
                if i >= WARMUP:
                    times[kind].append(dt)
        return times


def profile_counts(setup, kind, steps=3):
    """(sync calls, kernel launches) per step of `kind`, from torch.profiler's CUDA
    runtime events."""
    from torch.profiler import ProfilerActivity, profile  # pylint: disable=import-outside-toplevel
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            setup.step(kind)
        torch.cuda.synchronize()
    syncs = launches = 0
    for ev in prof.key_averages():
        if ev.key in SYNC_EVENTS:
            syncs += ev.count
        elif ev.key in LAUNCH_EVENTS:
            launches += ev.count
    # the closing torch.cuda.synchronize() is the harness's, not the step's
    return (syncs - 1) / steps, launches / steps


def lockstep_syncs(setup, steps=3):
    """Host syncs inside the lockstep package per watched step (sync debug mode)."""
    if not hasattr(torch.cuda, "set_sync_debug_mode"):
        return float("nan")
    pkg = os.path.dirname(os.path.abspath(lockstep.__file__)) + os.sep
    torch.cuda.synchronize()
    old = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                setup.step("lockstep")
        finally:
            torch.cuda.set_sync_debug_mode(old)
    ours = [w for w in caught if "synchroniz" in str(w.message)
            and os.path.abspath(w.filename).startswith(pkg)]
    for w in ours[:5]:
        print("lockstep host sync: %s:%s" % (w.filename, w.lineno))
    return len(ours) / steps


def rounds(times, a, b):
    return [y / x for x, y in zip(times[a], times[b])], [y - x for x, y in zip(times[a], times[b])]


def main():
    if not torch.cuda.is_available():
        print("gpu_overhead_bench: no CUDA device (torch %s); nothing measured"
              % torch.__version__)
        return 0
    tmp = tempfile.mkdtemp(prefix="lockstep-gpu-bench-")
    proc, endpoint = start_collector(tmp)
    fp32 = Setup(False, endpoint)
    t32 = fp32.run(("plain", "lockstep", "naive"))
    ratio32, added32 = rounds(t32, "plain", "lockstep")
    _, naive_added = rounds(t32, "plain", "naive")
    sync_plain, launch_plain = profile_counts(fp32, "plain")
    sync_lock, launch_lock = profile_counts(fp32, "lockstep")
    sync_naive, _ = profile_counts(fp32, "naive")
    host_syncs = lockstep_syncs(fp32)
    steps_done = fp32.mon.counters()["steps"]
    per_step = fp32.mon.counters()["tensors_recorded"] / max(1, steps_done)
    amp = Setup(True, endpoint)
    tamp = amp.run(("plain", "lockstep"))
    ratio_amp, added_amp = rounds(tamp, "plain", "lockstep")
    c32, camp = fp32.mon.counters(), amp.mon.counters()
    fp32.mon.close(timeout=5.0)
    amp.mon.close(timeout=5.0)
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)
    med = {k: round(statistics.median(v) * 1e3, 3) for k, v in t32.items()}
    med_amp = {k: round(statistics.median(v) * 1e3, 3) for k, v in tamp.items()}
    print("device: %s; torch %s; collector: %s; steps: %d (+%d warm-up); shape %s batch %d "
          "seq %d" % (torch.cuda.get_device_name(), torch.__version__,
                      "real" if proc else "none (no LOCKSTEP_BIN)", STEPS, WARMUP, SHAPE,
                      BATCH, SEQ))
    print("fp32 step medians ms: %s; amp: %s" % (med, med_amp))
    print("profiler per step: sync calls plain %.1f lockstep %.1f naive %.1f; kernel "
          "launches plain %.0f lockstep %.0f" % (sync_plain, sync_lock, sync_naive,
                                                 launch_plain, launch_lock))
    for name, c in (("fp32", c32), ("amp", camp)):
        print("agent %s: sent %d dropped %d python_errors %d device_steps_dropped %d last %s"
              % (name, c.get("records_sent", 0), c.get("records_dropped", 0),
                 c["python_errors"], c["device_steps_dropped"], c["last_python_error"]))
    print("BENCH gpu_step_ms %.3f ms" % med["plain"])
    print("BENCH gpu_tensors_per_step %.0f count" % per_step)
    print("BENCH gpu_overhead_added_ms %.3f ms" % (statistics.median(added32) * 1e3))
    print("BENCH gpu_lockstep_host_syncs_per_step %.1f count" % host_syncs)
    print("BENCH gpu_sync_calls_added_per_step %.1f count" % (sync_lock - sync_plain))
    print("BENCH gpu_launches_per_tensor %.1f count"
          % ((launch_lock - launch_plain) / max(1.0, per_step)))
    print("BENCH gpu_overhead_vs_naive %.4f ratio"
          % (statistics.median(added32) / max(1e-12, statistics.median(naive_added))))
    print("BENCH gpu_overhead_ratio_amp %.4f ratio" % statistics.median(ratio_amp))
    print("BENCH gpu_overhead_ratio %.4f ratio" % statistics.median(ratio32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
