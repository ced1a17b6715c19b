"""The run fingerprint (docs/python.md "Run fingerprint"): what a run was set up with,
sent once so the collector can say how two runs differ before blaming a layer.

Flat keys, text values::

    version.torch / version.python / version.cuda / version.cudnn / version.torch_npu
    version.cann                      library versions
    device.platform / device.name     where it runs
    dist.world_size / dist.rank
    det.deterministic_algorithms      torch.use_deterministic_algorithms
    det.cudnn.deterministic / det.cudnn.benchmark / det.cudnn.enabled
    math.float32_matmul_precision / math.cuda.matmul.allow_tf32 / math.cudnn.allow_tf32
    amp                               autocast on the run's device at the first forward:
                                      "off" or its dtype
    dtype.params                      parameter dtypes and counts ("float32:12")
    seed.value / seed.deterministic / seed.disable_dropout   what seed_all() was given
    optim.type / optim.group<i>.<hyperparameter>              per param group
    module.<path>.type                the module tree (root: "module.type")
    module.<path>.<setting>           each module's own settings as its extra_repr
                                      prints them (p=0.1, eps=1e-05, bias=True...)
    module.<path>.<param>             its own parameters: "float32[8, 4]"
    module.<path>.config.<field>      a model configuration object the module holds
                                      (Hugging Face's `config`, to_dict()), once per
                                      object, with `attn_implementation`, which the
                                      modules' own settings do not show
    version.transformers              the version that configuration was written by
    env.<NAME>                        ENV_VARS below, plus LOCKSTEP_FINGERPRINT_ENV
    config.<key>                      Monitor(config={...}), nested dicts flattened
    fingerprint.step                  the step it was read at (the optimizer's values are
                                      that step's)

Everything is read inside try blocks: a field that cannot be read is left out, and
nothing here raises into training. Built once per watch() (a few ms for a model with
thousands of modules).
"""
import os
import platform as _platform
import re
import warnings

import torch

from lockstep import _seed
from lockstep._config import npu_module

# Environment variables that change what a run computes (numerics, determinism,
# communication algorithms). LOCKSTEP_FINGERPRINT_ENV adds more (comma-separated).
ENV_VARS = (
    "CUBLAS_WORKSPACE_CONFIG", "HCCL_DETERMINISTIC", "PYTHONHASHSEED", "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "CUDA_LAUNCH_BLOCKING", "NCCL_ALGO", "NCCL_PROTO",
    "ASCEND_LAUNCH_BLOCKING", "INF_NAN_MODE_ENABLE",
)
MAX_ENTRIES = 20000
MAX_VALUE = 256
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _text(v):
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_text(x) for x in v) + ")"
    if isinstance(v, torch.Tensor):
        return repr(v.item()) if v.numel() == 1 else "tensor%s" % list(v.shape)
    s = str(v)
    return s if len(s) <= MAX_VALUE else s[:MAX_VALUE - 3] + "..."


def _put(out, key, read):
    """out[key] = _text(read()), or nothing when it cannot be read."""
    try:
        v = read() if callable(read) else read
        if v is not None:
            out[key] = _text(v)
    except Exception:  # pylint: disable=broad-except
        pass


def _split_repr(s):
    """'(4,), eps=1e-05, bias=True' -> [('arg0', '(4,)'), ('eps', '1e-05'), ('bias', 'True')]:
    top-level comma-separated items; an item without a name is argN."""
    items, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur).strip())
    out, n = [], 0
    for it in items:
        if not it:
            continue
        name, eq, value = it.partition("=")
        if eq and _NAME_RE.match(name.strip()):
            out.append((name.strip(), value.strip()))
        else:
            out.append(("arg%d" % n, it))
            n += 1
    return out


def _versions(out, cfg):
    _put(out, "version.python", _platform.python_version)
    _put(out, "version.torch", lambda: torch.__version__)
    _put(out, "version.cuda", lambda: torch.version.cuda)
    _put(out, "version.cudnn", lambda: torch.backends.cudnn.version()
         if torch.cuda.is_available() else None)
    npu = npu_module()
    if npu is not None:
        try:
            import torch_npu  # pylint: disable=import-outside-toplevel,import-error
            _put(out, "version.torch_npu", lambda: torch_npu.__version__)
            _put(out, "version.cann", lambda: getattr(getattr(torch_npu, "version", None),
                                                      "cann", None))
        except Exception:  # pylint: disable=broad-except
            pass
    _put(out, "device.platform", cfg.get("platform"))
    _put(out, "device.name", cfg.get("device_name"))
    _put(out, "dist.world_size", cfg.get("world_size"))
    _put(out, "dist.rank", cfg.get("rank"))


def _settings(out):
    _put(out, "det.deterministic_algorithms", torch.are_deterministic_algorithms_enabled)
    _put(out, "det.cudnn.deterministic", lambda: torch.backends.cudnn.deterministic)
    _put(out, "det.cudnn.benchmark", lambda: torch.backends.cudnn.benchmark)
    _put(out, "det.cudnn.enabled", lambda: torch.backends.cudnn.enabled)
    _put(out, "math.float32_matmul_precision", torch.get_float32_matmul_precision)
    _put(out, "math.cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32)
    _put(out, "math.cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32)
    for k in ("seed", "deterministic", "disable_dropout"):
        if k in _seed.SEEDED:
            _put(out, "seed.value" if k == "seed" else "seed." + k, _seed.SEEDED[k])
    names = list(ENV_VARS)
    extra = os.environ.get("LOCKSTEP_FINGERPRINT_ENV", "")
    names += [n.strip() for n in extra.split(",") if n.strip()]
    for name in names:
        if name in os.environ:
            _put(out, "env." + name, os.environ[name])


def _optimizer(out, opt):
    if opt is None:
        return
    _put(out, "optim.type", lambda: type(opt).__name__)
    try:
        groups = opt.param_groups
    except Exception:  # pylint: disable=broad-except
        return
    for i, group in enumerate(groups):
        for k, v in group.items():
            if k == "params":
                _put(out, "optim.group%d.params" % i, lambda g=v: sum(p.numel() for p in g))
            elif isinstance(v, (bool, int, float, str, tuple, list, torch.Tensor)) or v is None:
                _put(out, "optim.group%d.%s" % (i, k), "None" if v is None else v)


def _model_config(out, base, config):
    """A model configuration object's fields (transformers' PretrainedConfig: a
    ``to_dict()``): what the modules' extra_repr does not print, such as the attention
    kernel (eager, sdpa, flash) a migration may switch. Its version goes with the
    environment's versions."""
    fields = config.to_dict()
    for k, v in fields.items():
        if k == "transformers_version":
            _put(out, "version.transformers", v)
        elif isinstance(k, str) and _NAME_RE.match(k):
            _put(out, "%s.config.%s" % (base, k), "None" if v is None else v)
    impl = getattr(config, "_attn_implementation", None)
    if isinstance(impl, str):
        _put(out, base + ".config.attn_implementation", impl)


# Modules that wrap a whole model as `.module` (the collector drops that leading
# `module.` from tensor names, align/names.cc), and path components wrappers insert
# anywhere (torch.compile, FSDP, activation checkpointing), dropped there too: a DDP
# run's keys then read `module.fc1.type` as a single-process run's do, not
# `module.module.fc1.type`.
_WHOLE_MODEL_WRAPPERS = ("DistributedDataParallel", "DataParallel")
_WRAPPER_COMPONENTS = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")


def _unwrap(model):
    while type(model).__name__ in _WHOLE_MODEL_WRAPPERS and isinstance(
            getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def _path(path):
    """A module's path as the collector names it: wrapper components removed (a wrapper
    and what it wraps share a path; the wrapped module, visited after it, wins)."""
    return ".".join(c for c in path.split(".") if c not in _WRAPPER_COMPONENTS) if path else path


# Settings torch's extra_repr prints only when they are not the default (ReLU, SiLU...
# `inplace`; Conv `padding`, `dilation`, `groups`, `output_padding`, `padding_mode`):
# read from the module when its extra_repr left them out, so a run with the default
# shows it ("False") where the other run's extra_repr printed "True", not "(absent)".
_OMITTED_DEFAULTS = ("inplace", "padding", "dilation", "groups", "output_padding", "padding_mode")


def _omitted_defaults(out, base, m, shown):
    attrs = vars(m)  # plain attributes only (not parameters, buffers or submodules)
    for name in _OMITTED_DEFAULTS:
        v = attrs.get(name)
        if name in shown or v is None:
            continue
        if isinstance(v, (bool, int, str)) or (isinstance(v, tuple) and all(type(x) is int for x in v)):
            out[base + "." + name] = str(v)[:MAX_VALUE]  # as extra_repr formats it: (1, 1), zeros


def _modules(out, model):
    dtypes = {}
    configs = set()  # ids of configuration objects recorded (submodules share the model's)
    for path, m in _unwrap(model).named_modules():
        path = _path(path)
        base = "module." + path if path else "module"
        _put(out, base + ".type", lambda m=m: type(m).__name__)
        config = getattr(m, "config", None)
        if config is not None and id(config) not in configs and callable(
                getattr(config, "to_dict", None)):
            configs.add(id(config))
            try:
                _model_config(out, base, config)
            except Exception:  # pylint: disable=broad-except
                pass
        try:
            shown = set()
            for k, v in _split_repr(m.extra_repr()):
                out[base + "." + k] = v[:MAX_VALUE]
                shown.add(k)
            _omitted_defaults(out, base, m, shown)
        except Exception:  # pylint: disable=broad-except
            pass
        try:
            for name, p in m.named_parameters(recurse=False):
                dt = _text(p.dtype)
                out[base + "." + name] = "%s%s" % (dt, list(p.shape))
                dtypes[dt] = dtypes.get(dt, 0) + 1
        except Exception:  # pylint: disable=broad-except
            pass
        if len(out) > MAX_ENTRIES:
            break
    if dtypes:
        out["dtype.params"] = ",".join("%s:%d" % kv for kv in sorted(dtypes.items()))


def _user(out, config, prefix="config"):
    for k, v in config.items():
        key = "%s.%s" % (prefix, k)
        if isinstance(v, dict):
            _user(out, v, key)
        else:
            _put(out, key, "None" if v is None else (lambda v=v: v))


def build(cfg, model, optimizer, user_config, step=None):
    """The fingerprint of a watch() call: {key: text}. Never raises. `step`: the
    Monitor's current step, sent as fingerprint.step: the optimizer's values are those
    of that step (a resumed run's lr is already scheduled), and the collector does not
    compare scheduled values read at different steps."""
    out = {}
    if step is not None and optimizer is not None:  # the step of the optimizer's values
        _put(out, "fingerprint.step", step)
    for part in (lambda: _versions(out, cfg), lambda: _settings(out),
                 lambda: _optimizer(out, optimizer), lambda: _modules(out, model),
                 lambda: _user(out, user_config or {})):
        try:
            part()
        except Exception:  # pylint: disable=broad-except
            pass
    return out


def autocast_state(platform):
    """{"amp": "off" | its dtype}: autocast on the run's own device type ("cuda", "npu",
    "cpu"), read at the first forward, where a training loop's autocast context is
    active (one key whatever the device, so a GPU and an NPU run compare). Never raises."""
    dev = platform if platform in ("cuda", "npu", "cpu") else "cpu"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:  # torch >= 2.4
                on = torch.is_autocast_enabled(dev)
                dtype = torch.get_autocast_dtype(dev)
            except TypeError:
                if dev == "cpu":
                    on, dtype = torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
                else:
                    on, dtype = torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
        return {"amp": _text(dtype) if on else "off"}
    except Exception:  # pylint: disable=broad-except
        return {}


def entries(fp):
    """Sorted (key, value) pairs for the wire, at most MAX_ENTRIES."""
    items = sorted(fp.items())
    if len(items) > MAX_ENTRIES:
        n = len(items)
        items = items[:MAX_ENTRIES] + [("fingerprint.truncated", str(n - MAX_ENTRIES))]
    return items


class Fingerprint:
    """A Monitor's run fingerprint: what each watch() adds, the autocast state at the
    first watched forward and the rank once it is known, each change handed to the agent
    (sent once, again on reconnection) through `send(entries)`. Never raises: a failure
    is `fail(what, e)`."""

    def __init__(self, send, fail):
        self.entries = {}
        self._send_entries = send
        self._fail = fail

    def _send(self):
        self._send_entries(entries(self.entries))

    def add_watch(self, cfg, model, optimizer, user_config, step):
        try:
            self.entries.update(build(cfg, model, optimizer, user_config, step=step))
            self._send()
        except Exception as e:  # pylint: disable=broad-except
            self._fail("the run fingerprint", e)

    def note_first_forward(self, platform):
        try:
            amp = autocast_state(platform)
            if amp and any(self.entries.get(k) != v for k, v in amp.items()):
                self.entries.update(amp)
                self._send()
        except Exception as e:  # pylint: disable=broad-except
            self._fail("the run fingerprint", e)

    def set_rank(self, rank, world):
        fp, now = self.entries, (str(rank), str(world))
        if fp and (fp.get("dist.rank"), fp.get("dist.world_size")) != now:
            fp["dist.rank"], fp["dist.world_size"] = now
            self._send()

