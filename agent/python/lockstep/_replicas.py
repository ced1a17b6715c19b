"""The replica check (docs/python.md "The replica check"; the collector's rule
``replicas``, docs/rules.md): after DistributedDataParallel's gradient all-reduce every
rank holds the same gradient, bit for bit. Every M-th recorded step, at the optimizer's
pre-step (``Optimizer.register_step_pre_hook``, torch >= 2.0, the hook lockstep._watch
registers when watch() is given the optimizer), each rank records every watched
parameter's ``.grad`` as kind ``grad_reduced``; the collector compares the ranks.

Recording stays per rank otherwise: the ``param_grad`` hooks see each rank's local
gradient, before the all-reduce, which is what tells which rank's data or op parts
first. Cost: one read of every watched gradient every M recorded steps.

Called on the training thread (the optimizer's step), under the GIL.
"""
import torch

from lockstep._recorder import KIND

_GRAD_REDUCED = KIND["grad_reduced"]
_DDP = getattr(getattr(torch.nn, "parallel", None), "DistributedDataParallel", None)


def _data_parallel():
    """Whether this process is one rank of several (torch.distributed initialized)."""
    dist = getattr(torch, "distributed", None)
    try:
        return (dist is not None and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() > 1)
    except Exception:  # pylint: disable=broad-except  (a backend that cannot say)
        return False


def _checked(watch, optimizer):
    """Whether `watch` is of a DistributedDataParallel model stepped by `optimizer`."""
    # torch.compile(ddp) wraps it: the model it compiles is the DDP module.
    model = getattr(watch.model, "_orig_mod", watch.model)
    return watch.optimizer is optimizer and isinstance(model, _DDP)


class ReplicaCheck:
    """When the check is due and what it records. `every` (M, 0 = off) counts recorded
    steps: the check runs at the steps divisible by M x `stride` (watch(every=N)), so
    every rank checks the same steps whatever the collector's own sampling does (a step
    it leaves unrecorded is not checked). `flush` launches the device pipeline's batch:
    the gradients' statistics are computed at once, before the optimizer or zero_grad
    can change .grad in place, in one batch of their own."""

    __slots__ = ("every", "stride", "flush")

    def __init__(self, every, flush):
        self.every = every
        self.stride = 1
        self.flush = flush

    def due(self, step):
        m = self.every
        return m > 0 and step % (m * self.stride) == 0

    def checks(self, watches):
        """Whether the check runs in this job: on, and some watch is of a
        DistributedDataParallel model (torch.distributed up, more than one rank) with an
        optimizer whose pre-step hook it can use. For the wire's Sampling, which then
        lists kind grad_reduced."""
        if self.every <= 0 or _DDP is None or not _data_parallel():
            return False
        return any(w.optimizer is not None and _checked(w, w.optimizer)
                   and hasattr(w.optimizer, "register_step_pre_hook") for w in watches)

    def run(self, session, optimizer):
        """Records the watched parameters' gradients of each watch of a
        DistributedDataParallel model that steps with `optimizer` (in each watch's
        parameter order: the collector names the first that differs)."""
        if _DDP is None or not _data_parallel():
            return
        rec = session.rec
        on_device = False
        for w in session.watches:
            if not _checked(w, optimizer):
                continue
            for name, p in w.params:
                g = p.grad
                if g is None or g.is_sparse:
                    continue
                rec.record(name, _GRAD_REDUCED, g.detach())
                on_device = on_device or not g.is_cpu
        if on_device:
            self.flush()
