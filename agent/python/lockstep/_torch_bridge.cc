// lockstep._torch_bridge: the table of _torch_bridge.h, read from the at::Tensor behind
// a torch.Tensor. Built against the job's own torch by `python -m lockstep build-bridge`
// (lockstep._bridge), which passes LOCKSTEP_TORCH_VERSION: the torch.__version__ it was
// built for. Importing it under any other torch raises ImportError, before its table can
// be used (lockstep._bridge also looks for it only where that torch's build goes).
//
// Every fact is what the tensor's Python attribute returns (torch's bindings call the
// same at::Tensor methods), so the recorder's results do not depend on whether the
// bridge is there; tests/python/test_torch_bridge.py checks that on every kind of
// tensor the recorder meets.
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/version.h>

#include <cstring>
#include <memory>

#include "_torch_bridge.h"

#ifndef LOCKSTEP_TORCH_VERSION
#error "LOCKSTEP_TORCH_VERSION (torch.__version__ of the torch built against) must be defined"
#endif

namespace {

namespace lb = lockstep::bridge;

PyObject* g_tensor_type = nullptr;     // torch.Tensor
PyObject* g_parameter_type = nullptr;  // torch.nn.Parameter

// The at::Tensor of `o` when it is a torch.Tensor or nn.Parameter (not a subclass:
// those may answer attributes in Python), else nullptr.
const at::Tensor* Plain(PyObject* o) {
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(o));
  if (type != g_tensor_type && type != g_parameter_type) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(o);
  return t.defined() ? &t : nullptr;
}

int Read(PyObject* o, lb::TensorFacts* out) {
  try {
    const at::Tensor* tp = Plain(o);
    if (tp == nullptr) return 0;
    const at::Tensor& t = *tp;
    if (t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return 0;
    std::memset(out, 0, sizeof *out);
    out->dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
    out->is_cpu = t.is_cpu();
    if (!out->is_cpu) return 1;
    if (t.layout() != c10::kStrided || !t.has_storage()) return 0;
    int64_t ndim = t.dim();
    if (ndim > lb::kMaxDims) return 0;
    out->strided = 1;
    out->ndim = static_cast<int32_t>(ndim);
    out->has_version = !t.is_inference();
    if (out->has_version) out->version = static_cast<int64_t>(t._version());
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    // Read only: a copy-on-write tensor stays shared (data_ptr(), which Python's
    // attribute calls, would copy it); the same pointer for every other tensor.
    out->data = reinterpret_cast<uintptr_t>(t.const_data_ptr());
#else
    out->data = reinterpret_cast<uintptr_t>(t.data_ptr());
#endif
    out->numel = static_cast<uint64_t>(t.numel());
    out->contiguous = t.is_contiguous();
    for (int64_t i = 0; i < ndim; ++i) {
      out->sizes[i] = t.size(i);
      out->strides[i] = t.stride(i);
    }
    return 1;
  } catch (...) {  // a tensor this build cannot read: Python reads it
    return 0;
  }
}

int Version(PyObject* o, int64_t* out) {
  try {
    const at::Tensor* tp = Plain(o);
    if (tp == nullptr || tp->is_inference()) return 0;
    *out = static_cast<int64_t>(tp->_version());
    return 1;
  } catch (...) {
    return 0;
  }
}

// The GIL for this scope, from any thread (autograd runs hooks without it).
class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

// A Python callable owned by a C++ hook. The hook goes with the graph, which autograd
// may free on a thread without the GIL, or after the interpreter is gone (then it leaks,
// as torch's own Python hooks do).
struct Owned {
  PyObject* fn;
  explicit Owned(PyObject* f) : fn(f) { Py_INCREF(f); }
  ~Owned() {
    if (Py_IsInitialized()) {
      Gil gil;
      Py_DECREF(fn);
    }
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
};

int AddGradHook(PyObject* o, PyObject* fn) {
#if TORCH_VERSION_MAJOR < 2
  (void)o;
  (void)fn;
  return 0;
#else
  try {
    const at::Tensor* tp = Plain(o);
    // Only a graph node's output: on a leaf torch keeps C++ and Python hooks in one list
    // that registering either kind clears (a user's register_hook would drop ours).
    if (tp == nullptr || !tp->requires_grad() || !tp->grad_fn()) return 0;
    auto owned = std::make_shared<Owned>(fn);
    tp->register_hook([owned](const at::Tensor& grad) {
      if (!grad.defined()) return;
      Gil gil;
      PyObject* g = THPVariable_Wrap(grad);
      if (g == nullptr) throw python_error();
      PyObject* r = PyObject_CallOneArg(owned->fn, g);
      Py_DECREF(g);
      if (r == nullptr) throw python_error();  // raised again in backward()'s caller
      Py_DECREF(r);
    });
    return 1;
  } catch (...) {
    PyErr_Clear();
    return 0;
  }
#endif
}

lb::Api g_api = {lb::kAbi, sizeof(lb::Api), &Read, &Version, &AddGradHook};

// A new reference to module.attr, or nullptr with an error set.
PyObject* Imported(const char* module, const char* attr) {
  PyObject* m = PyImport_ImportModule(module);
  if (m == nullptr) return nullptr;
  PyObject* a = PyObject_GetAttrString(m, attr);
  Py_DECREF(m);
  return a;
}

PyModuleDef g_def = {PyModuleDef_HEAD_INIT, "_torch_bridge",
                     "lockstep's reads of torch tensors from C++ (lockstep._bridge)", -1,
                     nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__torch_bridge() {
  PyObject* version = Imported("torch", "__version__");
  if (version == nullptr) return nullptr;
  const char* running = PyUnicode_AsUTF8(version);
  if (running == nullptr || std::strcmp(running, LOCKSTEP_TORCH_VERSION) != 0) {
    PyErr_Format(PyExc_ImportError,
                 "lockstep's torch bridge was built for torch %s, not this torch %s",
                 LOCKSTEP_TORCH_VERSION, running == nullptr ? "?" : running);
    Py_DECREF(version);
    return nullptr;
  }
  Py_DECREF(version);
  g_tensor_type = Imported("torch", "Tensor");
  if (g_tensor_type == nullptr) return nullptr;
  g_parameter_type = Imported("torch.nn.parameter", "Parameter");
  if (g_parameter_type == nullptr) return nullptr;
  PyObject* m = PyModule_Create(&g_def);
  if (m == nullptr) return nullptr;
  PyObject* capsule = PyCapsule_New(&g_api, lb::kCapsuleName, nullptr);
  if (capsule == nullptr || PyModule_AddObject(m, "api", capsule) < 0 ||
      PyModule_AddStringConstant(m, "torch_version", LOCKSTEP_TORCH_VERSION) < 0) {
    Py_XDECREF(capsule);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
