"""The torch statistics fallback (lockstep/_torch_stats.py, device_stats) against the
implementation it replaced (tests/stats/torch_stats_v1.py, a frozen copy: histc over
float64 keys, float64 index_add_), on the tensors of one transformer training step.

    /usr/bin/python3 tests/stats/torch_stats_bench.py [--device cpu|cuda|auto]
        [--scale S] [--reps R] [--k K]

(scripts/bench runs it with the defaults: CUDA when present, else CPU.)

Prints (all ratios measured in this process, on the same tensors):
BENCH torch_stats_fallback_speedup_cpu    old time / new time per device_stats call (CPU)
BENCH gpu_fallback_speedup                the same on CUDA (only when run on CUDA)
BENCH torch_stats_fallback_gelems_<dev>   elements per second of the new implementation
BENCH torch_stats_fallback_old_gelems_<dev>  the same for the old one
BENCH torch_stats_fallback_deterministic_ratio_<dev>  new time with
      torch.use_deterministic_algorithms(True) / time without
BENCH torch_stats_fallback_old_deterministic_ratio_<dev>  the same for the old one
BENCH torch_stats_fallback_ops_per_call_<dev>_<n>t  top-level aten ops that are not
      views (CPU) or GPU kernels (CUDA) of one call on n tensors: bounded per dtype
      group, not per tensor (n = 10 fp32 tensors, then all 40 in 3 dtype groups)
BENCH torch_stats_fallback_old_ops_per_call_<dev>_<n>t  the same for the old one
The rows of both implementations are checked against each other first (exact columns
equal, sums within the documented tolerance).
"""
import argparse
import importlib.util
import os
import statistics
import time

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


NEW = _load("torch_stats_new", os.path.join(_HERE, "..", "..", "agent", "python", "lockstep",
                                            "_torch_stats.py"))
OLD = _load("torch_stats_v1", os.path.join(_HERE, "torch_stats_v1.py"))


def step_tensors(device, scale):
    """One step of a small decoder (d = 512 * scale, 2048 tokens, 4 layers): module
    outputs, output gradients and parameter gradients in fp32, bf16 and fp16, from 512
    elements (biases) to ~4 M (MLP activations); ~40 tensors."""
    g = torch.Generator().manual_seed(0)
    d = int(512 * scale)
    tok = 2048
    shapes = []
    for _layer in range(4):
        shapes += [((tok, d), torch.bfloat16), ((tok, 3 * d), torch.bfloat16),
                   ((tok, 4 * d), torch.bfloat16), ((tok, d), torch.float16),
                   ((tok, d), torch.float32), ((d, 4 * d), torch.float32),
                   ((3 * d, d), torch.float32), ((d,), torch.float32),
                   ((4 * d,), torch.float32), ((tok, 4 * d), torch.float32)]
    out = []
    for shape, dtype in shapes:
        t = torch.randn(shape, generator=g) * 0.02
        out.append(t.to(dtype).to(device))
    return out


def timed(fns, device, reps):
    """Median seconds per call of each of `fns`, called in turn (a, b, a, b, ...) so
    that a load change on a shared machine hits all of them alike. On the CPU the
    process's CPU time (what other jobs on a shared machine change least), on CUDA wall
    time to a synchronize."""
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    times = [[] for _ in fns]
    for rep in range(reps + 1):
        for fn, out in zip(fns, times):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = clock()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if rep:  # the first round warms the hash caches and slot tables
                out.append(clock() - t0)
    return [statistics.median(t) for t in times]


def with_deterministic(fn):
    def run():
        was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            return fn()
        finally:
            torch.use_deterministic_algorithms(was)
    return run


# Ops that only make a view (no kernel on any device).
_VIEWS = {"aten::" + n for n in (
    "slice", "select", "view", "unsqueeze", "detach", "_reshape_alias", "lift_fresh",
    "alias", "as_strided", "expand", "reshape", "t", "transpose", "squeeze", "_unsafe_view",
    "narrow", "unfold", "split", "chunk", "view_as", "expand_as", "flatten", "empty",
    "empty_strided", "resolve_conj", "resolve_neg", "numpy_T", "permute")}


def ops_per_call(fn, device):
    """Top-level aten ops of one call that are not views (CPU), or GPU kernels (CUDA)."""
    fn()
    from torch.profiler import ProfilerActivity, profile  # pylint: disable=import-outside-toplevel
    acts = [ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    with profile(activities=acts) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    events = prof.events()
    if device.type == "cuda":
        return sum(1 for e in events if getattr(e, "device_type", None) is not None
                   and str(e.device_type).endswith("CUDA"))
    return sum(1 for e in events if e.cpu_parent is None and e.name.startswith("aten::")
               and e.name not in _VIEWS)


def check_same(a, b, k):
    c = NEW.COL
    exact = [c[f] for f in ("numel", "min", "max", "absmax", "nan", "inf", "zero", "sat",
                            "subnormal", "limit_dtype")]
    exact += list(range(NEW.SKETCH_COL + k, a.shape[1]))
    assert torch.equal(torch.nan_to_num(a[:, exact], nan=-7.0),
                       torch.nan_to_num(b[:, exact], nan=-7.0)), "exact columns differ"
    for f in ("mean", "std", "l2"):
        assert torch.allclose(a[:, c[f]], b[:, c[f]], rtol=1e-6, atol=1e-9), f
    l2 = a[:, c["l2"]].unsqueeze(1)
    sk = slice(NEW.SKETCH_COL, NEW.SKETCH_COL + k)
    assert bool(((a[:, sk] - b[:, sk]).abs() <= 1e-5 * l2 + 1e-30).all()), "sketch"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="auto")
    ap.add_argument("--scale", type=float, default=None,
                    help="model width / 512 (default 1 on CUDA: ~62 M elements; 0.25 on CPU)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--k", type=int, default=32)
    args = ap.parse_args()
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if args.scale is None:
        args.scale = 1.0 if device.type == "cuda" else 0.25
    tensors = step_tensors(device, args.scale)
    n_el = sum(t.numel() for t in tensors)
    k = args.k
    print("device %s, torch %s, %d threads, %d tensors, %.1f M elements, K=%d"
          % (device, torch.__version__, torch.get_num_threads(), len(tensors), n_el / 1e6, k))

    def new():
        return NEW.device_stats(tensors, k, 16)

    def old():
        return OLD.device_stats(tensors, k, 16)

    check_same(new().cpu(), old().cpu(), k)
    rows_det = with_deterministic(new)().cpu()
    assert torch.equal(torch.nan_to_num(rows_det, nan=-7.0),
                       torch.nan_to_num(new().cpu(), nan=-7.0)), "deterministic mode changed rows"
    t_new, t_old, t_new_det = timed([new, old, with_deterministic(new)], device, args.reps)
    dev = device.type
    print("new %.1f ms (%.2f ns/element), old %.1f ms (%.2f ns/element), new in deterministic "
          "mode %.1f ms" % (t_new * 1e3, t_new / n_el * 1e9, t_old * 1e3, t_old / n_el * 1e9,
                            t_new_det * 1e3))
    print("BENCH torch_stats_fallback_speedup_%s %.2f ratio" % (dev, t_old / t_new))
    if dev == "cuda":
        print("BENCH gpu_fallback_speedup %.2f ratio" % (t_old / t_new))
    print("BENCH torch_stats_fallback_gelems_%s %.3f Gelem/s" % (dev, n_el / t_new / 1e9))
    print("BENCH torch_stats_fallback_old_gelems_%s %.3f Gelem/s" % (dev, n_el / t_old / 1e9))
    print("BENCH torch_stats_fallback_deterministic_ratio_%s %.3f ratio" % (dev, t_new_det / t_new))
    try:
        t_old_det, t_old2 = timed([with_deterministic(old), old], device, max(1, args.reps // 2))
        print("BENCH torch_stats_fallback_old_deterministic_ratio_%s %.3f ratio"
              % (dev, t_old_det / t_old2))
    except RuntimeError as e:  # the old one may refuse (an op without a deterministic kernel)
        print("old implementation in deterministic mode: %s" % str(e).split("\n")[0])

    for n in (len(tensors) // 4, len(tensors)):
        sub = [t for t in tensors if t.dtype == torch.float32][:n] if n < len(tensors) \
            else tensors
        ops_new = ops_per_call(lambda: NEW.device_stats(sub, k, 16), device)
        ops_old = ops_per_call(lambda: OLD.device_stats(sub, k, 16), device)
        groups = len({t.dtype for t in sub})
        print("%d tensors in %d dtype groups: new %d, old %d ops" % (len(sub), groups, ops_new,
                                                                   ops_old))
        print("BENCH torch_stats_fallback_ops_per_call_%s_%dt %d ops" % (dev, len(sub), ops_new))
        print("BENCH torch_stats_fallback_old_ops_per_call_%s_%dt %d ops"
              % (dev, len(sub), ops_old))


if __name__ == "__main__":
    main()
