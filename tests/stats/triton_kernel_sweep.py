"""Throughput of the fused statistics kernel per launch shape, on a CUDA GPU: a tool for
tuning lockstep/_triton_stats.py's LANES, NUM_WARPS and ITERS (module constants read at
each launch), not a test.

    python3 tests/stats/triton_kernel_sweep.py [LANES,WARPS,ITERS ...]

For each shape (default: the module's own, then a few around it) and dtype (fp32, bf16):
GB/s of fused_stats on one 256 Mi-element tensor and on 200 tensors of ~1 Mi elements, as
a fraction of this device's copy bandwidth (a 1 GiB device-to-device copy, read + write),
each the best of 5 timed calls (CUDA events) after a warm-up call that compiles. The rows
are checked against the torch path on the small batch first. Prints a table.
"""
import sys

import torch

from lockstep import _torch_stats as tst
from lockstep import _triton_stats as trs


def timed(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3)
    return best


def main():
    if not torch.cuda.is_available():
        print("triton_kernel_sweep: no CUDA device")
        return 0
    own = (trs.LANES, trs.NUM_WARPS, trs.ITERS)
    shapes = [tuple(int(v) for v in a.split(",")) for a in sys.argv[1:]] or \
        [own, (512, 4, 64), (1024, 16, 64), (2048, 8, 64), (2048, 16, 64)]
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    bw = 2 * n / timed(lambda: b.copy_(a))
    del a, b
    print("device %s; copy %.0f GB/s; own shape LANES,NUM_WARPS,ITERS = %s"
          % (torch.cuda.get_device_name(), bw / 1e9, own))
    gen = torch.Generator(device="cuda").manual_seed(1)
    data = {}
    for dtype in (torch.float32, torch.bfloat16):
        big = [torch.randn(1 << 28, device="cuda", generator=gen).to(dtype)]
        small = [torch.randn((1 << 20) + 17 * i, device="cuda", generator=gen).to(dtype)
                 for i in range(200)]
        data[dtype] = (big, small)
    rows = []
    for lanes, warps, iters in shapes:
        trs.LANES, trs.NUM_WARPS, trs.ITERS = lanes, warps, iters
        line = ["%5d %2d %3d" % (lanes, warps, iters)]
        for dtype, (big, small) in data.items():
            got = trs.fused_stats(small[:20], 32, 16).cpu().numpy()
            want = tst.device_stats(small[:20], 32, 16).cpu().numpy()
            bad = trs.compare_rows(got, want, 32, 16, limit=2)
            for label, batch in (("big", big), ("small", small)):
                nbytes = sum(t.numel() * t.element_size() for t in batch)
                secs = timed(lambda: trs.fused_stats(batch, 32, 16))
                line.append("%s %s %6.0f GB/s %.2f" % (str(dtype)[6:], label, nbytes / secs / 1e9,
                                                      nbytes / secs / bw))
            if bad:
                line.append("DISAGREES: " + bad)
        rows.append("  ".join(line))
        print(rows[-1], flush=True)
    trs.LANES, trs.NUM_WARPS, trs.ITERS = own
    return 0


if __name__ == "__main__":
    sys.exit(main())
