"""What a zoomed step costs (Monitor.zoom, docs/python.md "Zoom").

Model: test_zoom.Net (two pre-norm blocks: an attention with its scores, softmax and
mixing in its own code, and an MLP), batch 4 x 6 x 16, fp32, one torch thread, AdamW,
sending to a real `lockstep collect` when LOCKSTEP_BIN is set. Three configurations, one
step each per round in a fresh random order each round:
  `watched` Monitor.watch (defaults but host_stats_thread="off": everything on the
            training thread, so thread CPU time holds all of it);
  `zoomed`  the same Monitor, with blocks.1.attn zoomed for that step (Monitor.zoom
            called before it, steps=1): every torch call in attn's own code recorded.
Each figure is the 10th percentile over rounds of the training thread's CPU time (the
few hundred microseconds measured are below the noise of a wall-time median here).

BENCH zoom_step_ratio        zoomed / watched step time: what a zoomed step costs on
                             top of a watched one (reported; no target)
BENCH zoom_us_per_call       (zoomed - watched) / calls recorded per zoomed step
BENCH zoom_calls_per_step    calls of blocks.1.attn's own code recorded per step
A step that does not zoom runs none of the zoom's code (no hook, no mode is installed
outside the zoomed steps), so its cost is what it was before zoom existed.
"""
import os
import random
import sys
import tempfile
import time

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(0, os.path.join(_HERE, "..", "python"))
import lockstep  # noqa: E402
from bench_util import start_collector  # noqa: E402
from test_zoom import Net, batches  # noqa: E402

ROUNDS = int(os.environ.get("LOCKSTEP_BENCH_STEPS", "200"))
WARMUP = 20
ZOOMED = "blocks.1.attn"


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(8)
    proc, endpoint = start_collector(tempfile.mkdtemp(prefix="lockstep-zoom-bench-"))
    mon = lockstep.Monitor(run="zoom-bench", endpoint=endpoint, host_stats_thread="off",
                           strict=True)
    mon.watch(model, optimizer=opt)

    def step(i, m):
        x, y = data[i % len(data)]
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if m is not None:
            m.step(loss=loss)

    times = {"watched": [], "zoomed": []}
    calls = []
    rng = random.Random(0)
    for r in range(WARMUP + ROUNDS):
        order = list(times)
        rng.shuffle(order)
        for kind in order:
            if kind == "zoomed":
                assert mon.zoom(ZOOMED, steps=1)
                zoom = mon._zooms[-1]
            c0 = time.thread_time()
            step(r, mon)
            dt = time.thread_time() - c0
            if r >= WARMUP:
                times[kind].append(dt)
                if kind == "zoomed":
                    calls.append(zoom.recorded)
    counters = mon.counters()
    mon.close(timeout=5.0)
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)
    assert counters["python_errors"] == 0, counters["last_python_error"]

    def p10(v):
        return sorted(v)[len(v) // 10]

    watched, zoomed = p10(times["watched"]), p10(times["zoomed"])
    per_step = sum(calls) / len(calls)
    print("rounds %d; p10 thread CPU ms: watched %.3f, zoomed %.3f; %.0f calls recorded per "
          "zoomed step" % (ROUNDS, watched * 1e3, zoomed * 1e3, per_step))
    print("BENCH zoom_step_ratio %.3f ratio" % (zoomed / watched))
    print("BENCH zoom_us_per_call %.2f us" % ((zoomed - watched) / per_step * 1e6))
    print("BENCH zoom_calls_per_step %.0f count" % per_step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
