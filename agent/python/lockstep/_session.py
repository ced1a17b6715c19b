"""Session: what a Monitor shares with the hooks of its watch() calls (lockstep._watch).

The hooks read and change only this object: the recorder, the guard, whether this step
is recorded, and where the step is (a backward seen, inside a backward, the calls of
each module in this micro step). The Monitor owns its Session and nothing else does:
hooks reach it through ``Session.ref`` (a weak reference, as torch's RemovableHandle
holds its hooks dict), so a model that outlives its Monitor does not keep it alive, and
its hooks become no-ops once the Monitor is gone (``ref()`` is then None).

Hooks run on the training thread or autograd's threads, always under the GIL.
"""
import weakref

import torch

from lockstep import _checkpoint
from lockstep._recorder import KIND

_ACT_GRAD, _PARAM_GRAD = KIND["act_grad"], KIND["param_grad"]


class Session:
    """The state the hooks share with their Monitor (see the module doc)."""

    __slots__ = ("rec", "guard", "ident", "active", "closed", "bwd", "in_bwd", "calls",
                 "recalls", "segments", "cursor", "done", "seg_params", "split", "pieces",
                 "param_owners", "watches", "init_pending", "amp_seen", "accum_grad_norm",
                 "replicas", "_identity_check", "_first_forward", "ref", "__weakref__")

    def __init__(self, rec, guard, ident, identity_check, first_forward):
        self.rec = rec
        self.guard = guard
        self.ident = ident
        self.active = True
        self.closed = False
        self.bwd = False     # a backward hook fired since the last forward
        self.calls = {}      # module name -> calls in this micro step
        # Inside a backward pass (from its first hook to the end-of-backward callback): a
        # forward hook firing then is activation checkpointing's recomputation.
        self.in_bwd = False
        self.recalls = {}    # module name -> calls recomputed in this backward
        # Reentrant checkpointing (lockstep._checkpoint): id(segment ctx) -> {module
        # name: the call numbers its calls took in forward, in order}; cursor: (id(ctx),
        # name) -> how many of them this backward has recomputed; done: the (id(ctx),
        # name), index pairs recorded in this micro step (a second backward through a
        # retained graph recomputes them again: their outputs were recorded).
        self.segments = {}
        self.cursor = {}
        self.done = set()
        # Parameters of modules called inside a reentrant segment in this micro step;
        # `split`, those of them used by two calls or more (computed at their first
        # gradient): their gradient comes in pieces, one per graph (the segment's own
        # backward, the outer one), summed in `pieces` (name -> sum so far) and recorded
        # once when the backward ends.
        self.seg_params = set()
        self.split = None
        self.pieces = {}
        self.param_owners = {}  # watched parameter name -> names of the modules holding it
        self.watches = []    # the Watch of each watch() call
        # A Watch whose initial weights wait for the first forward: the rank was not
        # known at watch(), and nothing may go out before it is (_identity.py).
        self.init_pending = None
        self.amp_seen = False  # the first watched forward read the autocast state
        self.accum_grad_norm = None  # set by the optimizer pre-step hook (torch >= 2.0)
        # The replica check (lockstep._replicas.ReplicaCheck), run by that hook; or None.
        self.replicas = None
        # The Monitor's own work, called back weakly (no reference to the Monitor).
        self._identity_check = identity_check
        self._first_forward = first_forward
        self.ref = weakref.ref(self)

    def check_identity(self):
        """The rank again (the process group may have appeared since watch())."""
        fn = self._identity_check()
        if fn is not None:
            fn(release=False)

    def note_first_forward(self):
        self.amp_seen = True
        fn = self._first_forward()
        if fn is not None:
            fn()

    def _clear_calls(self):
        self.calls.clear()
        self.recalls.clear()
        self.segments.clear()
        self.cursor.clear()
        self.done.clear()
        self.seg_params.clear()
        self.split = None
        self.pieces.clear()  # only a backward cut short leaves any

    def new_step(self, every, step):
        self.accum_grad_norm = None
        self._clear_calls()
        self.bwd = False
        self.in_bwd = False  # no backward spans step() (one cut short never called back)
        self.active = step % every == 0

    def new_micro(self):
        self.rec.new_micro()
        self._clear_calls()
        self.bwd = False

    def segment_call(self, name, params):
        """A watched module's call under no_grad in training mode. Inside a reentrant
        checkpoint's forward it takes its call number now, in forward order, kept for
        its recomputation in backward; `params`, the watched parameters it holds, may
        get their gradient in pieces. Any other no_grad call is no training step."""
        ctx = _checkpoint.segment(_checkpoint.FORWARD)
        if ctx is None:
            return
        if self.bwd:
            self.new_micro()
        n = self.calls.get(name, 0)
        self.calls[name] = n + 1
        self.segments.setdefault(id(ctx), {}).setdefault(name, []).append(n)
        if params:
            self.seg_params.update(params)
            self.split = None

    def recomputed_call(self, name, take):
        """(call number, again) of a module's call run again inside backward, or None
        when it is not to be recorded (its forward recorded it: non-reentrant
        checkpointing); `again`: an earlier backward of this micro step recorded its
        outputs (only their gradients are new). take=False peeks (the input hook, before
        the forward hook takes it)."""
        if self.segments:
            ctx = _checkpoint.segment(_checkpoint.BACKWARD)
            seg = None if ctx is None else self.segments.get(id(ctx))
            if seg is not None:
                numbers = seg.get(name, ())
                key = (id(ctx), name)
                i = self.cursor.get(key, 0)
                if i >= len(numbers):
                    return None
                again = (key, i) in self.done
                if take:
                    self.cursor[key] = i + 1
                    self.done.add((key, i))
                return numbers[i], again
        # No segment known (the frames were not found): calls the forward counted are
        # skipped, the others numbered after them.
        n = self.recalls.get(name, 0)
        if take:
            self.recalls[name] = n + 1
        return None if n < self.calls.get(name, 0) else (n, False)

    def is_split(self, name):
        """Whether parameter `name`'s gradient comes in pieces in this micro step."""
        split = self.split
        if split is None:
            owners, calls = self.param_owners, self.calls
            split = self.split = frozenset(
                p for p in self.seg_params
                if sum(calls.get(m, 0) for m in owners.get(p, ())) >= 2)
        return name in split

    def backward_seen(self):
        """A gradient hook fired: a backward pass is running. Once per pass, asks
        autograd to say when it ends (until then forward hooks are recomputation)."""
        self.bwd = True
        if not self.in_bwd:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
                self.in_bwd = True
            except Exception:  # pylint: disable=broad-except  (not inside a backward)
                pass

    def _backward_done(self):
        self.in_bwd = False
        self.recalls.clear()
        self.cursor.clear()
        if self.pieces:
            pieces, self.pieces = self.pieces, {}
            for name, grad in pieces.items():
                try:
                    if self.active and not self.closed:
                        self.rec.record(name, _PARAM_GRAD, grad)
                except Exception as e:  # pylint: disable=broad-except
                    self.guard.fail("the gradient hook of " + name, e)

    def on_grad_piece(self, name, grad):
        """One piece of a split parameter's gradient (is_split): summed, in the order
        backward produces them, and recorded when the backward ends."""
        try:
            if not self.in_bwd:
                self.backward_seen()
            if self.active and not self.closed:
                pieces = self.pieces
                held = pieces.get(name)
                pieces[name] = grad if held is None else held + grad
        except Exception as e:  # pylint: disable=broad-except
            self.guard.fail("the gradient hook of " + name, e)

    def on_backward_marker(self):
        try:
            if not self.in_bwd:
                self.backward_seen()
        except Exception as e:  # pylint: disable=broad-except
            self.guard.fail("the backward marker hook", e)

    def on_optimizer_step(self, optimizer):
        """Before the update: every M-th recorded step of a data-parallel job, the
        replica check (lockstep._replicas); on a gradient-accumulation step (micro steps
        > 1), the global norm of the accumulated gradients, kept on their device (no
        sync)."""
        try:
            if self.closed:
                return
            replicas = self.replicas
            if replicas is not None and self.active and replicas.due(self.rec.step):
                replicas.run(self, optimizer)
            if self.rec.micro == 0:
                return
            # Per-tensor norms in the gradient's own precision (no float64 copy of every
            # gradient), combined in float64.
            norms = [torch.linalg.vector_norm(p.grad.detach()).double()
                     for group in optimizer.param_groups for p in group["params"]
                     if p.grad is not None and not p.grad.is_sparse]
            if norms:
                devices = {n.device for n in norms}
                if len(devices) == 1:
                    self.accum_grad_norm = torch.linalg.vector_norm(torch.stack(norms))
        except Exception as e:  # pylint: disable=broad-except
            self.guard.fail("the optimizer step hook", e)


# Hooks that hold the Session weakly: torch keeps these (partials of module functions
# and a weak reference), never a bound method of the Monitor or the Session.

# The gradient hooks below run once per recorded gradient (hundreds a step): each does
# its Session's work itself rather than calling a method that does (a Python frame is
# ~0.2 us, a measurable part of a small tensor's record). Their C twins
# (agent/python/src/py_hooks.cc: _core.act_grad_hook, param_grad_hook,
# param_accumulated_hook) are what watch() registers; these are the Python forward
# hook's (act_grad_hook, for the outputs it names itself) and the reference the C ones
# are tested against (tests/python/test_c_hooks.py). A change here is made there too.

def act_grad_hook(ref, name, grad):
    s = ref()
    if s is None:
        return
    try:
        if not s.in_bwd:
            s.backward_seen()
        if s.active and not s.closed:
            s.rec.record(name, _ACT_GRAD, grad)
    except Exception as e:  # pylint: disable=broad-except
        s.guard.fail("the gradient hook of " + name, e)


def param_grad_hook(ref, name, param_ref, grad):
    """A parameter's gradient, before autograd accumulates it into .grad
    (Recorder.record_param_grad). `param_ref`: a weak reference to the parameter when
    its post-accumulate hook is registered too (param_accumulated_hook), else None."""
    s = ref()
    if s is None:
        return
    if s.seg_params and s.is_split(name):
        s.on_grad_piece(name, grad)
        return
    try:
        if not s.in_bwd:
            s.backward_seen()
        if s.active and not s.closed:
            if param_ref is None:  # record_param_grad would only call this
                s.rec.record(name, _PARAM_GRAD, grad)
            else:
                p = param_ref()
                s.rec.record_param_grad(name, grad, p is not None and p.grad is None)
    except Exception as e:  # pylint: disable=broad-except
        s.guard.fail("the gradient hook of " + name, e)


def param_accumulated_hook(ref, name, param):
    s = ref()
    if s is not None:
        try:
            if s.active and not s.closed:
                s.rec.param_accumulated(name, param.grad)
        except Exception as e:  # pylint: disable=broad-except
            s.guard.fail("the gradient hook of " + name, e)


def backward_marker_hook(ref, _grad):
    s = ref()
    if s is not None:
        s.on_backward_marker()


def optimizer_step_hook(ref, optimizer, _args, _kwargs):
    s = ref()
    if s is not None:
        s.on_optimizer_step(optimizer)
