"""watch(): the hooks that find the tensors of a training step.

- module outputs: a forward hook per selected module (``register_forward_hook``);
- gradients w.r.t. module outputs: ``Tensor.register_hook`` on each output that
  requires grad, registered by that forward hook (works on torch 1.13 and 2.x, unlike
  full backward hooks, and sees every element of tuple/dict outputs); on torch 1.13 an
  output changed in place (``nn.ReLU(inplace=True)``) is hooked on its graph node
  instead, so its gradient is that of the tensor the module returned (``_grad_hook``);
- parameter gradients: ``Tensor.register_hook`` on each selected parameter; the hook
  sees this backward's gradient, so with gradient accumulation every micro step is
  recorded as its own micro step;
- parameters and optimizer state (optional): read at ``Monitor.step()``.

A forward pass is recorded only while grad mode is on and the watched model is in
training mode: ``torch.no_grad()`` / ``inference_mode`` / ``model.eval()`` passes are
not training steps. A forward that follows a backward in the same step starts a new
micro step (gradient accumulation); a forward inside backward (activation
checkpointing's recomputation) does not, and is not recorded twice: a call keeps the
number its forward gave it (reentrant checkpointing: lockstep._checkpoint), and a
parameter whose gradient comes in pieces (one per graph) is recorded once. Hooks run on the training thread or autograd's
threads, always under the GIL. Under ``torch.compile`` the forward hooks run eagerly
(``torch.compiler.disable``: a graph break at each watched module), since Dynamo cannot
trace lockstep's Python.

On torch >= 2.0 the hooks registered are C callables (_core.forward_hook, input_hook and
the gradient hooks: agent/python/src/py_hooks.h) that do the common path of the Python
hooks below, and call them for the rest (_c_hooks). A change to a hook here is made in
its C twin too; tests/python/test_c_hooks.py compares the two.
"""
import functools
import importlib
import sys
import weakref

import torch

from lockstep import _bridge, _core, _session
from lockstep._names import NameFilter, input_names, module_name, output_tensors
from lockstep._recorder import KIND

# torch >= 2.0: the running backward's id, -1 outside backward. torch 1.13 has none; there
# Session.in_bwd (first gradient hook .. end-of-backward callback) says the same.
_GRAPH_TASK_ID = getattr(torch._C, "_current_graph_task_id", None) or (lambda: -1)


def _in_backward(sess):
    """The hooks run on every watched call write this out (a Python call costs
    ~0.2 us there)."""
    return sess.in_bwd or _GRAPH_TASK_ID() != -1


def _compile_parts():
    """(is_compiling, disable) of this torch, or (None, None) where it has no
    torch.compile (torch 1.13). Dynamo answers True to is_compiling while it traces;
    is_dynamo_compiling (torch >= 2.3) is one Python frame, is_compiling two."""
    compiler = getattr(torch, "compiler", None)
    disable = getattr(compiler, "disable", None)
    is_compiling = getattr(compiler, "is_dynamo_compiling", None) or getattr(
        compiler, "is_compiling", None)
    if disable is None:
        try:
            dynamo = importlib.import_module("torch._dynamo")
            disable = dynamo.disable
            is_compiling = getattr(dynamo, "is_compiling", None)
        except Exception:  # pylint: disable=broad-except  (torch < 2.0)
            return None, None
    if is_compiling is None:  # no way to ask: always run the disabled hook
        return (lambda: True), disable
    return is_compiling, disable


# Under torch.compile the hooks run eagerly: Dynamo would otherwise trace lockstep's
# Python, and fail on it. Each hook starts with
#     if _IS_COMPILING is not None and _IS_COMPILING(): return eager(...)
# where eager = _eager(hook): while Dynamo traces, the hook calls its disabled self (a
# graph break; run eagerly, where _IS_COMPILING() is False and the hook itself runs).
# The check is written into the hooks, not wrapped around them: a wrapper was one more
# Python frame and an argument tuple on every watched call (~0.3 us, measured on torch
# 2.11, CPU), and torch.compiler.disable's own wrapper costs ~4 us a call even when
# nothing is compiled.
_IS_COMPILING, _DISABLE = _compile_parts()
# torch.export (torch >= 2.4) traces the model with fake tensors, outside Dynamo in its
# default (non-strict) mode: nothing of such a call is a training step, and a fake
# tensor has no data to read. The hooks that see one (the C hooks hand any tensor
# subclass to these Python twins) record nothing while it traces.
_IS_EXPORTING = getattr(getattr(torch, "compiler", None), "is_exporting", None)


def _eager(fn):
    """`fn` made to run eagerly when Dynamo traces a call of it (see above)."""
    if _DISABLE is None:
        return fn
    try:
        return _DISABLE(fn)
    except Exception:  # pylint: disable=broad-except
        return fn


def _portable(fn):
    """A Python hook as lockstep registers it on a model or optimizer: copied with them as
    a function is, pickled (torch.save(model)) as a hook that does nothing, so a watched
    model can be saved whole and loaded without lockstep (agent/python/src/py_portable.h).
    The C hooks (_core.Hook) do this themselves."""
    return fn if isinstance(fn, _core.Hook) else _core.portable_hook(fn)


def _pre_hook(module, fn):
    """Registers fn(module, args, kwargs=None) as a forward pre-hook; torch < 2.0 has no
    kwargs there, and fn gets the positional ones."""
    try:  # torch >= 2.0: kwargs too
        return module.register_forward_pre_hook(_portable(fn), with_kwargs=True)
    except TypeError:
        return module.register_forward_pre_hook(_portable(lambda m, args: fn(m, args)))


# torch < 2.0 keeps a tensor's hooks on the graph node it had when its first hook was
# registered: a hook registered after an in-place op (``nn.ReLU(inplace=True)``'s output,
# a block ending in ``out += identity``) then gets the gradient of the value before the
# op. There the gradient of a changed output is taken from its current node instead.
_HOOKS_FOLLOW_INPLACE = int(torch.__version__.split(".")[0]) >= 2


def _tensor_hook_adder():
    """A function add(t, fn) that registers `fn` as a gradient hook of the plain
    torch.Tensor `t` (one that requires grad) as Tensor.register_hook does, without the
    handle we would throw away; None when this torch does not keep tensor hooks the way
    that function expects (then Tensor.register_hook is used).

    Tensor.register_hook is Python: beyond what it must do (put the hook in the tensor's
    `_backward_hooks` dict, tying a new dict to its graph node) it checks for
    __torch_function__ and builds a RemovableHandle, ~1-2 us of the ~3 it takes
    (measured on torch 1.13 and 2.11, CPU). We never remove these hooks (they go with
    the tensor), and call it on every watched output of every recorded step. The id is
    taken from RemovableHandle's own counter, so a handle the user makes later never
    collides with ours. Checked at import on a real tensor: the dict, the node's method,
    the counter, and a hook added this way running in backward."""
    try:
        from torch.utils.hooks import RemovableHandle  # pylint: disable=import-outside-toplevel
        from collections import OrderedDict  # pylint: disable=import-outside-toplevel
        if not isinstance(getattr(RemovableHandle, "next_id", None), int):
            return None

        def add(t, fn):
            hooks = t._backward_hooks
            if hooks is None:
                hooks = OrderedDict()
                t._backward_hooks = hooks
                node = t.grad_fn
                if node is not None:
                    node._register_hook_dict(t)
            hid = RemovableHandle.next_id
            RemovableHandle.next_id = hid + 1
            hooks[hid] = fn

        seen = []
        leaf = torch.ones(2, requires_grad=True)
        probe = leaf * 2
        if probe.__class__ is not torch.Tensor or probe._backward_hooks is not None:
            return None
        add(probe, seen.append)
        user = probe.register_hook(lambda g: None)  # a user's handle after ours
        user.remove()
        probe.sum().backward()
        if len(seen) != 1 or not torch.equal(seen[0], torch.ones(2)):
            return None
        return add
    except Exception:  # pylint: disable=broad-except
        return None


_ADD_TENSOR_HOOK = _tensor_hook_adder()
# A tensor subclass or an active TorchFunctionMode may want to see register_hook.
_HAS_TORCH_FUNCTION = getattr(torch._C, "_has_torch_function_unary", None)
if _HAS_TORCH_FUNCTION is None:
    _ADD_TENSOR_HOOK = None


def _c_hooks():
    """(modules, parameters): whether the hooks of modules (forward and input) and of
    parameters (gradient, post-accumulate) are the C ones (_core.forward_hook, ...:
    agent/python/src/py_hooks.h). A C module hook takes the common path without a Python
    frame, calling the recorder's C++ directly, and calls its Python twin here for the
    rest. Where torch keeps a tensor's hooks on its first graph node (torch < 2.0) the
    Python module hooks do it all (_grad_hook's node hooks); the parameters' hooks are C
    on every torch. The C hooks are told here, once, what they call of torch."""
    try:
        from torch.utils.hooks import RemovableHandle  # pylint: disable=import-outside-toplevel
        from collections import OrderedDict  # pylint: disable=import-outside-toplevel
        _core.hook_setup(torch.Tensor, torch.is_grad_enabled, _GRAPH_TASK_ID, _IS_COMPILING,
                         _HAS_TORCH_FUNCTION, RemovableHandle, OrderedDict,
                         _ADD_TENSOR_HOOK is not None)
    except Exception:  # pylint: disable=broad-except
        return False, False
    return _HOOKS_FOLLOW_INPLACE, True


_C_HOOKS, _C_PARAM_HOOKS = _c_hooks()
# The recorder reads tensors through the torch bridge built for this torch, if any.
_bridge.install()


def _add_hook(t, fn):
    """t.register_hook(fn), the handle dropped; faster on plain tensors: a C++ hook
    through the torch bridge (torch >= 2.0, lockstep._bridge) while the tensor has no
    Python hooks (torch runs a hook dict where it was first made: after one a user
    registered before ours, a C++ hook would run after the user's later hooks too), else
    straight into the tensor's hook dict (above). A subclass or an active
    TorchFunctionMode gets register_hook. The C hooks do the same (py_hooks.cc,
    AddTensorHook)."""
    if (_HAS_TORCH_FUNCTION is not None and t.__class__ is torch.Tensor
            and not _HAS_TORCH_FUNCTION(t)):
        if t._backward_hooks is None and _core.bridge_add_grad_hook(t, fn):
            return
        if _ADD_TENSOR_HOOK is not None:
            _ADD_TENSOR_HOOK(t, fn)
            return
    t.register_hook(fn)


def _grad_hook(t, fn):
    """Calls fn(gradient of `t` as the module returned it) in backward."""
    if _HOOKS_FOLLOW_INPLACE:  # before t.grad_fn: building that object costs, per output
        _add_hook(t, fn)
        return
    node = t.grad_fn
    if node is None or t._version == 0:
        _add_hook(t, fn)
        return
    nr = t.output_nr

    def node_hook(_grad_inputs, grad_outputs):
        g = grad_outputs[nr] if nr < len(grad_outputs) else None
        if g is not None:
            fn(g)

    node.register_hook(node_hook)


def _join(path, child):
    return "%s.%s" % (path, child) if path else child


def _compiled_wrapped(model):
    """{path of a torch.compile wrapper (OptimizedModule) in `model`: the module it
    wraps}; a feature check (torch 1.13 has none)."""
    found = {}
    for path, m in model.named_modules():
        orig = getattr(m, "_orig_mod", None)
        if isinstance(orig, torch.nn.Module) and type(m).__name__ == "OptimizedModule":
            found[path] = orig
    return found


# "act_in": what each watched module (but the root) received, its floating-point tensor
# arguments, every step: an op whose inputs agree between two runs while its output does
# not is where an error is born (docs/rules.md "Where the error is born"). An input that
# is the tensor recorded just before it (the previous module's output: the usual case) is
# sent as a repeat, its statistics computed once.
# "input": the watched model's forward inputs every step (the data fed to it); "init":
# every parameter once, before the first update, recorded as kind "param" at the first
# step (docs/python.md "Run fingerprint"). With params=True the first step's "param"
# rows are the parameters after its update, as at every step, and "init" is not taken.
DEFAULT_KINDS = ("act", "act_grad", "param_grad", "loss", "input", "init", "act_in")
ALL_KINDS = ("act", "act_grad", "param_grad", "param", "optim", "loss", "input", "init",
             "act_in")
_INPUT_NAME = "input"


class Watch:
    """The hooks of one watch() call; remove() takes them all out. The hooks reach the
    Monitor's Session through a weak reference only (lockstep._session)."""

    def __init__(self, session, model, optimizer, include, exclude, kinds, params,
                 optim_state):
        kinds = {kinds} if isinstance(kinds, str) else set(kinds)
        if params:
            kinds.add("param")
        if optim_state:
            kinds.add("optim")
        unknown = kinds - set(ALL_KINDS)
        if unknown:
            raise ValueError("lockstep: unknown tensor kind(s) %s in kinds=; use some of %s"
                             % (sorted(unknown), ", ".join(ALL_KINDS)))
        if not isinstance(model, torch.nn.Module):
            raise ValueError("lockstep: watch() needs a torch.nn.Module, got %s"
                             % type(model).__name__)
        self.kinds = kinds
        self.rec = session.rec
        self.model = model
        self.optimizer = optimizer
        self.handles = []       # taken out of torch's tables on unrecorded steps
        self._fixed = []        # the optimizer's: always in
        self._out = None        # while out: what set_in(True) puts back
        filt = NameFilter(include, exclude)
        self.params = [(n, p) for n, p in model.named_parameters()
                       if p.requires_grad and filt(n)]
        self._param_names = {id(p): n for n, p in model.named_parameters()}
        self._paths = frozenset(module_name(path) for path, _ in model.named_modules())
        # torch.compile's wrapper (OptimizedModule) holds the model as `_orig_mod`, whose
        # output is the wrapper's: it is not hooked (the collector strips `_orig_mod.`
        # from its children's names, and a second row of the same output would take
        # the wrapper's name), and the wrapper is typed as what it wraps, so a compiled
        # run records the rows of an eager one.
        wrapped = _compiled_wrapped(model)
        session.rec.module_types.update(
            (module_name(path), type(wrapped.get(path, m)).__name__)
            for path, m in model.named_modules() if path not in self._skipped(wrapped))
        want_act, want_grad = "act" in kinds, "act_grad" in kinds
        want_in = "act_in" in kinds
        ref = session.ref
        self._hook_inputs(ref, len(session.watches), model, "input" in kinds)
        skipped = self._skipped(wrapped)
        owned = self._owned(session, model, "param_grad" in kinds)
        for path, module in model.named_modules():
            if path in skipped:
                continue
            own = owned.get(id(module), ())
            if module is model:
                # Always hooked: its forward hook is what starts a new micro step after a
                # backward, even when its own output is not recorded.
                root_ok = filt(module_name(path))
                # Its output always gets a gradient hook or a marker: the first hook of
                # a backward, which tells recomputation in backward from a new forward.
                self._hook_module(ref, module, module_name(path), want_act and root_ok,
                                  want_grad and root_ok, True, own)
                continue
            ok = filt(path)
            # The forward hook also numbers the calls, for the input hook's names and for
            # a parameter whose gradient may come in pieces (Session.is_split). Not for
            # the parameters alone: a hook on every module would cost torch's hook
            # dispatch on every call (docs/python.md "Limits").
            if (want_act or want_grad or want_in) and ok:
                self._hook_module(ref, module, path, want_act, want_grad, False, own)
            if want_in and ok:
                self._hook_module_inputs(ref, module, path)
        if "param_grad" in kinds:
            # With a host statistics thread, a CPU parameter's gradient can be handed to
            # it once autograd has made it the parameter's .grad (torch >= 2.1's
            # post-accumulate hook; Recorder.record_param_grad says why then only).
            defer = self.rec.has_worker
            for name, p in self.params:
                post = defer and p.is_cpu and hasattr(p, "register_post_accumulate_grad_hook")
                # _session.param_grad_hook and param_accumulated_hook, in C (_c_hooks).
                p_ref = weakref.ref(p) if post else None
                self.handles.append(p.register_hook(
                    _core.param_grad_hook(ref, name, p_ref) if _C_PARAM_HOOKS
                    else _portable(functools.partial(_session.param_grad_hook, ref, name,
                                                     p_ref))))
                if post:
                    self.handles.append(p.register_post_accumulate_grad_hook(
                        _core.param_accumulated_hook(ref, name) if _C_PARAM_HOOKS
                        else _portable(functools.partial(_session.param_accumulated_hook,
                                                         ref, name))))
        # torch >= 2.0: the optimizer tells us when it is about to step, which is the one
        # moment the accumulated gradients of a gradient-accumulation step are all there.
        if optimizer is not None and hasattr(optimizer, "register_step_pre_hook"):
            self._fixed.append(optimizer.register_step_pre_hook(
                _portable(functools.partial(_session.optimizer_step_hook, ref))))

    def _owned(self, session, model, want_pgrad):
        """{id(module): names of the watched parameters it holds itself}; also notes
        each such parameter's modules in session.param_owners (a tied weight has
        several)."""
        if not want_pgrad:
            return {}
        watched = {id(p): n for n, p in self.params}
        owned = {}
        owners = session.param_owners
        for path, module in model.named_modules():
            names = tuple(watched[id(p)] for p in module.parameters(recurse=False)
                          if id(p) in watched)
            if names:
                owned[id(module)] = names
                for n in names:
                    owners[n] = owners.get(n, ()) + (module_name(path),)
        return owned

    @staticmethod
    def _skipped(wrapped):
        """The paths of the modules torch.compile wrappers hold (``_orig_mod``)."""
        return frozenset(_join(path, "_orig_mod") for path in wrapped)

    def _hook_module(self, ref, module, name, want_act, want_grad, marker, own=()):
        root = self.model
        paths = self._paths
        rec = self.rec
        act = KIND["act"]
        on_grad = functools.partial(_session.act_grad_hook, ref)
        mark = functools.partial(_session.backward_marker_hook, ref)

        counts_only = not (want_act or want_grad or marker)

        def forward_hook(_module, _inputs, output):
            if _IS_COMPILING is not None and _IS_COMPILING():
                return eager(_module, _inputs, output)
            if _IS_EXPORTING is not None and _IS_EXPORTING():
                return None
            sess = ref()
            if sess is None or not sess.active or not root.training:
                return None
            if not torch.is_grad_enabled():
                # Reentrant checkpointing runs a segment's forward under no_grad: the call
                # takes its number now, and is recorded when backward runs it again.
                if not _in_backward(sess):
                    try:
                        sess.segment_call(name, own)
                    except Exception as e:  # pylint: disable=broad-except
                        sess.guard.fail("the forward hook of " + name, e)
                return None
            if sess.ident.pending:  # the process group may have appeared since
                sess.check_identity()
            try:
                if sess.in_bwd or _GRAPH_TASK_ID() != -1:  # _in_backward, written out
                    # Recomputation inside backward (activation checkpointing): the same
                    # micro step. A call its forward recorded is not recorded again (its
                    # gradient hooks are live); one the forward ran under no_grad
                    # (reentrant) is recorded now, once, under its forward's number.
                    r = sess.recomputed_call(name, True)
                    if r is None:
                        return None
                    n, again = r
                else:
                    again = False
                    if sess.bwd:
                        sess.new_micro()
                    calls = sess.calls
                    n = calls.get(name, 0)
                    calls[name] = n + 1
                if counts_only:
                    return None
                base = name if n == 0 else "%s#%d" % (name, n)
                if isinstance(output, torch.Tensor):
                    items = ((base, output),)
                else:
                    items = []
                    output_tensors(output, base, items, 0, paths)
                marked = not marker  # one backward marker is enough
                for item_name, t in items:
                    if not t.is_floating_point():
                        continue
                    if want_act and not again:
                        rec.record(item_name, act, t)
                    if t.requires_grad:
                        if want_grad:
                            _grad_hook(t, functools.partial(on_grad, item_name))
                        elif not marked:
                            _add_hook(t, mark)
                            marked = True
            except Exception as e:  # pylint: disable=broad-except
                sess.guard.fail("the forward hook of " + name, e)
            return None

        eager = _eager(forward_hook)
        hook = forward_hook
        if _C_HOOKS:  # the common path in C, the rest in forward_hook (_c_hooks)
            hook = _core.forward_hook(ref, root, name, want_act, want_grad, marker, mark,
                                      forward_hook)
        self.handles.append(module.register_forward_hook(_portable(hook)))

    def _hook_module_inputs(self, ref, module, name):
        """A forward pre-hook on a module (not the root): its floating-point tensor
        arguments as kind "act_in", named like its output (``name``, with the call
        suffix the forward hook will give it); several tensors by where they were passed:
        ``name(0)``, ``name(1)``, ``name(key)`` (_names.input_names; keywords on torch
        >= 2.0 only). Recomputation inside backward records only the calls its forward
        did not (as the forward hook decides)."""
        root = self.model
        rec = self.rec
        kind = KIND["act_in"]

        def pre_hook(_module, args, kwargs=None):
            if _IS_COMPILING is not None and _IS_COMPILING():
                return eager(_module, args, kwargs)
            if _IS_EXPORTING is not None and _IS_EXPORTING():
                return None
            sess = ref()
            if sess is None or not sess.active or not root.training or not torch.is_grad_enabled():
                return None
            try:
                # The forward hook counts this call after it; the same decision as its.
                if sess.in_bwd or _GRAPH_TASK_ID() != -1:  # _in_backward, written out
                    # Recomputation inside backward: recorded only if the forward did not
                    # see this call (reentrant checkpointing runs it under no_grad).
                    r = sess.recomputed_call(name, False)
                    if r is None or r[1]:
                        return None
                    n = r[0]
                else:
                    if sess.bwd:
                        sess.new_micro()
                    n = sess.calls.get(name, 0)
                base = name if n == 0 else "%s#%d" % (name, n)
                for item_name, t in input_names(base, args, kwargs):
                    rec.record(item_name, kind, t)
            except Exception as e:  # pylint: disable=broad-except
                sess.guard.fail("the input hook of " + name, e)
            return None

        eager = _eager(pre_hook)
        hook = _core.input_hook(ref, root, name, pre_hook) if _C_HOOKS else pre_hook
        self.handles.append(_pre_hook(module, hook))

    def _hook_inputs(self, ref, n, model, want_input):
        """A forward pre-hook on the root: the data fed to the model (its tensor args
        and kwargs, integer token ids as float32) as kind "input", every watched step;
        at the first forward also the autocast state for the fingerprint."""
        root = model
        rec = self.rec
        kind = KIND["input"]
        # A second watched model's inputs: input2[0], ... (its own names); `n` watches
        # came before this one.
        base = _INPUT_NAME if n == 0 else "%s%d" % (_INPUT_NAME, n + 1)

        def pre_hook(_module, args, kwargs=None):
            if _IS_COMPILING is not None and _IS_COMPILING():
                return eager(_module, args, kwargs)
            if _IS_EXPORTING is not None and _IS_EXPORTING():
                return None
            sess = ref()
            if sess is None or not sess.active or not root.training or not torch.is_grad_enabled():
                return None
            if _in_backward(sess):
                return None  # recomputation inside backward: its inputs were recorded
            if sess.ident.pending:  # the process group may have appeared since
                sess.check_identity()
            try:
                if sess.bwd:
                    sess.new_micro()
                if sess.init_pending is not None:  # watch() came before the rank was known
                    pending, sess.init_pending = sess.init_pending, None
                    pending.record_initial()
                if not sess.amp_seen:
                    sess.note_first_forward()
                if not want_input:
                    return None
                items = []
                output_tensors(tuple(args), base, items)
                if kwargs:
                    output_tensors(dict(kwargs), base, items)
                for item_name, t in items:
                    if not t.is_floating_point():
                        if t.is_complex():
                            continue
                        t = t.to(torch.float32)
                    rec.record(item_name, kind, t.detach())
            except Exception as e:  # pylint: disable=broad-except
                sess.guard.fail("the input hook of the watched model", e)
            return None

        eager = _eager(pre_hook)
        self.handles.append(_pre_hook(model, pre_hook))

    def record_initial(self):
        """Every parameter once, before the first update (kind "param" at the current
        step): initial weights are compared before anything else."""
        if "init" not in self.kinds or "param" in self.kinds:
            return
        rec = self.rec
        kind = KIND["param"]
        for name, p in self.model.named_parameters():
            if p.is_floating_point():
                rec.record(name, kind, p.detach())

    def record_step_end(self):
        """Parameters and optimizer state at Monitor.step() (after the update)."""
        rec = self.rec
        if "param" in self.kinds:
            kind = KIND["param"]
            for name, p in self.params:
                rec.record(name, kind, p.detach())
        if "optim" in self.kinds and self.optimizer is not None:
            kind = KIND["optim"]
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    state = self.optimizer.state.get(p)
                    pname = self._param_names.get(id(p))
                    if not state or pname is None:
                        continue
                    for key, value in state.items():
                        if (isinstance(value, torch.Tensor) and value.is_floating_point()
                                and value.dim() > 0):
                            rec.record("%s.%s" % (pname, key), kind, value.detach())

    def set_in(self, on):
        """Puts this watch's module and parameter hooks in torch's hook tables (`on`:
        a recorded step) or takes them out (a step watch(every=N) or the collector's
        sampling leaves out). Out, a module with no other hooks takes torch's fast path
        (no hook dispatch at all), so an unrecorded step costs nothing; in, each hook
        goes back to the place it had among the other hooks of its table (the user's,
        DDP's, FSDP's), so the order hooks run in never changes. The caller keeps them
        in under torch.compile (HookSwitch says why)."""
        if on == (self._out is None):
            return
        if not on:
            saved, orders = [], {}
            for h in self.handles:
                for d in _hook_tables(h):
                    if h.id in d:
                        if id(d) not in orders:
                            orders[id(d)] = (d, {k: i for i, k in enumerate(d)})
                        saved.append((d, h.id, d.pop(h.id)))
            self._out = (saved, list(orders.values()))
            return
        saved, orders = self._out
        self._out = None
        for d, hid, hook in saved:
            d[hid] = hook
        for d, pos in orders:
            # A hook registered while ours were out goes after the ones it found.
            keys = sorted(d, key=lambda k, pos=pos, n=len(pos): pos.get(k, n))
            if keys != list(d):
                items = [(k, d[k]) for k in keys]
                d.clear()
                d.update(items)

    def remove(self):
        self._out = None
        for h in self.handles + self._fixed:
            h.remove()
        self.handles = []
        self._fixed = []


def _dynamo_frames():
    """Frames torch.compile (Dynamo) has compiled in this process so far; 0 when it was
    never used (torch 1.13 has none), 1 when the count cannot be read."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    try:
        return int(utils.counters["frames"]["total"])
    except Exception:  # pylint: disable=broad-except
        return 1


class HookSwitch:
    """Takes the watches' hooks out of torch's tables for the steps that are not
    recorded, and puts them back for those that are (Watch.set_in), at each step
    boundary.

    Not under torch.compile: Dynamo does not guard on a module's hooks (its
    ``skip_nnmodule_hook_guards``), so a model runs the hooks it had when it was compiled,
    whatever was added or removed since. Once Dynamo has compiled anything in the
    process the hooks stay in for good (an unrecorded step then costs what it cost
    before: torch's hook dispatch and hooks that return at once). A new watch() leaves
    its hooks in for its first step, where a model compiled at its first call is
    compiled with them. If Dynamo compiles while they are out all the same (a model first
    called later, on an unrecorded step), that code would never call them: its cache is
    reset once (one recompilation, with the hooks in), with a warning."""

    def __init__(self, warn):
        self._warn = warn
        self._pinned = False  # Dynamo was seen: hooks in for good
        self._out = False     # the last sync took them out
        self._frames = 0

    def sync(self, watches, recorded):
        frames = _dynamo_frames()
        if frames:
            if self._out and frames != self._frames and not self._pinned:
                self._reset_dynamo()
            self._pinned = True
        self._frames = frames
        want = recorded or self._pinned
        for w in watches:
            w.set_in(want)
        self._out = not want

    def _reset_dynamo(self):
        try:
            importlib.import_module("torch._dynamo").reset()
            self._warn("torch.compile compiled code during a step lockstep does not "
                       "record (watch(every=N) or the collector's sampling), while its hooks "
                       "were out; lockstep reset torch.compile's cache so that the model is "
                       "compiled again with them (once), and keeps them in from now on")
        except Exception as e:  # pylint: disable=broad-except
            self._warn("torch.compile compiled code while lockstep's hooks were out "
                       "and its cache could not be reset (%s); a model compiled then may not be "
                       "recorded: watch it with every=1" % e)


def _hook_tables(handle):
    """The dicts a torch RemovableHandle removes its hook from: its table and, on
    torch >= 2.0, the tables of the hook's flags (with_kwargs, always_call)."""
    tables = [handle.hooks_dict_ref()]
    tables.extend(ref() for ref in getattr(handle, "extra_dict_ref", ()) or ())
    return [d for d in tables if d is not None]


def sampling(patterns, watches, replicas=None):
    """(include, exclude, kinds) of the wire's Sampling for these watches: the include
    and exclude patterns of each watch() (several: each in (?:...), joined by |; an
    include that is empty in one watch means all) and the kinds they record ("init" is
    recorded as "param"; "grad_reduced" when `replicas`, the replica check, runs)."""
    def joined(i, empty_means_all):
        ps = [getattr(p[i], "pattern", p[i]) or "" for p in patterns]
        if empty_means_all and "" in ps:
            return ""
        ps = [p for p in ps if p]
        return ps[0] if len(ps) == 1 else "|".join("(?:%s)" % p for p in ps)
    kinds = {KIND["param"] if k == "init" else KIND[k]
             for w in watches for k in w.kinds if k == "init" or k in KIND}
    if replicas is not None and replicas.checks(watches):
        kinds.add(KIND["grad_reduced"])
    return joined(0, True), joined(1, False), sorted(kinds)
