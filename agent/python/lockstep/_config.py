"""Monitor configuration: constructor arguments, LOCKSTEP_* environment fallbacks,
platform and distributed-rank detection.

An argument given to ``Monitor(...)`` wins; otherwise ``LOCKSTEP_<NAME>`` (upper case)
is used; otherwise the default below. Detection (platform, device name, rank, world
size) runs only for what is still unset.
"""
import ctypes
import importlib.util
import math
import numbers
import operator
import os
import socket
import sys
import time

import torch

from . import _core, _keys

ROLES = tuple(_core.ROLES)  # the schema's roles but Unknown: baseline, candidate, solo
_U32 = 2**32 - 1
_MAX_STEP = 2**62  # steps travel as uint64; room for the steps after the first

_DEFAULT = _core.AGENT_DEFAULTS  # the C++ agent's defaults (AgentOptions): one source
# and its ranges (agent.h): a value C++ would refuse is refused here, with the same bounds
# name -> (type, default, (low, high) for numbers). Types: str, int, float, "path" (a str
# or os.PathLike), "switch" (host_stats_thread: a str or a bool), "flag" (a bool, or
# from the environment 1/0, true/false, yes/no, on/off).
OPTIONS = {
    "run": (str, None, None),
    "role": (str, "solo", None),
    "experiment": (str, "", None),
    "endpoint": (str, _DEFAULT["endpoint"], None),
    "platform": (str, None, None),
    "device_name": (str, None, None),
    "rank": (int, None, (-1, _U32 - 1)),      # -1: not distributed (rank 0 of 1)
    "world_size": (int, None, (1, _U32)),
    "sketch_k": (int, _DEFAULT["sketch_k"], _core.AGENT_LIMITS["sketch_k"]),
    "hist_bins": (int, _DEFAULT["hist_bins"], None),  # 0 or HIST_BINS
    "start_step": (int, _DEFAULT["start_step"], (0, _MAX_STEP)),
    "queue_capacity": (int, _DEFAULT["queue_capacity"], _core.AGENT_LIMITS["queue_capacity"]),
    "send_hwm": (int, _DEFAULT["send_hwm"], (0, 2**31 - 1)),
    "send_buffer_mb": (int, _DEFAULT["send_buffer_mb"], (0, 2**20)),
    "close_timeout": (float, 5.0, (0.0, 86400.0)),
    "heartbeat_interval": (float, _DEFAULT["heartbeat_interval"], (0.001, 3600.0)),
    "curve_server_key": ("path", "", None),
    "curve_key": ("path", "", None),
    "host_stats_thread": ("switch", "auto", None),
    # The collector's control socket: "auto" derives it from endpoint (port + 2, ipc
    # path + ".control": lockstep.common ControlEndpointFor), "off" turns it off.
    "control_endpoint": (str, "auto", None),
    # Capture (lockstep._capture, docs/python.md "Capture and replay"): on/off, where the
    # files go (relative: to the working directory at Monitor()), the bound per capture
    # and the captures per run.
    "capture": ("flag", True, None),
    "capture_dir": ("path", "lockstep-captures", None),
    "capture_mb": (float, 256.0, (0.001, 1048576.0)),
    "capture_limit": (int, 3, (0, 1000)),
    # The replica check (lockstep._replicas): every M-th recorded step of a data-parallel
    # job, the all-reduced gradients of every rank; 0 = off.
    "replica_check_every": (int, 100, (0, 2**31 - 1)),
}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def safe_repr(value, limit=60):
    """repr() for a message: never raises (an object's own __repr__ may), at most
    ``limit`` characters."""
    try:
        text = repr(value)
    except Exception:  # pylint: disable=broad-except
        text = "<%s object>" % type(value).__name__
    if not isinstance(text, str):
        text = "<%s object>" % type(value).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def parse_switch(raw):
    """True / False for 1/0, true/false, yes/no, on/off (any case, spaces around);
    None for anything else."""
    if not isinstance(raw, str):
        return None
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    return None


def disable_requested():
    """(disabled, warning or None) from LOCKSTEP_DISABLE. Unset or empty: enabled. A
    value that is not a switch (``maybe``) disables, with a warning: someone set the
    variable to turn lockstep off, and off is the reading that cannot hurt the job."""
    raw = os.environ.get("LOCKSTEP_DISABLE")
    if raw is None or raw.strip() == "":
        return False, None
    v = parse_switch(raw)
    if v is None:
        return True, ("LOCKSTEP_DISABLE=%s is not one of 1, 0, true, false, yes, no, on, off; "
                      "lockstep stays off (set LOCKSTEP_DISABLE=0 to turn it on)" % safe_repr(raw))
    return v, None


def env_flag(name):
    return parse_switch(os.environ.get(name, "")) is True


def _bad(source, value, accepted):
    return ValueError("lockstep: %s=%s is not valid: %s" % (source, safe_repr(value), accepted))


def _range_text(typ, bounds):
    what = "an integer" if typ is int else "a number"
    lo, hi = bounds
    fmt = "%d" if typ is int else "%g"
    if hi >= 2**31 - 1:
        return ("give %s >= " + fmt) % (what, lo)
    return ("give %s from " + fmt + " to " + fmt) % (what, lo, hi)


def _convert(name, value, from_env):
    """The option's value as its type, checked; ValueError naming ``name`` (or its
    LOCKSTEP_ variable), the value and what is accepted, whatever the value's own
    methods raise."""
    try:
        return _convert_unguarded(name, value, from_env)
    except ValueError:
        raise
    except Exception as e:  # pylint: disable=broad-except  (a hostile __fspath__, strip, ...)
        raise _bad("LOCKSTEP_" + name.upper() if from_env else name, value,
                   "reading it raised %s" % type(e).__name__) from None


def _convert_unguarded(name, value, from_env):
    typ, _, bounds = OPTIONS[name]
    source = "LOCKSTEP_" + name.upper() if from_env else name
    if typ is str:
        if not isinstance(value, str):
            raise _bad(source, value, "give a string (got %s)" % type(value).__name__)
        if "\x00" in value:
            raise _bad(source, value, "it holds a NUL character")
        return value
    if typ == "path":
        if not isinstance(value, (str, os.PathLike)):
            raise _bad(source, value, "give a string or a path (got %s)" % type(value).__name__)
        value = os.fspath(value)
        if not isinstance(value, str) or "\x00" in value:
            raise _bad(source, value, "give a string or a path")
        return value
    if typ == "flag":
        v = value if isinstance(value, bool) else parse_switch(value) if from_env else None
        if v is None:
            raise _bad(source, value, "give True or False" if not from_env
                       else "give one of 1, 0, true, false, yes, no, on, off")
        return v
    if typ == "switch":
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, str) and (value.strip().lower() == "auto" or parse_switch(value) is not None):
            return value
        raise _bad(source, value, "give one of auto, on, off")
    if typ is int:
        if from_env:
            try:
                x = int(value.strip(), 10)
            except ValueError:
                raise _bad(source, value, _range_text(int, bounds)) from None
        else:
            if isinstance(value, bool) or not hasattr(type(value), "__index__"):
                raise _bad(source, value, _range_text(int, bounds) if bounds else "give an integer")
            try:
                x = operator.index(value)
            except Exception:  # pylint: disable=broad-except  (a hostile __index__)
                raise _bad(source, value, "give an integer") from None
        if bounds and not bounds[0] <= x <= bounds[1]:
            raise _bad(source, value, _range_text(int, bounds))
        return x
    # float
    if from_env:
        try:
            x = float(value.strip())
        except ValueError:
            raise _bad(source, value, _range_text(float, bounds)) from None
    else:
        if isinstance(value, (bool, str, bytes)) or not isinstance(value, numbers.Real):
            raise _bad(source, value, _range_text(float, bounds))
        try:
            x = float(value)
        except Exception:  # pylint: disable=broad-except  (a hostile __float__)
            raise _bad(source, value, _range_text(float, bounds)) from None
    if not (math.isfinite(x) and bounds[0] <= x <= bounds[1]):
        raise _bad(source, value, _range_text(float, bounds))
    return x


def resolve(args):
    """Fills every option from ``args`` (None = unset), then the environment, then the
    default. Raises ValueError with one sentence for a value that cannot be used."""
    cfg = {}
    for name, (_, default, _) in OPTIONS.items():
        value = args.get(name)
        if value is not None:
            value = _convert(name, value, from_env=False)
        else:
            raw = os.environ.get("LOCKSTEP_" + name.upper())
            if raw is not None and raw.strip() != "":
                value = _convert(name, raw, from_env=True)
        cfg[name] = default if value is None else value

    if cfg["role"] not in ROLES:
        raise ValueError("lockstep: role %s is not one of baseline, candidate, solo; pass one "
                         "of those (or set LOCKSTEP_ROLE)" % (safe_repr(cfg["role"]),))
    if cfg["run"] is None:
        cfg["run"] = "run-%s-%d" % (time.strftime("%Y%m%d-%H%M%S"), os.getpid())
        cfg["run_defaulted"] = True
    if not isinstance(cfg["run"], str) or not _core.is_valid_run_id(cfg["run"]):
        raise ValueError("lockstep: run id %s may only hold letters, digits, '.', '_', '-' "
                         "(1-%d, not starting with '.'); pass another run= or LOCKSTEP_RUN"
                         % (safe_repr(cfg["run"]), _core.MAX_RUN_ID_LENGTH))
    if cfg["hist_bins"] not in (0, _core.HIST_BINS):
        raise ValueError("lockstep: hist_bins=%d is not supported; use %d or 0 (off)"
                         % (cfg["hist_bins"], _core.HIST_BINS))
    raw = cfg["host_stats_thread"]
    cfg["host_stats_thread"] = resolve_host_stats_thread(raw)
    # "auto" also measures, while the job runs, whether the thread is faster (_tune.py)
    cfg["host_stats_thread_tune"] = (cfg["host_stats_thread"]
                                     and str(raw).strip().lower() == "auto")
    if cfg["platform"] is None:
        cfg["platform"] = detect_platform()
    if cfg["device_name"] is None:
        cfg["device_name"] = detect_device_name(cfg["platform"])
    if cfg["rank"] == -1:
        # The usual "not distributed" value (e.g. local_rank=-1): rank 0 of a job of one.
        cfg["rank"] = 0
        if cfg["world_size"] is None:
            cfg["world_size"] = 1
    if cfg["rank"] is None or cfg["world_size"] is None:
        rank, world = detect_rank()
        if cfg["rank"] is None:
            cfg["rank"] = rank
        if cfg["world_size"] is None:
            cfg["world_size"] = world
    if not 0 <= cfg["rank"] < cfg["world_size"]:
        raise ValueError("lockstep: rank=%d is not below world_size=%d; give 0 <= rank < world_size "
                         "(or rank=-1 when not distributed)" % (cfg["rank"], cfg["world_size"]))
    cfg["framework"] = "torch " + torch.__version__
    cfg["curve"] = _keys.resolve_curve(cfg["curve_server_key"], cfg["curve_key"])
    control = cfg["control_endpoint"].strip()
    if control.lower() == "auto":
        control = _core.control_endpoint_for(cfg["endpoint"])
    elif control.lower() in ("off", ""):
        control = ""
    cfg["control_endpoint"] = control
    return cfg


def user_config(value):
    """Monitor(config=...): the user's own settings for the run fingerprint, as a dict
    copy ({} when None). ValueError naming config= for anything but a dict."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad("config", value, "give a dict (e.g. vars(args)) or leave it out (got %s)"
                   % type(value).__name__)
    try:
        return dict(value)
    except Exception as e:  # pylint: disable=broad-except  (a hostile dict subclass)
        raise _bad("config", value, "reading it raised %s" % type(e).__name__) from None


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
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1
    return (rank, world) if 0 <= rank < world <= _U32 else (0, 1)
