// lockstep._core.RecorderCore (py_recorder.h): the base class of the Python Recorder.
// Its hot methods take their arguments as Python objects, unconverted: a hook's call
// costs pybind11's dispatch and nothing more before the recorder's own work.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>

#include "py_recorder.h"

namespace lockstep::python {

void BindRecorder(py::module_& m) {
  m.attr("TORCH_BRIDGE_ABI") = bridge::kAbi;
  m.def("set_torch_bridge", &SetTorchBridge, py::arg("capsule"),
        "Reads tensors through this torch bridge's capsule (lockstep._bridge), or through "
        "their Python attributes when None");
  m.def("_bridge_facts", &BridgeFacts, py::arg("t"),
        "What the torch bridge reads of t (a dict), or None (tests)");
  m.def("bridge_add_grad_hook", &BridgeAddGradHook, py::arg("t"), py::arg("fn"),
        "fn as a C++ gradient hook of t through the torch bridge: True, or False when it is "
        "not set or does not take t (_watch._add_hook)");
  py::class_<RecorderCore>(m, "RecorderCore",
                           "The host path of lockstep._recorder.Recorder (its base class)")
      .def(py::init<py::object, py::iterable, py::object, bool>(), py::arg("agent"),
           py::arg("host_dtypes"), py::arg("strided"), py::arg("force_device"))
      .def("record",
           [](py::handle self, py::handle name, int kind, py::handle t) {
             self.cast<RecorderCore&>().Record(self, name, kind, t);
           },
           py::arg("name"), py::arg("kind"), py::arg("t"))
      .def("record_param_grad",
           [](py::handle self, py::handle name, py::handle t, bool fresh) {
             self.cast<RecorderCore&>().RecordParamGrad(self, name, t, fresh);
           },
           py::arg("name"), py::arg("t"), py::arg("fresh"))
      .def("param_accumulated",
           [](py::handle self, py::handle name, py::handle grad) {
             self.cast<RecorderCore&>().ParamAccumulated(self, name, grad);
           },
           py::arg("name"), py::arg("grad"))
      .def("settle", &RecorderCore::Settle, py::arg("wait"))
      .def("_settle_done", &RecorderCore::SettleDone)
      .def("_new_step", &RecorderCore::NewStep, py::arg("step"))
      .def("_new_micro", &RecorderCore::NewMicro)
      .def("_drop_deferred", &RecorderCore::DropDeferred)
      .def("set_threaded", &RecorderCore::SetThreaded, py::arg("on"))
      .def_property_readonly("_threaded", &RecorderCore::threaded)
      .def_property(
          "_agent", [](RecorderCore& r) { return r.agent().object(); },
          [](RecorderCore& r, py::object agent) { r.agent().Set(std::move(agent)); })
      .def_readwrite("step", &RecorderCore::step)
      .def_readwrite("micro", &RecorderCore::micro)
      .def_readwrite("order", &RecorderCore::order)
      .def_readwrite("t_first", &RecorderCore::t_first)
      .def_readwrite("grad_sq", &RecorderCore::grad_sq)
      .def_readwrite("grad_count", &RecorderCore::grad_count)
      .def_readwrite("records", &RecorderCore::records)
      .def_readwrite("repeats", &RecorderCore::repeats)
      .def_readwrite("skipped", &RecorderCore::skipped)
      .def_readwrite("failed", &RecorderCore::failed)
      .def_readwrite("threaded", &RecorderCore::threaded_records)
      .def_readwrite("changed_in_flight", &RecorderCore::changed_in_flight)
      .def_readwrite("has_worker", &RecorderCore::has_worker)
      .def_readwrite("_end_of_backward_queued", &RecorderCore::end_of_backward_queued)
      // The benches' accounting (py_recorder.h); off unless they turn it on.
      .def_readwrite("kernel_timing", &RecorderCore::kernel_timing)
      .def_readonly("kernel_seconds", &RecorderCore::kernel_seconds)
      .def_readonly("kernel_bytes", &RecorderCore::kernel_bytes)
      .def_readonly("threaded_bytes", &RecorderCore::threaded_bytes);
}

}  // namespace lockstep::python
