"""Overhead of lockstep on realistic models on a CUDA GPU (issue 13), in one process.

Models (tests/python/model_zoo.py, plain torch): a GPT-2-small-shaped decoder (12 layers,
d 768, 12 heads, vocab 50257, batch 8 x 1024) and a ~1 B Llama-style decoder (16
layers, d 2048, 16 heads, SwiGLU 5632, vocab 32000, batch 4 x 2048), AdamW, cross
entropy on random tokens. One model per configuration trains with each kind's hooks
attached for its step and removed after it, kinds in a fresh random order each round
(as torch_overhead_bench.py), each step timed between two torch.cuda.synchronize():
  plain    no hooks;
  triton   Monitor.watch (every module output, input, output gradient and parameter
           gradient, every step, default options, a real `lockstep collect` when
           LOCKSTEP_BIN is set), LOCKSTEP_STATS_KERNEL=triton: the fused kernel where it is
           available;
  triton_no_act_in  the same with kind act_in off;
  torch    the same Monitor options with LOCKSTEP_STATS_KERNEL=torch: the torch path
           (_torch_stats, what NPU and ROCm jobs run);
  foreach  for scale: the same hook points handing the same tensors to
           torch._foreach_norm (L2 and absmax, two passes, batched per 256 tensors and
           dtype), what clip_grad_norm_ uses;
  every10  (its own rounds) Monitor.watch(every=10), LOCKSTEP_STATS_KERNEL=triton.

BENCH gpu_gpt2_bf16_overhead_ratio     median over rounds of triton step / plain step,
                                       GPT-2, bf16 autocast (target <= 1.06)
BENCH gpu_gpt2_fp32_overhead_ratio     the same in fp32 (target <= 1.04)
BENCH gpu_gpt2_bf16_every10_mean_ratio mean of every10 step times / mean of plain step
                                       times over EVERY_ROUNDS rounds (all steps, not the
                                       median; target <= 1.01)
BENCH gpu_llama_bf16_overhead_ratio    the GPT-2 bf16 ratio for the Llama-style model (target <= 1.06)
BENCH gpu_deterministic_cost_ratio     with torch.use_deterministic_algorithms(True)
                                       (warn_only), (triton / plain) over the same ratio
                                       without it, GPT-2 bf16, measured back to back (target <= 1.02)
BENCH gpu_stats_hbm_fraction           bytes of the tensors given to the statistics per
                                       step / GPU time of the statistics calls replayed back
                                       to back on those tensors (CUDA events) / the
                                       device-to-device copy bandwidth measured in this run
                                       (2 x bytes / time of a 1 GiB copy: it reads and
                                       writes), GPT-2 bf16 (target >= 0.6)
BENCH gpu_<model>_overhead_ratio_no_act_in  the triton ratio with kind act_in off (what
                                       each module received is then not recorded)
BENCH gpu_<model>_torch_overhead_ratio   the torch path's ratio (as gpu_*_overhead_ratio)
BENCH gpu_<model>_foreach_norm_ratio     the foreach reference's ratio
BENCH gpu_<model>_extra_mem_mb           peak GPU memory of a triton step minus that of a
                                       plain step (torch.cuda.max_memory_allocated), MB
BENCH gpu_<model>_launches_per_step      kernel launches per triton step minus per plain
                                       step (torch.profiler)
Printed beside them: step medians, the kernel's state (used, or why not), the torch
path's and the foreach reference's replay time and HBM fraction.

Measured duration on an H200 with LOCKSTEP_BENCH_ROUNDS=5: 98-108 s, most of it in the
torch path's steps (0.8 s a GPT-2 step, 2.6 s a Llama one) and model set-up; the
default 8 rounds fit one 10-minute device call (docs/performance.md has the figures). LOCKSTEP_BENCH_ROUNDS (default 8) and LOCKSTEP_BENCH_MODELS (default
"gpt2_bf16,gpt2_fp32,every10,det,llama_bf16") trim it.

Without CUDA it prints a note and no BENCH line. `--smoke` runs the tiny variants of both
models for 2 rounds on the CPU through the device pipeline (Monitor(_force_device_path=
True)) and prints the same figures as SMOKE lines: a check of this script, not a figure.
"""
import os

# deterministic cuBLAS needs this before CUDA is initialised (the `det` configuration)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lockstep  # noqa: E402
from lockstep import _triton_stats  # noqa: E402
from lockstep._watch import DEFAULT_KINDS  # noqa: E402
from bench_util import attach_hooks, launches_per_step, start_collector  # noqa: E402
import model_zoo  # noqa: E402

SMOKE = "--smoke" in sys.argv
ROUNDS = 2 if SMOKE else int(os.environ.get("LOCKSTEP_BENCH_ROUNDS", "8"))
WARMUP = 0 if SMOKE else 3  # the first watched steps compile the kernel and self-check it
EVERY_ROUNDS = 2 if SMOKE else 40
MODELS = os.environ.get("LOCKSTEP_BENCH_MODELS",
                        "gpt2_bf16,gpt2_fp32,every10,det,llama_bf16").split(",")
DEVICE = "cpu" if SMOKE else "cuda"
TAG = "SMOKE" if SMOKE else "BENCH"
KERNEL_ENV = _triton_stats.ENV


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class Timer:
    """Elapsed device time of a region: CUDA events on a GPU, wall time on the CPU."""

    def __init__(self):
        if DEVICE == "cuda":
            self.a = torch.cuda.Event(enable_timing=True)
            self.b = torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self):
        """Seconds; synchronizes."""
        if DEVICE == "cuda":
            self.b.record()
            self.b.synchronize()
            return self.a.elapsed_time(self.b) / 1e3
        return time.perf_counter() - self.t0


class ForeachRef:
    """The foreach reference: hooks hand tensors here; per 256 tensors (and at the end
    of the step) torch._foreach_norm L2 and inf per dtype, results kept, no sync."""

    def __init__(self):
        self.pending, self.results = [], []

    def __call__(self, t):
        self.pending.append(t.detach())
        if len(self.pending) >= 256:
            self.flush()

    def flush(self):
        by = {}
        for t in self.pending:
            by.setdefault(t.dtype, []).append(t)
        for ts in by.values():
            self.results.append(torch._foreach_norm(ts, 2))
            self.results.append(torch._foreach_norm(ts, float("inf")))
        self.pending = []

    def end_step(self):
        self.flush()
        self.results = []


class Config:
    """One model, its optimizer and batch, and a Monitor per watched kind."""

    def __init__(self, name, model_cls, shape, batch, amp, endpoint):
        torch.manual_seed(0)
        self.name = name
        self.amp = amp
        if hasattr(torch.device, "__enter__"):  # torch 2.x: build on the device directly
            with torch.device(DEVICE):
                self.model = model_cls(**shape)
        else:
            self.model = model_cls(**shape).to(DEVICE)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x, self.y = model_zoo.lm_batch(shape["vocab"], batch, shape["seq"], DEVICE)
        kw = dict(endpoint=endpoint, _force_device_path=SMOKE)
        self.mons = {k: lockstep.Monitor(run="gpu-model-%s-%s" % (name, k), **kw)
                     for k in ("triton", "triton_no_act_in", "torch", "every10")}
        self.foreach = ForeachRef()
        self.kernel_env = {"triton": "triton", "triton_no_act_in": "triton", "every10": "triton",
                           "torch": "torch"}
        self.capture = None  # a list: the tensor batches given to the statistics

    def attach(self, kind):
        if kind in self.mons:
            mon = self.mons[kind]
            kinds = [k for k in DEFAULT_KINDS if k != "act_in" or kind != "triton_no_act_in"]
            mon.watch(self.model, every=10 if kind == "every10" else 1, kinds=kinds)
            return [mon._watches.pop()]  # removed again after the step
        if kind == "foreach":
            return attach_hooks(self.model, self.foreach)
        return []

    def _step(self, kind):
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=self.amp):
            logits = self.model(self.x)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 self.y.reshape(-1))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if kind in self.mons:
            self.mons[kind].step(loss=loss)
        elif kind == "foreach":
            self.foreach.end_step()

    def step(self, kind, timed=True):
        os.environ[KERNEL_ENV] = self.kernel_env.get(kind, "auto")
        handles = self.attach(kind)
        try:
            sync()
            t0 = time.perf_counter()
            self._step(kind)
            sync()
            return time.perf_counter() - t0
        finally:
            for h in handles:
                h.remove()

    def rounds(self, kinds, n, warmup):
        times = {k: [] for k in kinds}
        rng = random.Random(0)
        for i in range(warmup + n):
            order = list(kinds)
            rng.shuffle(order)
            for kind in order:
                dt = self.step(kind)
                if i >= warmup:
                    times[kind].append(dt)
        return times

    def peak_mb(self, kind):
        if DEVICE != "cuda":
            return 0.0
        sync()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        self.step(kind)
        return (torch.cuda.max_memory_allocated() - base) / 2 ** 20

    def launches(self, kind):
        return launches_per_step(lambda: self.step(kind))

    def capture_batches(self, kind="triton"):
        """The tensor batches the Monitor hands to the statistics in one step (kept:
        replayed by stats_replay)."""
        pipe = self.mons[kind]._pipeline
        orig = pipe._stats
        batches = []

        def spy(tensors):
            batches.append(list(tensors))
            return orig(tensors)
        pipe._stats = spy
        try:
            self.step(kind)
        finally:
            del pipe._stats  # back to the class's method
        return batches

    def close(self):
        for m in self.mons.values():
            m.close(timeout=5.0)


def ratio_median(times, kind, base="plain"):
    return statistics.median(b / a for a, b in zip(times[base], times[kind]))


def copy_bandwidth():
    """Bytes per second of a device-to-device copy (read + write), 1 GiB (16 MiB smoke)."""
    n = (16 << 20) if SMOKE else (1 << 30)
    a = torch.empty(n, dtype=torch.uint8, device=DEVICE)
    b = torch.empty_like(a)
    b.copy_(a)
    best = float("inf")
    for _ in range(5):
        t = Timer()
        b.copy_(a)
        best = min(best, t.stop())
    return 2 * n / best


def stats_replay(batches, mode, k, bins):
    """Seconds of the statistics of `batches` replayed back to back (best of 3), with
    LOCKSTEP_STATS_KERNEL=mode ("foreach": torch._foreach_norm L2 + inf instead)."""
    os.environ[KERNEL_ENV] = mode if mode != "foreach" else "auto"
    fn = _triton_stats.device_stats
    best = float("inf")
    for _ in range(4):  # the first round warms caches and compiles
        sync()
        t = Timer()
        for ts in batches:
            if mode == "foreach":
                torch._foreach_norm(ts, 2)
                torch._foreach_norm(ts, float("inf"))
            else:
                fn(ts, k, bins)
        best = min(best, t.stop())
    return best


def kernel_throughput(bw):
    """Info lines: GB/s of the statistics (kernel and torch path) on one large tensor and
    on a batch of 200 small ones per dtype, against the copy bandwidth."""
    n_big, n_small = (1 << 20, 1 << 10) if SMOKE else (1 << 28, 1 << 20)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        big = [torch.randn(n_big, device=DEVICE).to(dtype)]
        small = [torch.randn(n_small + 17 * i, device=DEVICE).to(dtype) for i in range(200)]
        line = []
        for label, batch in (("1 x %dM" % (n_big >> 20), big), ("200 small", small)):
            nbytes = sum(t.numel() * t.element_size() for t in batch)
            for mode in ("triton", "torch"):
                secs = stats_replay([batch], mode, 32, 16)
                line.append("%s %s %.1f GB/s (%.2f of copy)"
                            % (label, mode, nbytes / secs / 1e9, nbytes / secs / bw))
        print("statistics throughput %s: %s" % (str(dtype).split(".")[-1], "; ".join(line)))
        del big, small


def emit(name, value, unit):
    print("%s %s %.4f %s" % (TAG, name, value, unit))


def run_overhead(cfg, out):
    kinds = ["plain", "triton", "triton_no_act_in", "torch", "foreach"]
    t = cfg.rounds(kinds, ROUNDS, WARMUP)
    med = {k: round(statistics.median(v) * 1e3, 2) for k, v in t.items()}
    print("%s: step medians ms %s; kernel %s" % (cfg.name, med, kernel_state()))
    out["gpu_%s_overhead_ratio" % cfg.name] = ratio_median(t, "triton")
    out["gpu_%s_overhead_ratio_no_act_in" % cfg.name] = ratio_median(t, "triton_no_act_in")
    out["gpu_%s_torch_overhead_ratio" % cfg.name] = ratio_median(t, "torch")
    out["gpu_%s_foreach_norm_ratio" % cfg.name] = ratio_median(t, "foreach")
    out["gpu_%s_extra_mem_mb" % cfg.name] = cfg.peak_mb("triton") - cfg.peak_mb("plain")
    out["gpu_%s_launches_per_step" % cfg.name] = cfg.launches("triton") - cfg.launches("plain")
    return t


def kernel_state():
    if _triton_stats.disabled_reason():
        return "OFF: " + _triton_stats.disabled_reason()
    dev = torch.device(DEVICE)
    return "used" if _triton_stats.available(dev) else "not available here"


def main():
    if not SMOKE and not torch.cuda.is_available():
        print("gpu_model_bench: no CUDA device (torch %s); nothing measured (--smoke runs "
              "the tiny models on the CPU)" % torch.__version__)
        return 0
    tmp = tempfile.mkdtemp(prefix="lockstep-gpu-model-bench-")
    proc, endpoint = start_collector(tmp)
    gpt2 = model_zoo.GPT2_TINY if SMOKE else model_zoo.GPT2_SMALL
    llama = model_zoo.LLAMA_TINY if SMOKE else model_zoo.LLAMA_1B
    gpt2_batch, llama_batch = (2, 2) if SMOKE else (8, 4)
    print("device: %s; torch %s; triton %s; collector: %s; rounds %d (+%d warm-up)"
          % (torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke)",
             torch.__version__, _triton_version(), "real" if proc else "none", ROUNDS, WARMUP))
    out = {}
    t0 = time.perf_counter()
    bw = copy_bandwidth()
    print("device-to-device copy: %.0f GB/s (read + write)" % (bw / 1e9))
    kernel_throughput(bw)
    if "gpt2_bf16" in MODELS or "every10" in MODELS or "det" in MODELS:
        cfg = Config("gpt2_bf16", model_zoo.GPT2, gpt2, gpt2_batch, True, endpoint)
        if "gpt2_bf16" in MODELS:
            run_overhead(cfg, out)
            batches = cfg.capture_batches()
            nbytes = sum(t.numel() * t.element_size() for ts in batches for t in ts)
            ntensors = sum(len(ts) for ts in batches)
            k, bins = 32, 16
            secs = {m: stats_replay(batches, m, k, bins) for m in ("triton", "torch", "foreach")}
            del batches
            print("statistics replay of one step (%d tensors, %.3f GB): triton %.2f ms, torch "
                  "%.2f ms, foreach_norm x2 %.2f ms; kernel %s"
                  % (ntensors, nbytes / 1e9, secs["triton"] * 1e3,
                     secs["torch"] * 1e3, secs["foreach"] * 1e3, kernel_state()))
            for m in ("triton", "torch", "foreach"):
                frac = nbytes / max(secs[m], 1e-12) / bw
                key = "gpu_stats_hbm_fraction" if m == "triton" else \
                    "gpu_stats_hbm_fraction_%s" % m
                out[key] = frac
        if "every10" in MODELS:
            t = cfg.rounds(["plain", "every10"], EVERY_ROUNDS, 0)
            out["gpu_gpt2_bf16_every10_mean_ratio"] = \
                statistics.mean(t["every10"]) / statistics.mean(t["plain"])
        if "det" in MODELS and _triton_stats.disabled_reason():
            print("deterministic: not measured, the kernel is off (the torch path takes "
                  "~10 s a step in deterministic mode)")
        elif "det" in MODELS:
            nondet = cfg.rounds(["plain", "triton"], ROUNDS, 1)
            torch.use_deterministic_algorithms(True, warn_only=True)
            try:
                det = cfg.rounds(["plain", "triton"], ROUNDS, 1)
            finally:
                torch.use_deterministic_algorithms(False)
            r_det, r_nondet = ratio_median(det, "triton"), ratio_median(nondet, "triton")
            print("deterministic: triton/plain %.4f (plain %.2f ms); without: %.4f (plain "
                  "%.2f ms)" % (r_det, statistics.median(det["plain"]) * 1e3, r_nondet,
                                statistics.median(nondet["plain"]) * 1e3))
            out["gpu_deterministic_cost_ratio"] = r_det / r_nondet
        cfg.close()
        del cfg
    if "gpt2_fp32" in MODELS:
        cfg = Config("gpt2_fp32", model_zoo.GPT2, gpt2, gpt2_batch, False, endpoint)
        run_overhead(cfg, out)
        cfg.close()
        del cfg
    if "llama_bf16" in MODELS:
        _free_memory()
        cfg = Config("llama_bf16", model_zoo.Llama, llama, llama_batch, True, endpoint)
        run_overhead(cfg, out)
        cfg.close()
        del cfg
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)
    print("bench time %.0f s; kernel at the end: %s" % (time.perf_counter() - t0, kernel_state()))
    for name in sorted(out):
        unit = "MB" if name.endswith("_mb") else ("count" if name.endswith("_step")
                                                   else "ratio")
        emit(name, out[name], unit)
    return 0


def _free_memory():
    import gc  # pylint: disable=import-outside-toplevel
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def _triton_version():
    mod = _triton_stats._triton()
    return mod[0].__version__ if mod else "none"


if __name__ == "__main__":
    sys.exit(main())
