# lockstep-bench-stack: torch2  (torchvision; g++ and the torch wheel's headers)
"""What the agent's hooks would cost per tensor if they were C++ against libtorch instead
of Python: the measurement behind docs/python.md "The per-tensor cost".

Builds cxx_hook_floor.cc with g++ against the running torch's headers (about 30 s), then
trains torchvision's resnet18 (3x32x32, batch 16, one torch thread, as
resnet_overhead_bench.py) with four configurations, one step each per round in a fresh
random order, hooks attached before the step and removed after it:
  `plain`   no hooks;
  `floor`   empty Python hooks at lockstep's hook points (torch's hook machinery);
  `cxx`     C++ hooks at the same points that read what the recorder needs of each
            tensor and register C++ gradient hooks (cxx_hook_floor.cc);
  `python`  lockstep's own hooks and recorder, with the statistics calls answered at
            once (the kernel costs the same whichever side calls it). Since the
            recorder's host path is C++ (RecorderCore), it calls such a stand-in agent
            through Python, which the real agent is spared: this figure is now an upper
            bound of what the hooks and recorder cost.

BENCH cxx_hook_us_per_tensor_resnet18     (cxx - plain) / tensors, median of rounds'
                                          thread CPU time
BENCH python_hook_us_per_tensor_resnet18  (python - plain) / tensors, the same
BENCH cxx_hooks_ratio_resnet18            median of cxx / plain step time (wall)
BENCH python_hooks_ratio_resnet18         median of python / plain step time (wall)
"""
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lockstep  # noqa: E402
from lockstep import _watch  # noqa: E402
from bench_util import attach_hooks, import_torchvision, reexec_with_quiet_memory  # noqa: E402

WARMUP = 10
STEPS = int(os.environ.get("LOCKSTEP_BENCH_STEPS", "40"))
BATCH, SIDE, CLASSES = 16, 32, 10


def build_extension(out_dir):
    """cxx_hook_floor.cc built against this torch; the imported module."""
    from torch.utils import cpp_extension  # pylint: disable=import-outside-toplevel
    name = "cxx_hook_floor"
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".cc")
    target = os.path.join(out_dir, name + sysconfig.get_config_var("EXT_SUFFIX"))
    libs = cpp_extension.library_paths()[0]
    cmd = (["g++", "-O2", "-shared", "-fPIC", "-std=c++17", "-w",
            "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI),
            "-DTORCH_EXTENSION_NAME=" + name, "-I" + sysconfig.get_paths()["include"]]
           + ["-I" + p for p in cpp_extension.include_paths()]
           + [src, "-L" + libs, "-ltorch", "-ltorch_cpu", "-lc10", "-ltorch_python",
              "-Wl,-rpath," + libs, "-o", target])
    subprocess.run(cmd, check=True)
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _NoKernel:
    """The agent with its statistics calls answered at once."""

    def __init__(self, agent):
        self._agent = agent

    def __getattr__(self, name):
        return getattr(self._agent, name)

    def record_host_tensor(self, *_args):
        return 1.0

    def record_host_tensor_strided(self, *_args):
        return 1.0

    def record_repeat(self, *_args):
        return 1.0


class _ParamHandle:
    def __init__(self, ext, p, pos):
        self._ext, self._p, self._pos = ext, p, pos

    def remove(self):
        self._ext.remove_param_hook(self._p, self._pos)


def main():
    reexec_with_quiet_memory(1)
    torchvision = import_torchvision("cxx_hook_floor_bench")
    if torchvision is None:
        return 1
    ext = build_extension(tempfile.mkdtemp(prefix="lockstep-cxx-hooks-"))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    # Nothing listens there: the stubbed monitor's records are dropped by its queue.
    mon = lockstep.Monitor(run="cxx-floor-bench", endpoint="tcp://127.0.0.1:9",
                           host_stats_thread="off")
    mon._rec._agent = _NoKernel(mon._rec._agent)
    kinds = tuple(k for k in _watch.DEFAULT_KINDS if k != "init")

    def attach_cxx(m):
        handles = [mod.register_forward_hook(ext.ForwardHook(i))
                   for i, (_, mod) in enumerate(m.named_modules())]
        handles += [_ParamHandle(ext, p, ext.param_hook(p, i))
                    for i, p in enumerate(m.parameters())]
        return handles

    def attach_python(m):
        mon.watch(m, kinds=kinds)
        return [mon._watches.pop()]

    attach = {"plain": lambda m: [], "floor": attach_hooks, "cxx": attach_cxx,
              "python": attach_python}
    x = torch.randn(BATCH, 3, SIDE, SIDE)
    y = torch.randint(0, CLASSES, (BATCH,))
    wall = {k: [] for k in attach}
    cpu = {k: [] for k in attach}
    tensors = {"cxx": [], "python": []}
    rng = random.Random(0)
    for i in range(WARMUP + STEPS):
        order = list(attach)
        rng.shuffle(order)
        for kind in order:
            handles = attach[kind](model)
            before = mon.counters()["tensors_recorded"]
            ext.take()
            t0, c0 = time.perf_counter(), time.thread_time()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if kind == "python":
                mon.step(loss=loss)
            dt, dc = time.perf_counter() - t0, time.thread_time() - c0
            for h in handles:
                h.remove()
            if i >= WARMUP:
                wall[kind].append(dt)
                cpu[kind].append(dc)
                if kind == "cxx":
                    tensors["cxx"].append(ext.take())
                elif kind == "python":
                    tensors["python"].append(mon.counters()["tensors_recorded"] - before)
    mon.close(timeout=1.0)

    def per_tensor_us(kind):
        n = statistics.median(tensors[kind])
        return statistics.median((a - b) / n * 1e6 for a, b in zip(cpu[kind], cpu["plain"]))

    def ratio(kind):
        return statistics.median(a / b for a, b in zip(wall[kind], wall["plain"]))

    print("steps: %d; tensors a step: C++ %d, Python %d; wall medians ms: %s"
          % (STEPS, statistics.median(tensors["cxx"]), statistics.median(tensors["python"]),
             {k: round(statistics.median(v) * 1e3, 3) for k, v in wall.items()}))
    print("BENCH torch_hooks_floor_ratio_resnet18 %.4f ratio" % ratio("floor"))
    print("BENCH cxx_hooks_ratio_resnet18 %.4f ratio" % ratio("cxx"))
    print("BENCH python_hooks_ratio_resnet18 %.4f ratio" % ratio("python"))
    print("BENCH cxx_hook_us_per_tensor_resnet18 %.2f us" % per_tensor_us("cxx"))
    print("BENCH python_hook_us_per_tensor_resnet18 %.2f us" % per_tensor_us("python"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
