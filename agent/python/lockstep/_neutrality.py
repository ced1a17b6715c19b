"""`python -m lockstep doctor --neutrality MODULE:FACTORY`: does watching this model change
its training? (docs/python.md "doctor --neutrality")

The factory is the user's code: a callable taking no arguments that returns
``(model, batch)``, ``(model, batch, loss_fn)`` or a dict with the keys ``model``,
``batch`` and optionally ``loss_fn`` (``loss_fn(model, batch) -> loss``) and
``optimizer`` (``optimizer(parameters) -> torch.optim.Optimizer``, default AdamW with
lr 1e-3). Without a loss_fn the loss is the output's ``.loss`` when it has one (a Hugging
Face model given labels), else the mean square of its first tensor.

Three trainings of deep copies of the model, each after ``lockstep.seed_all(seed,
deterministic=True)``: a reference without the agent, a second one without it (if the
two differ, the model is not deterministic here and nothing can be said of the agent),
and one watched by a real Monitor exactly as the README shows (``watch(model,
optimizer=opt)``, ``step(loss=loss)``) whose agent sends to an endpoint where nothing
listens: every hook runs and every statistic is computed, queued and dropped. After each
step the losses, every parameter gradient (before the optimizer's step) and every
parameter (after it) are compared bit for bit with the reference.

It keeps one copy of the parameters and gradients of the reference per step in memory,
beside the model itself and the copy being trained.
"""
import copy
import importlib
import importlib.util
import os
import sys
import tempfile
import warnings

import torch

import lockstep

USAGE = 2  # exit status of a factory that cannot be loaded or used (the CLI's usage code)


class UsageError(Exception):
    """A factory that cannot be loaded or returns something unusable; one sentence."""


def load_factory(spec):
    """The callable named by ``MODULE:FACTORY``; MODULE is an importable name (the
    current directory is on the path) or a ``.py`` file."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise UsageError("--neutrality takes MODULE:FACTORY (e.g. mymodels:tiny_gpt or "
                         "train.py:make_model), got %r" % spec)
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = os.path.abspath(module_name)
            if not os.path.isfile(path):
                raise UsageError("%s: no such file" % module_name)
            sys.path.insert(0, os.path.dirname(path))
            loader_spec = importlib.util.spec_from_file_location(
                "_lockstep_neutrality_factory", path)
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except UsageError:
        raise
    except Exception as e:  # pylint: disable=broad-except  (the user's module)
        raise UsageError("cannot import %s (%s: %s)" % (module_name, type(e).__name__, e)) from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError("%s has no callable %r" % (module_name, attr))
    return factory


class Case:
    """What the factory gave: the model (kept as the template of every copy), the batch,
    the loss function and the optimizer's constructor."""

    def __init__(self, result):
        make_opt = None
        if isinstance(result, dict):
            unknown = set(result) - {"model", "batch", "loss_fn", "optimizer"}
            if unknown or "model" not in result or "batch" not in result:
                raise UsageError("the factory's dict needs the keys model and batch (and may "
                                 "have loss_fn and optimizer); got %s" % sorted(result))
            model, batch = result["model"], result["batch"]
            loss_fn, make_opt = result.get("loss_fn"), result.get("optimizer")
        elif isinstance(result, (tuple, list)) and len(result) in (2, 3):
            model, batch = result[0], result[1]
            loss_fn = result[2] if len(result) == 3 else None
        else:
            raise UsageError("the factory must return (model, batch), (model, batch, loss_fn) "
                             "or a dict; it returned %s" % type(result).__name__)
        if not isinstance(model, torch.nn.Module):
            raise UsageError("the factory's model is a %s, not a torch.nn.Module"
                             % type(model).__name__)
        for name, fn in (("loss_fn", loss_fn), ("optimizer", make_opt)):
            if fn is not None and not callable(fn):
                raise UsageError("the factory's %s is not callable" % name)
        self.model, self.batch = model, batch
        self.loss_fn = loss_fn or default_loss
        self.make_optimizer = make_opt or (lambda params: torch.optim.AdamW(params, lr=1e-3))


def _call(model, batch):
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) \
        else out.to_tuple() if hasattr(out, "to_tuple") else ()
    for v in values:
        t = _first_tensor(v)
        if t is not None:
            return t
    return None


def default_loss(model, batch):
    """The output's ``.loss`` if it is a tensor, else the mean square of its first
    floating-point tensor."""
    out = _call(model, batch)
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    t = _first_tensor(out)
    if t is None or not t.is_floating_point():
        raise UsageError("the model's output has no .loss and no floating-point tensor; give "
                         "the factory a loss_fn(model, batch)")
    return t.float().square().mean()


class Run:
    """One training of a fresh copy of the template; ``steps()`` yields after each step
    (loss, {name: grad}, {name: parameter}), tensors that the next step does not touch."""

    def __init__(self, case, seed, micro_steps, monitor_args=None):
        self.case, self.seed, self.micro = case, seed, micro_steps
        self.monitor_args = monitor_args
        self.counters = None

    def steps(self, n):
        lockstep.seed_all(self.seed, deterministic=True)
        model = copy.deepcopy(self.case.model)
        model.train()
        opt = self.case.make_optimizer(model.parameters())
        mon = None
        if self.monitor_args is not None:
            mon = lockstep.Monitor(strict=True, **self.monitor_args)
            if not getattr(mon, "enabled", False):
                raise UsageError("the agent did not start (LOCKSTEP_DISABLE?); nothing to check")
            mon.watch(model, optimizer=opt)
        try:
            for _ in range(n):
                losses = []
                for _ in range(self.micro):
                    loss = self.case.loss_fn(model, copy.deepcopy(self.case.batch))
                    loss.backward()
                    losses.append(loss.detach().clone())
                grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()
                         if p.grad is not None}
                opt.step()
                opt.zero_grad()
                params = {name: p.detach().clone() for name, p in model.named_parameters()}
                if mon is not None:
                    mon.step(loss=loss)
                yield torch.stack(losses), grads, params
        finally:
            if mon is not None:
                self.counters = mon.counters()
                mon.close(timeout=0.5)


def _bits(t):
    """`t` as integers of its width, so that equal means the same bits (NaN included)."""
    t = t.detach().reshape(-1)
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
    if t.is_floating_point() and t.element_size() in ints:
        return t.contiguous().view(ints[t.element_size()])
    return t


def tensor_difference(a, b):
    """None when `a` and `b` have the same dtype, shape and bits; else how they differ."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return "%s %s vs %s %s" % (a.dtype, tuple(a.shape), b.dtype, tuple(b.shape))
    if torch.equal(_bits(a), _bits(b)):
        return None
    diff = _bits(a) != _bits(b)
    n = int(diff.sum())
    da, db = a.detach().reshape(-1)[diff].double(), b.detach().reshape(-1)[diff].double()
    delta = (da - db).abs().nan_to_num(nan=float("inf")).max().item()
    return "%d of %d elements differ, max |difference| %.3g" % (n, a.numel(), delta)


def step_difference(ref, got, step):
    """The first difference between two steps' (loss, grads, params), as one phrase."""
    for what, a, b in (("the loss", ref[0], got[0]),):
        d = tensor_difference(a, b)
        if d is not None:
            return "%s at step %d: %s" % (what, step, d)
    for kind, i in (("gradient", 1), ("parameter", 2)):
        names = list(ref[i]) + [n for n in got[i] if n not in ref[i]]
        for name in names:
            if name not in ref[i] or name not in got[i]:
                return "%s of %s at step %d: present in one run only" % (kind, name, step)
            d = tensor_difference(ref[i][name], got[i][name])
            if d is not None:
                return "%s of %s at step %d: %s" % (kind, name, step, d)
    return None


def check(spec, steps=1, micro_steps=1, seed=1234, out=print):
    """Runs the check; prints one line per result; returns the exit status (0 neutral,
    1 a difference or an inconclusive check, 2 a factory that cannot be used)."""
    os.environ.pop("LOCKSTEP_DISABLE", None)  # the check is of the agent that runs
    phase = "without the agent"
    try:
        case = Case(load_factory(spec)())
        reference = list(Run(case, seed, micro_steps).steps(steps))
        for i, got in enumerate(Run(case, seed, micro_steps).steps(steps)):
            d = step_difference(reference[i], got, i)
            if d is not None:
                out("inconclusive: two trainings without the agent already differ (%s); the "
                    "model is not deterministic here, so nothing can be said of the agent" % d)
                return 1
        phase = "with the agent"
        with tempfile.TemporaryDirectory(prefix="lockstep-neutrality-") as tmp:
            run = Run(case, seed, micro_steps, dict(
                run="doctor-neutrality", role="solo", endpoint="ipc://%s/nobody" % tmp,
                close_timeout=0.5))
            with warnings.catch_warnings():  # "nothing reached a collector": by design
                warnings.simplefilter("ignore")
                for i, got in enumerate(run.steps(steps)):
                    d = step_difference(reference[i], got, i)
                    if d is not None:
                        out("NOT neutral: with the agent, %s" % d)
                        return 1
    except UsageError as e:
        out("cannot check: %s" % e)
        return USAGE
    except Exception as e:  # pylint: disable=broad-except  (the user's model, or the agent)
        if phase == "with the agent":
            out("NOT neutral: the training raised %s: %s with the agent, not without it"
                % (type(e).__name__, e))
            return 1
        out("cannot check: the training failed without the agent (%s: %s)"
            % (type(e).__name__, e))
        return USAGE
    c = run.counters or {}
    recorded, errors = c.get("tensors_recorded", 0), c.get("python_errors", 0)
    if recorded == 0 or errors:
        out("inconclusive: the agent recorded %d tensors with %d errors (%s)"
            % (recorded, errors, c.get("last_python_error")))
        return 1
    last = reference[-1]
    out("neutral: loss, %d parameters and %d gradients bit-identical after %s%s "
        "(the agent recorded %d tensors)"
        % (len(last[2]), len(last[1]), "one step" if steps == 1 else "%d steps" % steps,
           "" if micro_steps == 1 else " of %d micro steps each" % micro_steps, recorded))
    return 0
