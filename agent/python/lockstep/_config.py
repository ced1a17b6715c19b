"""Monitor configuration: constructor arguments, LOCKSTEP_* environment fallbacks,
platform and distributed-rank detection.

An argument given to ``Monitor(...)`` wins; otherwise ``LOCKSTEP_<NAME>`` (upper case)
is used; otherwise the default below. Detection (platform, device name, rank, world
size) runs only for what is still unset.
"""
import ctypes
import importlib.util
import os
import re
import socket
import sys
import time

import torch

from . import _keys

ROLES = ("baseline", "candidate", "solo")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")

# name -> (type, default). Types: str, int, float.
OPTIONS = {
    "run": (str, None),
    "role": (str, "solo"),
    "experiment": (str, ""),
    "endpoint": (str, "tcp://127.0.0.1:6200"),
    "platform": (str, None),
    "device_name": (str, None),
    "rank": (int, None),
    "world_size": (int, None),
    "sketch_k": (int, 32),
    "hist_bins": (int, 16),
    "start_step": (int, 0),
    "queue_capacity": (int, 16384),
    "send_hwm": (int, 1000),
    "send_buffer_mb": (int, 32),
    "close_timeout": (float, 5.0),
    "heartbeat_interval": (float, 1.0),
    "curve_server_key": (str, ""),
    "curve_key": (str, ""),
    "host_stats_thread": (str, "auto"),
}


def env_flag(name):
    v = os.environ.get(name, "")
    return v.strip().lower() in ("1", "true", "yes", "on")


def resolve(args):
    """Fills every option from ``args`` (None = unset), then the environment, then the
    default. Raises ValueError with one sentence for a value that cannot be used."""
    cfg = {}
    for name, (typ, default) in OPTIONS.items():
        value = args.get(name)
        if value is None:
            env_name = "LOCKSTEP_" + name.upper()
            raw = os.environ.get(env_name)
            if raw is not None and raw != "":
                try:
                    value = typ(raw)
                except ValueError:
                    raise ValueError("lockstep: %s=%r is not a valid %s; fix the variable"
                                     % (env_name, raw, typ.__name__)) from None
        cfg[name] = default if value is None else value

    if cfg["role"] not in ROLES:
        raise ValueError("lockstep: role %r is not one of baseline, candidate, solo; pass one "
                         "of those (or set LOCKSTEP_ROLE)" % (cfg["role"],))
    if cfg["run"] is None:
        cfg["run"] = "run-%s-%d" % (time.strftime("%Y%m%d-%H%M%S"), os.getpid())
        cfg["run_defaulted"] = True
    if not _RUN_ID_RE.match(cfg["run"]):
        raise ValueError("lockstep: run id %r may only hold letters, digits, '.', '_', '-' "
                         "(1-128, not starting with '.'); pass another run= or LOCKSTEP_RUN"
                         % (cfg["run"],))
    if not 0 <= cfg["sketch_k"] <= 256:
        raise ValueError("lockstep: sketch_k=%d is outside 0..256; pick a value in that range"
                         % cfg["sketch_k"])
    for name, unit in (("queue_capacity", "records"), ("send_hwm", "messages"),
                       ("send_buffer_mb", "MB")):
        if cfg[name] < 0:
            raise ValueError("lockstep: %s=%d is negative; give a number of %s (see "
                             "docs/python.md)" % (name, cfg[name], unit))
    if cfg["hist_bins"] not in (0, 16):
        raise ValueError("lockstep: hist_bins=%d is not supported; use 16 or 0 (off)"
                         % cfg["hist_bins"])
    raw = cfg["host_stats_thread"]
    cfg["host_stats_thread"] = resolve_host_stats_thread(raw)
    # "auto" also measures, while the job runs, whether the thread is faster (_tune.py)
    cfg["host_stats_thread_tune"] = (cfg["host_stats_thread"]
                                     and str(raw).strip().lower() == "auto")
    if cfg["platform"] is None:
        cfg["platform"] = detect_platform()
    if cfg["device_name"] is None:
        cfg["device_name"] = detect_device_name(cfg["platform"])
    rank, world = detect_rank()
    if cfg["rank"] is None:
        cfg["rank"] = rank
    if cfg["world_size"] is None:
        cfg["world_size"] = world
    cfg["framework"] = "torch " + torch.__version__
    cfg["curve"] = _keys.resolve_curve(cfg["curve_server_key"], cfg["curve_key"])
    return cfg


def resolve_host_stats_thread(value):
    """True when CPU tensors' statistics should be computed on lockstep's own thread.
    "auto": when torch leaves a core of this process's CPU set idle (its intra-op
    threads, and those of an OpenBLAS it calls, fewer than the physical cores), since the thread
    then takes the kernel's time out of the step; with every core busy it would only
    compete with torch's threads (measured: slower than computing inline)."""
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    if v != "auto":
        raise ValueError("lockstep: host_stats_thread=%r is not one of auto, on, off; pass "
                         "one of those (or set LOCKSTEP_HOST_STATS_THREAD)" % (value,))
    return max(torch.get_num_threads(), blas_threads()) < physical_cores()


def physical_cores():
    """Cores (not SMT siblings) this process may run on: torch's default thread count
    is the physical cores, and a thread on a busy core's sibling would compete with it."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        base = "/sys/devices/system/cpu/cpu%d/topology/" % cpu
        try:
            with open(base + "physical_package_id") as f:
                pkg = f.read().strip()
            with open(base + "core_id") as f:
                cores.add((pkg, f.read().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))


def blas_threads():
    """Threads of an OpenBLAS loaded in this process, or 0. Debian's torch calls
    OpenBLAS, whose own pool torch.set_num_threads() does not size: with one torch
    thread, matrix products still run on every core (and OpenBLAS's idle workers spin)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libopenblas" in line}
    except OSError:
        return 0
    for path in sorted(paths):
        try:
            return int(ctypes.CDLL(path).openblas_get_num_threads())
        except (OSError, AttributeError, ValueError):
            continue
    return 0


def npu_module():
    """torch.npu when torch_npu is installed and importable, else None. Imported only
    when installed (importing it registers the NPU backend)."""
    if "torch_npu" not in sys.modules and importlib.util.find_spec("torch_npu") is None:
        return None
    try:
        import torch_npu  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except Exception:  # a broken install must not break the training job
        return None
    return getattr(torch, "npu", None)


def detect_platform():
    npu = npu_module()
    if npu is not None and npu.is_available():
        return "npu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def detect_device_name(platform):
    try:
        if platform == "cuda" and torch.cuda.is_available():
            return torch.cuda.get_device_name()
        if platform == "npu":
            npu = npu_module()
            if npu is not None:
                return npu.get_device_name()
    except Exception:
        pass
    return socket.gethostname() if platform == "cpu" else platform


def detect_rank():
    """(rank, world_size): torch.distributed when initialized, else torchrun's RANK /
    WORLD_SIZE variables, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1
