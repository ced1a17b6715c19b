// What hooks written in C++ against libtorch would cost per recorded tensor: the
// measurement behind docs/python.md "The per-tensor cost". Built and run by
// cxx_hook_floor_bench.py (g++ against the running torch's headers); not part of the agent.
//
// A forward hook reads what the recorder needs of a module's output (dtype, data pointer,
// element count, contiguity, version counter) straight from the at::Tensor and registers
// a C++ gradient hook on it; a parameter hook does the same for parameter gradients. Each
// appends a fixed-size row to a preallocated table where the agent would call its record
// path (the statistics kernel is measured on its own: resnet18_stats_ms_per_step).
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <cstdint>
#include <vector>

namespace {

struct Row {
  int64_t name;
  int kind;  // 0 output, 1 output gradient, 2 parameter gradient
  const void* data;
  int64_t numel;
  int64_t version;
  bool contiguous;
};

std::vector<Row>& Rows() {
  static std::vector<Row> rows = [] {
    std::vector<Row> r;
    r.reserve(1 << 16);
    return r;
  }();
  return rows;
}

void Add(int64_t name, int kind, const at::Tensor& t, int64_t version) {
  auto& rows = Rows();
  if (rows.size() < rows.capacity()) {
    rows.push_back({name, kind, t.data_ptr(), t.numel(), version, t.is_contiguous()});
  }
}

// A module forward hook: (module, args, output) -> None.
struct ForwardHook {
  int64_t name;
  pybind11::object operator()(const pybind11::handle&, const pybind11::handle&,
                              const pybind11::handle& out) const {
    PyObject* o = out.ptr();
    if (!THPVariable_Check(o)) return pybind11::none();
    const at::Tensor& t = THPVariable_Unpack(o);
    if (!t.is_floating_point()) return pybind11::none();
    Add(name, 0, t, static_cast<int64_t>(t._version()));
    if (t.requires_grad()) {
      int64_t n = name;
      at::Tensor hooked = t;  // shares the TensorImpl: the hook is the tensor's
      hooked.register_hook([n](const at::Tensor& g) { Add(n, 1, g, 0); });
    }
    return pybind11::none();
  }
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<ForwardHook>(m, "ForwardHook")
      .def(pybind11::init([](int64_t name) { return ForwardHook{name}; }))
      .def("__call__", &ForwardHook::operator());
  // Hooks parameter `p`; returns the position remove_param_hook takes.
  m.def("param_hook", [](const pybind11::handle& p, int64_t name) {
    at::Tensor t = THPVariable_Unpack(p.ptr());
    return t.register_hook([name](const at::Tensor& g) { Add(name, 2, g, 0); });
  });
  m.def("remove_param_hook", [](const pybind11::handle& p, unsigned pos) {
    at::Tensor t = THPVariable_Unpack(p.ptr());
    t.remove_hook(pos);
  });
  // Rows appended since the last call.
  m.def("take", []() {
    size_t n = Rows().size();
    Rows().clear();
    return n;
  });
}
