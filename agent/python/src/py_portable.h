// How lockstep's hooks travel with a model they are registered on: copied, and pickled.
//
// A watched model is copied (copy.deepcopy for an EMA model) and pickled whole
// (torch.save(model), or a checkpoint dict that holds the model, as many training
// scripts save one) while lockstep's hooks sit in its hook dicts. torch pickles a
// module's hook dicts with the rest of its state, so a hook that cannot be pickled
// (a C object, a closure, a functools.partial over a weak reference) made torch.save
// raise into the training job.
//
//  - copied: a hook gives itself, as a Python function does (the copy shares it);
//  - pickled: a hook becomes one that does nothing and needs nothing of lockstep to
//    load, contextlib.nullcontext().__exit__ (any arguments, returns None); the saved
//    model computes as the watched one did and is not watched once loaded, as torch
//    drops a tensor's hooks when it pickles the tensor;
//  - on a tensor: torch's "backward hook ... will not be serialized" warning is not for
//    them (__torch_unserializable__).
//
// The C hooks (py_hooks.cc) do this themselves; _core.portable_hook(fn) wraps a Python
// hook of lockstep's (torch < 2.0's module hooks, the root's input hook, the optimizer's
// step hook, capture's and zoom's hooks) in a C callable that does it and calls `fn`
// through vectorcall (no Python frame of its own).
#ifndef LOCKSTEP_AGENT_PYTHON_PY_PORTABLE_H_
#define LOCKSTEP_AGENT_PYTHON_PY_PORTABLE_H_

#include <Python.h>
#include <pybind11/pybind11.h>

namespace lockstep::python {

// __copy__ and __deepcopy__ of a hook type: the hook itself (a new reference).
PyObject* SameHook(PyObject* self, PyObject* unused);
// __reduce__ of a hook type: the do-nothing hook above, as pickle's (callable, args).
PyObject* ReduceHook(PyObject* self, PyObject* unused);
// Sets `type.__torch_unserializable__ = True` on a readied type; false with an error set.
bool MarkTorchUnserializable(PyTypeObject* type);

// Binds _core.portable_hook(fn).
void BindPortable(pybind11::module_& m);

}  // namespace lockstep::python

#endif  // LOCKSTEP_AGENT_PYTHON_PY_PORTABLE_H_
