// py_portable.h: copying and pickling lockstep's hooks, and the wrapper for the Python
// ones.
#include "py_portable.h"

#include <structmember.h>

#include <cstddef>

namespace lockstep::python {

PyObject* SameHook(PyObject* self, PyObject*) {
  Py_INCREF(self);
  return self;
}

PyObject* ReduceHook(PyObject*, PyObject*) {
  PyObject* contextlib = PyImport_ImportModule("contextlib");
  if (contextlib == nullptr) return nullptr;
  PyObject* ctx = PyObject_CallMethod(contextlib, "nullcontext", nullptr);
  Py_DECREF(contextlib);
  if (ctx == nullptr) return nullptr;
  PyObject* builtins = PyEval_GetBuiltins();  // borrowed
  PyObject* getattr = builtins == nullptr ? nullptr : PyDict_GetItemString(builtins, "getattr");
  if (getattr == nullptr) {
    Py_DECREF(ctx);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "no builtins.getattr");
    return nullptr;
  }
  // getattr(nullcontext(), "__exit__"), called when the pickle is loaded.
  PyObject* r = Py_BuildValue("(O(Os))", getattr, ctx, "__exit__");
  Py_DECREF(ctx);
  return r;
}

bool MarkTorchUnserializable(PyTypeObject* type) {
  if (PyDict_SetItemString(type->tp_dict, "__torch_unserializable__", Py_True) < 0) return false;
  PyType_Modified(type);
  return true;
}

namespace {

struct Portable {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* fn;  // the Python hook
};

PyObject* PortableCall(PyObject* self, PyObject* const* args, size_t nargsf,
                       PyObject* kwnames) {
  return PyObject_Vectorcall(reinterpret_cast<Portable*>(self)->fn, args, nargsf, kwnames);
}

int PortableTraverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(reinterpret_cast<Portable*>(self)->fn);
  return 0;
}

int PortableClear(PyObject* self) {
  Py_CLEAR(reinterpret_cast<Portable*>(self)->fn);
  return 0;
}

void PortableDealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  PortableClear(self);
  PyObject_GC_Del(self);
}

PyObject* PortableRepr(PyObject* self) {
  return PyUnicode_FromFormat("<lockstep hook %R>", reinterpret_cast<Portable*>(self)->fn);
}

PyMethodDef kPortableMethods[] = {
    {"__copy__", SameHook, METH_NOARGS, "The hook itself (as for a function)"},
    {"__deepcopy__", SameHook, METH_O, "The hook itself (as for a function)"},
    {"__reduce__", ReduceHook, METH_NOARGS,
     "Pickled as a hook that does nothing (contextlib.nullcontext().__exit__)"},
    {nullptr, nullptr, 0, nullptr}};

PyMemberDef kPortableMembers[] = {
    {"__wrapped__", T_OBJECT, offsetof(Portable, fn), READONLY, "The Python hook"},
    {nullptr, 0, 0, 0, nullptr}};

PyTypeObject PortableType = {PyVarObject_HEAD_INIT(nullptr, 0)};

bool ReadyPortable() {
  static bool ready = false;
  if (ready) return true;
  PortableType.tp_name = "lockstep._core.PortableHook";
  PortableType.tp_doc = "A Python hook of lockstep's, copied and pickled as its C hooks are";
  PortableType.tp_basicsize = sizeof(Portable);
  PortableType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  PortableType.tp_vectorcall_offset = offsetof(Portable, vectorcall);
  PortableType.tp_call = PyVectorcall_Call;
  PortableType.tp_traverse = PortableTraverse;
  PortableType.tp_clear = PortableClear;
  PortableType.tp_dealloc = PortableDealloc;
  PortableType.tp_repr = PortableRepr;
  PortableType.tp_methods = kPortableMethods;
  PortableType.tp_members = kPortableMembers;
  if (PyType_Ready(&PortableType) < 0 || !MarkTorchUnserializable(&PortableType)) return false;
  ready = true;
  return true;
}

}  // namespace

void BindPortable(pybind11::module_& m) {
  m.def(
      "portable_hook",
      [](pybind11::handle fn) {
        if (!ReadyPortable()) throw pybind11::error_already_set();
        if (!PyCallable_Check(fn.ptr())) throw pybind11::type_error("a hook is callable");
        Portable* p = PyObject_GC_New(Portable, &PortableType);
        if (p == nullptr) throw pybind11::error_already_set();
        p->vectorcall = PortableCall;
        Py_INCREF(fn.ptr());
        p->fn = fn.ptr();
        PyObject_GC_Track(reinterpret_cast<PyObject*>(p));
        return pybind11::reinterpret_steal<pybind11::object>(reinterpret_cast<PyObject*>(p));
      },
      pybind11::arg("fn"),
      "`fn`, a Python hook of lockstep's, copied and pickled as its C hooks are "
      "(py_portable.h)");
}

}  // namespace lockstep::python
