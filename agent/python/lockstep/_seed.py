"""seed_all: make two runs of the same script comparable (as msprobe's seed_all)."""
import functools
import os
import random

import torch

from lockstep._config import npu_module

# Functional dropouts patched by disable_dropout=True, and the argument holding p.
_DROPOUT_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                      "feature_alpha_dropout")
_patched = False
# What the last seed_all() was given: part of the run fingerprint (lockstep._fingerprint).
SEEDED = {}


def seed_all(seed: int = 1234, deterministic: bool = True, disable_dropout: bool = False) -> int:
    """Seeds Python, PYTHONHASHSEED, NumPy, torch, torch.cuda and torch_npu (when
    present). With ``deterministic``: deterministic algorithms (warn-only where torch
    supports it, so an op without a deterministic kernel warns instead of failing),
    cuDNN deterministic and not benchmarking, CUBLAS_WORKSPACE_CONFIG=:4096:8 and
    HCCL_DETERMINISTIC=true. With ``disable_dropout``: every functional dropout (and
    scaled_dot_product_attention's dropout_p) runs with probability 0, for runs compared
    tensor by tensor. Returns the seed."""
    seed = int(seed)
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    try:
        import numpy  # pylint: disable=import-outside-toplevel
        numpy.random.seed(seed % (2**32))
    except ImportError:
        pass
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    npu = npu_module()
    if npu is not None:
        try:
            npu.manual_seed_all(seed)
        except Exception:
            pass
    if deterministic:
        # cuBLAS reads this when its handle is created: set before the first matmul.
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        os.environ["HCCL_DETERMINISTIC"] = "true"
        try:
            torch.use_deterministic_algorithms(True, warn_only=True)
        except TypeError:  # torch < 1.11 has no warn_only
            torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    if disable_dropout:
        _disable_dropout()
    SEEDED.update(seed=seed, deterministic=bool(deterministic),
                  disable_dropout=bool(disable_dropout))
    return seed


def _zero_p(fn, p_index):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "p" in kwargs:
            kwargs["p"] = 0.0
        elif len(args) > p_index:
            args = args[:p_index] + (0.0,) + args[p_index + 1:]
        else:
            kwargs["p"] = 0.0
        return fn(*args, **kwargs)
    wrapper.__lockstep_patched__ = True
    return wrapper


def _zero_sdpa(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "dropout_p" in kwargs:
            kwargs["dropout_p"] = 0.0
        elif len(args) > 4:  # (query, key, value, attn_mask, dropout_p, ...)
            args = args[:4] + (0.0,) + args[5:]
        return fn(*args, **kwargs)
    wrapper.__lockstep_patched__ = True
    return wrapper


def _disable_dropout():
    global _patched
    if _patched:
        return
    func = torch.nn.functional
    for name in _DROPOUT_FUNCTIONS:
        fn = getattr(func, name, None)
        if fn is not None and not getattr(fn, "__lockstep_patched__", False):
            setattr(func, name, _zero_p(fn, 1))  # all take (input, p, training, inplace)
    sdpa = getattr(func, "scaled_dot_product_attention", None)
    if sdpa is not None and not getattr(sdpa, "__lockstep_patched__", False):
        func.scaled_dot_product_attention = _zero_sdpa(sdpa)
    _patched = True
