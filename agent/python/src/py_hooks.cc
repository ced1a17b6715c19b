// The watch() hooks as C callables (py_hooks.h): one Python type, `_core.Hook`, whose
// instances are called by torch through vectorcall; what a call does depends on the
// hook's kind. Each kind is its Python twin's common path, in the same order:
//   forward           _watch.Watch._hook_module's forward_hook
//   input             _watch.Watch._hook_module_inputs's pre_hook
//   act_grad          _session.act_grad_hook
//   param_grad        _session.param_grad_hook
//   param_accumulated _session.param_accumulated_hook
#include "py_hooks.h"

#include <Python.h>

#include <cstddef>
#include <exception>
#include <utility>

#include "lockstep/schema/lockstep_generated.h"
#include "py_portable.h"
#include "py_recorder.h"

namespace lockstep::python {
namespace {

namespace py = pybind11;

constexpr int kAct = static_cast<int>(wire::TensorKind::Act);
constexpr int kActGrad = static_cast<int>(wire::TensorKind::ActGrad);
constexpr int kParamGrad = static_cast<int>(wire::TensorKind::ParamGrad);
constexpr int kActIn = static_cast<int>(wire::TensorKind::ActIn);

enum class Kind { kForward, kInput, kActGrad, kParamGrad, kParamAccumulated };

// What the hooks need of torch, handed over once by _watch at import (hook_setup).
struct Torch {
  PyObject* tensor_type = nullptr;         // torch.Tensor (a plain tensor's exact type)
  PyObject* is_grad_enabled = nullptr;     // torch.is_grad_enabled
  PyObject* graph_task_id = nullptr;       // torch._C._current_graph_task_id
  PyObject* is_compiling = nullptr;        // _watch._IS_COMPILING, or None
  PyObject* has_torch_function = nullptr;  // torch._C._has_torch_function_unary
  PyObject* handle_type = nullptr;         // torch.utils.hooks.RemovableHandle
  PyObject* ordered_dict = nullptr;        // collections.OrderedDict
  bool fast_add = false;  // _watch._ADD_TENSOR_HOOK: a hook may go into _backward_hooks
};
Torch g_torch;

// Attribute names, interned once (a lookup by an interned string is a pointer compare).
struct Names {
  PyObject *active, *closed, *in_bwd, *bwd, *calls, *ident, *pending, *training, *guard,
      *fail, *backward_seen, *seg_params, *is_split, *on_grad_piece, *grad,
      *is_floating_point, *requires_grad, *backward_hooks, *grad_fn, *register_hook_dict,
      *next_id, *register_hook, *rec;
};

const Names& N() {
  static const Names names = [] {
    auto s = [](const char* n) { return PyUnicode_InternFromString(n); };
    return Names{s("active"),        s("closed"),         s("in_bwd"),
                 s("bwd"),           s("calls"),          s("ident"),
                 s("pending"),       s("training"),       s("guard"),
                 s("fail"),          s("backward_seen"),  s("seg_params"),
                 s("is_split"),      s("on_grad_piece"),  s("grad"),
                 s("is_floating_point"), s("requires_grad"), s("_backward_hooks"),
                 s("grad_fn"),       s("_register_hook_dict"), s("next_id"),
                 s("register_hook"), s("rec")};
  }();
  return names;
}

struct Hook {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  Kind kind;
  PyObject* ref;  // weakref to the Session
  // The Session's Recorder as last seen (an identity, not a reference: a hook holds its
  // Session weakly, and so the recorder and its agent) and its C++ part.
  PyObject* rec;
  RecorderCore* core;
  PyObject* name;      // str: the module, output or parameter
  PyObject* root;      // forward, input: the watched model; else nullptr
  // forward: the backward marker hook; param_grad: a weakref to the parameter when its
  // post-accumulate hook is registered too, else None.
  PyObject* extra;
  PyObject* fallback;  // forward, input: the Python hook; else nullptr
  bool want_act, want_grad, marker;
};

extern PyTypeObject HookType;

// An owned reference, released at scope exit (the C API's new references).
class Ref {
 public:
  explicit Ref(PyObject* p = nullptr) : p_(p) {}
  ~Ref() { Py_XDECREF(p_); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  Ref(Ref&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  Ref& operator=(Ref&& o) noexcept {
    if (this != &o) {
      Py_XDECREF(p_);
      p_ = o.p_;
      o.p_ = nullptr;
    }
    return *this;
  }
  PyObject* get() const { return p_; }
  PyObject* Release() {
    PyObject* p = p_;
    p_ = nullptr;
    return p;
  }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  PyObject* p_;
};

// 1, 0, or -1 with an error set: the truth of o.name.
int AttrTrue(PyObject* o, PyObject* name) {
  Ref v(PyObject_GetAttr(o, name));
  return v ? PyObject_IsTrue(v.get()) : -1;
}

// 1, 0, or -1: the truth of fn().
int CallTrue(PyObject* fn) {
  Ref v(PyObject_CallNoArgs(fn));
  return v ? PyObject_IsTrue(v.get()) : -1;
}

// 1, 0, or -1: the truth of o.name().
int CallMethodTrue(PyObject* o, PyObject* name) {
  Ref v(PyObject_CallMethodNoArgs(o, name));
  return v ? PyObject_IsTrue(v.get()) : -1;
}

PyObject* None() { Py_RETURN_NONE; }

// A C++ call into the recorder; false with a Python error set when it threw.
template <typename F>
bool Guarded(F&& f) {
  try {
    f();
    return true;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception in lockstep's recorder");
  }
  return false;
}

// With an error set: an Exception goes to sess.guard.fail(where + name, e) and the hook
// returns None (training goes on); anything else stays raised (NULL), as in Python.
PyObject* Fail(PyObject* sess, const char* where, PyObject* name) {
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;
#if PY_VERSION_HEX >= 0x030C0000
  Ref exc(PyErr_GetRaisedException());
#else
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != nullptr && value != nullptr) PyException_SetTraceback(value, tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
  Ref exc(value);
#endif
  Ref guard(PyObject_GetAttr(sess, N().guard));
  if (!guard) return nullptr;
  Ref where_name(PyUnicode_FromFormat("%s%U", where, name));
  if (!where_name) return nullptr;
  Ref r(PyObject_CallMethodObjArgs(guard.get(), N().fail, where_name.get(),
                                   exc ? exc.get() : Py_None, nullptr));
  return r ? None() : nullptr;
}

// The Session, a new reference: None when the Monitor is gone.
PyObject* SessionOf(const Hook* h) { return PyObject_CallNoArgs(h->ref); }

// The Session's recorder (a new reference), `h->core` its C++ part; NULL on error.
PyObject* RecorderOf(Hook* h, PyObject* sess) {
  PyObject* rec = PyObject_GetAttr(sess, N().rec);
  if (rec == nullptr || rec == h->rec) return rec;
  RecorderCore* core = nullptr;
  if (!Guarded([&] { core = py::handle(rec).cast<RecorderCore*>(); })) {
    Py_DECREF(rec);
    return nullptr;
  }
  h->rec = rec;
  h->core = core;
  return rec;
}

// A gradient hook on a plain tensor: a C++ hook through the torch bridge when one is
// set and the tensor has no Python hooks yet (no hook dict, no Python object of the
// graph node: lockstep/_torch_bridge.h);
// else as _watch._add_hook (straight into its _backward_hooks dict, as
// Tensor.register_hook puts it there, when the import-time check allowed it; else
// register_hook). Either way torch calls `fn` with the gradient. A tensor subclass or an
// active TorchFunctionMode gets register_hook. False with an error set.
bool AddTensorHook(PyObject* t, PyObject* fn) {
  bool plain = reinterpret_cast<PyObject*>(Py_TYPE(t)) == g_torch.tensor_type &&
               g_torch.has_torch_function != Py_None;
  if (plain) {
    Ref has(PyObject_CallOneArg(g_torch.has_torch_function, t));
    if (!has) return false;
    plain = has.get() == Py_False;
  }
  const bridge::Api* b = TorchBridge();
  if (plain && b != nullptr) {
    // Only on a tensor without Python hooks yet: torch runs a node's hook dict where the
    // dict was first made, so after one a user registered before ours (in the module's
    // forward) ours would also run after the user's later hooks, not before them.
    Ref found(PyObject_GetAttr(t, N().backward_hooks));
    if (!found) return false;
    if (found.get() == Py_None && b->add_grad_hook(t, fn) == 1) return true;
  }
  bool fast = plain && g_torch.fast_add;
  if (!fast) {
    Ref r(PyObject_CallMethodOneArg(t, N().register_hook, fn));
    return static_cast<bool>(r);
  }
  Ref found(PyObject_GetAttr(t, N().backward_hooks));
  if (!found) return false;
  PyObject* hooks = found.get();
  Ref made;
  if (hooks == Py_None) {
    Ref fresh(PyObject_CallNoArgs(g_torch.ordered_dict));
    if (!fresh || PyObject_SetAttr(t, N().backward_hooks, fresh.get()) < 0) return false;
    Ref node(PyObject_GetAttr(t, N().grad_fn));
    if (!node) return false;
    if (node.get() != Py_None) {
      Ref r(PyObject_CallMethodOneArg(node.get(), N().register_hook_dict, t));
      if (!r) return false;
    }
    hooks = fresh.get();
    made = std::move(fresh);
  }
  // The id from RemovableHandle's own counter: a handle the user makes later never
  // collides with ours.
  Ref hid(PyObject_GetAttr(g_torch.handle_type, N().next_id));
  if (!hid) return false;
  long long id = PyLong_AsLongLong(hid.get());
  if (id == -1 && PyErr_Occurred()) return false;
  Ref next(PyLong_FromLongLong(id + 1));
  if (!next || PyObject_SetAttr(g_torch.handle_type, N().next_id, next.get()) < 0) return false;
  return PyObject_SetItem(hooks, hid.get(), fn) == 0;
}

PyObject* NewHook(Kind kind, PyObject* ref, PyObject* name);

// ---- forward: a module's output ------------------------------------------------------

PyObject* Fallback(Hook* h, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  return PyObject_Vectorcall(h->fallback, args, nargsf, kwnames);
}

// 1: the Python hook must take this call (checked before any state changes); 0: go on;
// -1: an error. What both the forward and the input hook leave to Python: a call while
// Dynamo traces, inside a backward (checkpointing's recomputation), the first call of
// a new micro step (a forward after a backward).
int LeaveToPython(PyObject* sess) {
  if (g_torch.is_compiling != Py_None) {
    int c = CallTrue(g_torch.is_compiling);
    if (c != 0) return c;
  }
  int b = AttrTrue(sess, N().in_bwd);
  if (b != 0) return b;
  Ref task(PyObject_CallNoArgs(g_torch.graph_task_id));
  if (!task) return -1;
  long long id = PyLong_AsLongLong(task.get());
  if (id == -1 && PyErr_Occurred()) return -1;
  if (id != -1) return 1;
  return AttrTrue(sess, N().bwd);
}

// Session.calls (module name -> calls in this micro step) into `calls`: 0, or 1 when it
// is not a plain dict (the Python hook reads it then), or -1 on error.
int CallsOf(PyObject* sess, Ref* calls) {
  *calls = Ref(PyObject_GetAttr(sess, N().calls));
  if (!*calls) return -1;
  return PyDict_CheckExact(calls->get()) ? 0 : 1;
}

// This module call's number in the micro step, from Session.calls; `count`: take it
// (the forward hook), else only read it (the input hook runs before). -1 on error.
Py_ssize_t CallNumber(PyObject* calls, PyObject* name, bool count) {
  PyObject* v = PyDict_GetItemWithError(calls, name);  // borrowed
  Py_ssize_t n = 0;
  if (v != nullptr) {
    n = PyLong_AsSsize_t(v);
    if (n == -1 && PyErr_Occurred()) return -1;
  } else if (PyErr_Occurred()) {
    return -1;
  }
  if (count) {
    Ref next(PyLong_FromSsize_t(n + 1));
    if (!next || PyDict_SetItem(calls, name, next.get()) < 0) return -1;
  }
  return n;
}

// `name`, or `name#n` for the module's n-th call in the micro step (n > 0).
PyObject* CallName(PyObject* name, Py_ssize_t n) {
  if (n == 0) {
    Py_INCREF(name);
    return name;
  }
  return PyUnicode_FromFormat("%U#%zd", name, n);
}

PyObject* ForwardCall(PyObject* self, PyObject* const* args, size_t nargsf,
                      PyObject* kwnames) {
  Hook* h = reinterpret_cast<Hook*>(self);
  if (PyVectorcall_NARGS(nargsf) != 3 || kwnames != nullptr) {
    return Fallback(h, args, nargsf, kwnames);
  }
  PyObject* output = args[2];
  Ref sess(SessionOf(h));
  if (!sess) return nullptr;
  if (sess.get() == Py_None) return None();
  int on = AttrTrue(sess.get(), N().active);
  if (on > 0) on = AttrTrue(h->root, N().training);
  if (on <= 0) return on < 0 ? nullptr : None();
  int grad_on = CallTrue(g_torch.is_grad_enabled);
  if (grad_on < 0) return nullptr;
  // Under no_grad: reentrant checkpointing's forward, numbered in Python.
  if (grad_on == 0) return Fallback(h, args, nargsf, kwnames);
  bool counts_only = !(h->want_act || h->want_grad || h->marker);
  int leave = LeaveToPython(sess.get());
  if (leave == 0) {  // the rank not yet known: Python asks again
    Ref ident(PyObject_GetAttr(sess.get(), N().ident));
    leave = ident ? AttrTrue(ident.get(), N().pending) : -1;
  }
  if (leave == 0 && !counts_only &&
      reinterpret_cast<PyObject*>(Py_TYPE(output)) != g_torch.tensor_type) {
    leave = 1;  // a tuple, a dict, a subclass: output_tensors, in Python
  }
  Ref calls;
  if (leave == 0) leave = CallsOf(sess.get(), &calls);
  if (leave != 0) {
    return leave < 0 ? Fail(sess.get(), "the forward hook of ", h->name)
                     : Fallback(h, args, nargsf, kwnames);
  }
  Py_ssize_t n = CallNumber(calls.get(), h->name, true);
  if (n < 0) return Fail(sess.get(), "the forward hook of ", h->name);
  if (counts_only) return None();
  Ref rec(RecorderOf(h, sess.get()));
  if (!rec) return Fail(sess.get(), "the forward hook of ", h->name);
  Ref base(CallName(h->name, n));
  if (!base) return Fail(sess.get(), "the forward hook of ", h->name);
  int fp = CallMethodTrue(output, N().is_floating_point);
  if (fp <= 0) return fp < 0 ? Fail(sess.get(), "the forward hook of ", h->name) : None();
  if (h->want_act &&
      !Guarded([&] { h->core->Record(py::handle(rec.get()), py::handle(base.get()), kAct,
                                     py::handle(output)); })) {
    return Fail(sess.get(), "the forward hook of ", h->name);
  }
  int rg = AttrTrue(output, N().requires_grad);
  if (rg < 0) return Fail(sess.get(), "the forward hook of ", h->name);
  if (rg == 0) return None();
  if (h->want_grad) {
    Ref hook(NewHook(Kind::kActGrad, h->ref, base.get()));
    if (hook) {  // the recorder as this hook knows it: no lookup in backward
      reinterpret_cast<Hook*>(hook.get())->rec = h->rec;
      reinterpret_cast<Hook*>(hook.get())->core = h->core;
    }
    if (!hook || !AddTensorHook(output, hook.get())) {
      return Fail(sess.get(), "the forward hook of ", h->name);
    }
  } else if (h->marker && !AddTensorHook(output, h->extra)) {
    return Fail(sess.get(), "the forward hook of ", h->name);
  }
  return None();
}

// ---- input: a module's tensor argument (act_in) --------------------------------------

PyObject* InputCall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Hook* h = reinterpret_cast<Hook*>(self);
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (nargs < 2 || nargs > 3 || kwnames != nullptr) return Fallback(h, args, nargsf, kwnames);
  Ref sess(SessionOf(h));
  if (!sess) return nullptr;
  if (sess.get() == Py_None) return None();
  int on = AttrTrue(sess.get(), N().active);
  if (on > 0) on = AttrTrue(h->root, N().training);
  if (on > 0) on = CallTrue(g_torch.is_grad_enabled);
  if (on <= 0) return on < 0 ? nullptr : None();
  int leave = LeaveToPython(sess.get());
  PyObject* in = args[1];
  PyObject* kwargs = nargs == 3 ? args[2] : Py_None;
  if (leave == 0) {  // only the usual call here: one tensor, no keywords (input_names)
    bool one = PyTuple_CheckExact(in) && PyTuple_GET_SIZE(in) == 1 &&
               reinterpret_cast<PyObject*>(Py_TYPE(PyTuple_GET_ITEM(in, 0))) ==
                   g_torch.tensor_type;
    bool no_kw = kwargs == Py_None || (PyDict_CheckExact(kwargs) && PyDict_GET_SIZE(kwargs) == 0);
    if (!one || !no_kw) leave = 1;
  }
  Ref calls;
  if (leave == 0) leave = CallsOf(sess.get(), &calls);
  if (leave != 0) {
    return leave < 0 ? Fail(sess.get(), "the input hook of ", h->name)
                     : Fallback(h, args, nargsf, kwnames);
  }
  // The forward hook numbers this call after it.
  Py_ssize_t n = CallNumber(calls.get(), h->name, false);
  if (n < 0) return Fail(sess.get(), "the input hook of ", h->name);
  PyObject* t = PyTuple_GET_ITEM(in, 0);
  int fp = CallMethodTrue(t, N().is_floating_point);
  if (fp <= 0) return fp < 0 ? Fail(sess.get(), "the input hook of ", h->name) : None();
  Ref base(CallName(h->name, n));
  Ref rec(base ? RecorderOf(h, sess.get()) : nullptr);
  if (!rec ||
      !Guarded([&] { h->core->Record(py::handle(rec.get()), py::handle(base.get()), kActIn,
                                     py::handle(t)); })) {
    return Fail(sess.get(), "the input hook of ", h->name);
  }
  return None();
}

// ---- gradients -----------------------------------------------------------------------

// 1 when the Session records now (active, not closed); 0; -1 on error.
int Recording(PyObject* sess) {
  int on = AttrTrue(sess, N().active);
  if (on <= 0) return on;
  int closed = AttrTrue(sess, N().closed);
  return closed < 0 ? -1 : !closed;
}

// A gradient hook fired: a backward is running (Session.backward_seen, once a pass).
bool SeeBackward(PyObject* sess) {
  int in = AttrTrue(sess, N().in_bwd);
  if (in != 0) return in > 0;
  Ref r(PyObject_CallMethodNoArgs(sess, N().backward_seen));
  return static_cast<bool>(r);
}

PyObject* GradCall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Hook* h = reinterpret_cast<Hook*>(self);
  if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != nullptr) {
    PyErr_SetString(PyExc_TypeError, "lockstep's gradient hook takes one tensor");
    return nullptr;
  }
  PyObject* grad = args[0];
  Ref sess(SessionOf(h));
  if (!sess) return nullptr;
  if (sess.get() == Py_None) return None();
  if (h->kind == Kind::kParamAccumulated) {  // `grad` is the parameter here
    int on = Recording(sess.get());
    if (on <= 0) return on < 0 ? Fail(sess.get(), "the gradient hook of ", h->name) : None();
    Ref rec(RecorderOf(h, sess.get()));
    Ref g(rec ? PyObject_GetAttr(grad, N().grad) : nullptr);
    if (!g || !Guarded([&] { h->core->ParamAccumulated(py::handle(rec.get()), py::handle(h->name),
                                                      py::handle(g.get())); })) {
      return Fail(sess.get(), "the gradient hook of ", h->name);
    }
    return None();
  }
  if (h->kind == Kind::kParamGrad) {
    // A gradient in pieces (reentrant checkpointing): summed in Python, as there.
    int seg = AttrTrue(sess.get(), N().seg_params);
    if (seg < 0) return nullptr;
    if (seg > 0) {
      Ref split(PyObject_CallMethodOneArg(sess.get(), N().is_split, h->name));
      if (!split) return nullptr;
      int is = PyObject_IsTrue(split.get());
      if (is < 0) return nullptr;
      if (is > 0) {
        Ref r(PyObject_CallMethodObjArgs(sess.get(), N().on_grad_piece, h->name, grad, nullptr));
        return r ? None() : nullptr;
      }
    }
  }
  if (!SeeBackward(sess.get())) return Fail(sess.get(), "the gradient hook of ", h->name);
  int on = Recording(sess.get());
  if (on <= 0) return on < 0 ? Fail(sess.get(), "the gradient hook of ", h->name) : None();
  Ref rec(RecorderOf(h, sess.get()));
  if (!rec) return Fail(sess.get(), "the gradient hook of ", h->name);
  bool ok;
  if (h->kind == Kind::kActGrad || h->extra == Py_None) {
    int kind = h->kind == Kind::kActGrad ? kActGrad : kParamGrad;
    ok = Guarded([&] { h->core->Record(py::handle(rec.get()), py::handle(h->name), kind,
                                       py::handle(grad)); });
  } else {
    Ref p(PyObject_CallNoArgs(h->extra));
    bool fresh = false;
    if (p && p.get() != Py_None) {
      Ref held(PyObject_GetAttr(p.get(), N().grad));
      ok = static_cast<bool>(held);
      fresh = ok && held.get() == Py_None;
    } else {
      ok = static_cast<bool>(p);
    }
    ok = ok && Guarded([&] { h->core->RecordParamGrad(py::handle(rec.get()), py::handle(h->name),
                                                      py::handle(grad), fresh); });
  }
  return ok ? None() : Fail(sess.get(), "the gradient hook of ", h->name);
}

// ---- the type ------------------------------------------------------------------------

int Traverse(PyObject* self, visitproc visit, void* arg) {
  Hook* h = reinterpret_cast<Hook*>(self);
  Py_VISIT(h->ref);
  Py_VISIT(h->name);
  Py_VISIT(h->root);
  Py_VISIT(h->extra);
  Py_VISIT(h->fallback);
  return 0;
}

int Clear(PyObject* self) {
  Hook* h = reinterpret_cast<Hook*>(self);
  Py_CLEAR(h->ref);
  Py_CLEAR(h->name);
  Py_CLEAR(h->root);
  Py_CLEAR(h->extra);
  Py_CLEAR(h->fallback);
  h->rec = nullptr;
  h->core = nullptr;
  return 0;
}

void Dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  Clear(self);
  PyObject_GC_Del(self);
}

PyObject* Repr(PyObject* self) {
  static const char* const kWhat[] = {"forward", "input", "act_grad", "param_grad",
                                      "param_accumulated"};
  Hook* h = reinterpret_cast<Hook*>(self);
  return PyUnicode_FromFormat("<lockstep %s hook of %R>", kWhat[static_cast<int>(h->kind)],
                              h->name == nullptr ? Py_None : h->name);
}

// Any call through tp_call (a caller without vectorcall) goes to the same function.
PyObject* Call(PyObject* self, PyObject* args, PyObject* kwargs) {
  return PyVectorcall_Call(self, args, kwargs);
}

// Copied as a Python function is (a model copied with its hooks, an EMA copy, shares
// them, as it shared the Python hooks); pickled as a hook that does nothing
// (py_portable.h).
PyMethodDef kMethods[] = {
    {"__copy__", SameHook, METH_NOARGS, "The hook itself (as for a function)"},
    {"__deepcopy__", SameHook, METH_O, "The hook itself (as for a function)"},
    {"__reduce__", ReduceHook, METH_NOARGS,
     "Pickled as a hook that does nothing (contextlib.nullcontext().__exit__)"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject HookType = {PyVarObject_HEAD_INIT(nullptr, 0)};

bool ReadyType() {
  static bool ready = false;
  if (ready) return true;
  HookType.tp_name = "lockstep._core.Hook";
  HookType.tp_doc = "A watch() hook of lockstep, in C (agent/python/src/py_hooks.h)";
  HookType.tp_basicsize = sizeof(Hook);
  HookType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  HookType.tp_vectorcall_offset = offsetof(Hook, vectorcall);
  HookType.tp_call = Call;
  HookType.tp_traverse = Traverse;
  HookType.tp_clear = Clear;
  HookType.tp_dealloc = Dealloc;
  HookType.tp_repr = Repr;
  HookType.tp_methods = kMethods;
  if (PyType_Ready(&HookType) < 0 || !MarkTorchUnserializable(&HookType)) return false;
  ready = true;
  return true;
}

PyObject* NewHook(Kind kind, PyObject* ref, PyObject* name) {
  Hook* h = PyObject_GC_New(Hook, &HookType);
  if (h == nullptr) return nullptr;
  h->kind = kind;
  h->vectorcall = kind == Kind::kForward ? ForwardCall
                  : kind == Kind::kInput ? InputCall
                                         : GradCall;
  Py_INCREF(ref);
  h->ref = ref;
  h->rec = nullptr;
  h->core = nullptr;
  Py_INCREF(name);
  h->name = name;
  h->root = nullptr;
  h->extra = nullptr;
  h->fallback = nullptr;
  h->want_act = h->want_grad = h->marker = false;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(h));
  return reinterpret_cast<PyObject*>(h);
}

PyObject* Owned(PyObject* p) {
  Py_XINCREF(p);
  return p;
}

// A hook made from Python (watch() time).
py::object Make(Kind kind, py::handle ref, py::handle name) {
  if (!ReadyType()) throw py::error_already_set();
  if (!PyUnicode_Check(name.ptr())) throw py::type_error("a hook's name is a str");
  PyObject* h = NewHook(kind, ref.ptr(), name.ptr());
  if (h == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(h);
}

}  // namespace

void BindHooks(py::module_& m) {
  if (!ReadyType()) throw py::error_already_set();
  m.attr("Hook") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&HookType));
  m.def(
      "hook_setup",
      [](py::handle tensor_type, py::handle is_grad_enabled, py::handle graph_task_id,
         py::handle is_compiling, py::handle has_torch_function, py::handle handle_type,
         py::handle ordered_dict, bool fast_add) {
        // Once, at _watch's import; kept for the process's life.
        g_torch = Torch{Owned(tensor_type.ptr()), Owned(is_grad_enabled.ptr()),
                        Owned(graph_task_id.ptr()), Owned(is_compiling.ptr()),
                        Owned(has_torch_function.ptr()), Owned(handle_type.ptr()),
                        Owned(ordered_dict.ptr()), fast_add};
      },
      "What the C hooks need of torch (lockstep._watch, at import)");
  m.def(
      "forward_hook",
      [](py::handle ref, py::handle root, py::handle name, bool want_act,
         bool want_grad, bool marker, py::handle mark, py::handle fallback) {
        py::object o = Make(Kind::kForward, ref, name);
        Hook* h = reinterpret_cast<Hook*>(o.ptr());
        h->root = Owned(root.ptr());
        h->extra = Owned(mark.ptr());
        h->fallback = Owned(fallback.ptr());
        h->want_act = want_act;
        h->want_grad = want_grad;
        h->marker = marker;
        return o;
      },
      "The forward hook of a watched module (_watch.Watch._hook_module)");
  m.def(
      "input_hook",
      [](py::handle ref, py::handle root, py::handle name,
         py::handle fallback) {
        py::object o = Make(Kind::kInput, ref, name);
        Hook* h = reinterpret_cast<Hook*>(o.ptr());
        h->root = Owned(root.ptr());
        h->fallback = Owned(fallback.ptr());
        return o;
      },
      "The input hook of a watched module (_watch.Watch._hook_module_inputs)");
  m.def(
      "act_grad_hook",
      [](py::handle ref, py::handle name) {
        return Make(Kind::kActGrad, ref, name);
      },
      "_session.act_grad_hook, bound to its Session and output name");
  m.def(
      "param_grad_hook",
      [](py::handle ref, py::handle name, py::handle param_ref) {
        py::object o = Make(Kind::kParamGrad, ref, name);
        reinterpret_cast<Hook*>(o.ptr())->extra = Owned(param_ref.ptr());
        return o;
      },
      "_session.param_grad_hook, bound to its Session, parameter name and weak parameter");
  m.def(
      "param_accumulated_hook",
      [](py::handle ref, py::handle name) {
        return Make(Kind::kParamAccumulated, ref, name);
      },
      "_session.param_accumulated_hook, bound to its Session and parameter name");
}

}  // namespace lockstep::python
