// The hooks lockstep._watch puts on a watched model, as C callables: the forward hook of
// a module, the input (forward pre-) hook of a module, and the gradient hooks of an
// output and of a parameter. Each does what its Python twin in _watch.py / _session.py
// does on the common path, and calls RecorderCore (py_recorder.h) directly.
//
// Why: torch calls a hook at every watched call and every recorded gradient, hundreds
// of times a step. A Python hook paid an interpreted frame, its attribute lookups and
// pybind11's dispatch into the recorder each time (~1% of a resnet18 step on CPU:
// docs/python.md "The per-tensor cost"); these pay a vectorcall and the C-API reads of
// the same attributes.
//
// Only the common path is here. Whenever a forward or input hook meets anything else
// (torch.compile tracing, no_grad, inside a backward, a new micro step, the rank not
// yet known, an output that is not one plain tensor, several arguments), it calls its
// Python twin (`fallback`) with the same arguments before changing any state, so the
// rare paths (checkpointing's recomputation, tuple outputs, compile) are the Python
// code they always were. The gradient hooks have no rare path but a parameter whose
// gradient comes in pieces (Session.on_grad_piece, called as Python does).
//
// Errors: an Exception raised inside goes to the Session's guard (guard.fail(where, e))
// as in Python; a BaseException that is not an Exception (KeyboardInterrupt) goes on
// up, as in Python.
//
// Threads: called by torch under the GIL (the training thread, autograd's threads).
// The objects they hold are traversed by Python's GC: a forward hook holds its model
// (the root), which holds the hook.
#ifndef LOCKSTEP_AGENT_PYTHON_PY_HOOKS_H_
#define LOCKSTEP_AGENT_PYTHON_PY_HOOKS_H_

#include <pybind11/pybind11.h>

namespace lockstep::python {

// Binds _core.hook_setup and the hooks' factories: forward_hook, input_hook,
// act_grad_hook, param_grad_hook, param_accumulated_hook (at the end of py_hooks.cc).
void BindHooks(pybind11::module_& m);

}  // namespace lockstep::python

#endif  // LOCKSTEP_AGENT_PYTHON_PY_HOOKS_H_
