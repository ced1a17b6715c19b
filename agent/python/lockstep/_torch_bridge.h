// The torch bridge's table: what lockstep._core (built once, against no torch) asks of
// the extension lockstep._torch_bridge (built against the job's own torch by
// `python -m lockstep build-bridge`, _torch_bridge.cc beside this file).
//
// Why: the recorder reads a handful of facts of every recorded tensor (device, dtype,
// data pointer, element count, layout, version counter). Through the tensor's Python
// attributes that is ~8 calls into torch's Python bindings, ~1 us a record, hundreds of
// records a step (docs/python.md "The per-tensor cost"). The bridge reads them from the
// at::Tensor in one call. It needs torch's C++ headers and ABI, which change with each
// torch release, so it is built per torch, and _core uses it only when one built for the
// running torch is found (lockstep._bridge); without it _core reads the Python
// attributes, with the same results.
//
// Plain C types only: the two sides are built by different compilers' runs, against
// different headers. A change of the struct or of a function's meaning bumps kAbi.
#ifndef LOCKSTEP_AGENT_PYTHON_TORCH_BRIDGE_H_
#define LOCKSTEP_AGENT_PYTHON_TORCH_BRIDGE_H_

#include <Python.h>

#include <cstdint>

namespace lockstep::bridge {

// lockstep/_bridge.py keeps the same number (ABI), in the folder name it builds into.
constexpr uint32_t kAbi = 1;
// The capsule's name (PyCapsule_GetPointer checks it).
constexpr const char* kCapsuleName = "lockstep._torch_bridge.api";
// Dimensions read into a TensorFacts; a tensor with more is left to Python.
constexpr int kMaxDims = 12;

// What the recorder needs of a tensor, as its Python attributes give it.
struct TensorFacts {
  PyObject* dtype;      // t.dtype: torch's dtype object (borrowed: torch keeps one per dtype)
  uintptr_t data;       // t.data_ptr()
  uint64_t numel;       // t.numel()
  int64_t version;      // t._version, when has_version
  int32_t ndim;         // t.dim()
  uint8_t is_cpu;       // t.is_cpu
  uint8_t contiguous;   // t.is_contiguous()
  uint8_t has_version;  // 0: an inference tensor (t._version raises)
  uint8_t strided;      // t.layout == torch.strided
  int64_t sizes[kMaxDims];    // t.shape
  int64_t strides[kMaxDims];  // t.stride()
};

struct Api {
  uint32_t abi;   // kAbi of the bridge's build
  uint32_t size;  // sizeof(Api) there
  // 1: `t` is a torch.Tensor (that very type, or nn.Parameter) the bridge read into
  // *out; 0: anything else (a subclass, a tensor without storage, a sparse or symbolic
  // one, more than kMaxDims dimensions): the caller reads its Python attributes. Called
  // with the GIL held; never raises, never sets a Python error. Only is_cpu and dtype
  // are read of a tensor not on the CPU.
  int (*read)(PyObject* t, TensorFacts* out);
  // t._version of a tensor `read` accepted before (1), or 0 (no version counter, or not
  // such a tensor). Same rules as `read`.
  int (*version)(PyObject* t, int64_t* out);
  // Registers `fn` (a Python callable, given the gradient as a torch.Tensor; its result is
  // ignored) as a gradient hook of `t`, as t.register_hook(fn) would, but as a C++ hook:
  // autograd calls it without a Python hook dict, and no Python object of t's graph node
  // is made. 1: done (the hook holds a reference to fn, released with the graph); 0: not
  // taken (not a plain tensor with a graph node, or torch < 2.0, whose hooks do not
  // follow in-place changes the way the agent expects): the caller registers its own way.
  // Called with the GIL held; never raises. Inside the hook, an exception fn raises goes
  // on into the backward, as from a Python hook.
  int (*add_grad_hook)(PyObject* t, PyObject* fn);
};

}  // namespace lockstep::bridge

#endif  // LOCKSTEP_AGENT_PYTHON_TORCH_BRIDGE_H_
