// lockstep._core's Agent: its host statistics methods (bindings.h), which run the
// kernel from training hooks and so return a value (the l2 norm, a ticket or a
// HostOutcome) instead of raising.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <vector>

#include "bindings.h"
#include "gil.h"
#include "lockstep/agent/host_recorder.h"
#include "py_agent.h"

namespace lockstep::python {
namespace {

// A HostResult for Python: the l2 norm (a float) when recorded, else its HostOutcome
// (HostOutcome.REFUSED, ...). Called with the GIL held.
py::object ToPython(const HostResult& r) {
  if (r.recorded()) return py::float_(r.l2);
  return py::cast(r.outcome);
}

// A HostSubmit for Python: the ticket (an int) when queued, else its HostOutcome.
py::object ToPython(const HostSubmit& r) {
  if (r.queued()) return py::int_(r.ticket);
  return py::cast(r.outcome);
}

// Record now, on the caller's thread.
void DefHostRecords(py::class_<PyAgent>& agent) {
  agent
      // The host statistics path (HostRecorder). Each returns the tensor's l2 norm (a
      // float) when it recorded something, else a HostOutcome saying why not:
      // REFUSED (the kernel refused the dtype), BAD_LAYOUT (a strided layout it cannot
      // read: record a contiguous copy), NOTHING_TO_REPEAT, DROPPED, NOT_READY.
      .def("record_host_tensor",
           [](PyAgent& a, uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
              uintptr_t data_ptr, uint64_t numel, int dtype) {
             HostResult r;
             {
               MaybeReleaseGil release(numel >= kReleaseGilElems);
               r = a.host().Record(RecordKey{step, micro, id, order},
                                   reinterpret_cast<const void*>(data_ptr), numel,
                                   static_cast<DType>(dtype));
             }
             return ToPython(r);
           },
           py::arg("step"), py::arg("micro"), py::arg("id"), py::arg("order"),
           py::arg("data_ptr"), py::arg("numel"), py::arg("dtype"))
      // A strided view (data_ptr is its first element; sizes and strides in elements,
      // as torch gives them): read in place, no contiguous copy.
      .def("record_host_tensor_strided",
           [](PyAgent& a, uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
              uintptr_t data_ptr, int dtype, const std::vector<int64_t>& sizes,
              const std::vector<int64_t>& strides) {
             HostResult r{HostOutcome::kBadLayout, 0.0};
             if (sizes.size() == strides.size()) {
               MaybeReleaseGil release(NumelOf(sizes) >= kReleaseGilElems);
               r = a.host().RecordStrided(RecordKey{step, micro, id, order},
                                          reinterpret_cast<const void*>(data_ptr),
                                          static_cast<DType>(dtype), sizes.data(),
                                          strides.data(), static_cast<int>(sizes.size()));
             }
             return ToPython(r);
           },
           py::arg("step"), py::arg("micro"), py::arg("id"), py::arg("order"),
           py::arg("data_ptr"), py::arg("dtype"), py::arg("sizes"), py::arg("strides"))
      // The statistics of this thread's last record_host_tensor again, for another
      // tensor id (the caller knows the memory is the same and unchanged). Keeps the
      // GIL: a copy of the last record and an enqueue that never waits.
      .def("record_repeat",
           [](PyAgent& a, uint64_t step, uint32_t micro, uint32_t id, uint32_t order) {
             return ToPython(a.host().Repeat(RecordKey{step, micro, id, order}));
           },
           py::arg("step"), py::arg("micro"), py::arg("id"), py::arg("order"));
}

// Record on lockstep's worker thread.
void DefHostWorker(py::class_<PyAgent>& agent) {
  agent
      // Host statistics on lockstep's own thread (host_recorder.h). These keep the GIL:
      // it is what makes the caller the worker's only producer, and they return at once.
      .def("start_host_worker",
           [](PyAgent& a, uint32_t capacity) {
             Status s = a.host().StartWorker(capacity);
             if (!s.ok()) throw py::value_error(s.message());
           },
           py::arg("capacity") = 256)
      .def_property_readonly("has_host_worker",
                             [](const PyAgent& a) { return a.host().has_worker(); })
      // Submits return the ticket (an int), or HostOutcome FULL (compute inline) or
      // BAD_LAYOUT.
      .def("submit_host_tensor",
           [](PyAgent& a, uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
              uintptr_t data_ptr, uint64_t numel, int dtype) {
             return ToPython(a.host().Submit(RecordKey{step, micro, id, order},
                                             reinterpret_cast<const void*>(data_ptr), numel,
                                             static_cast<DType>(dtype)));
           },
           py::arg("step"), py::arg("micro"), py::arg("id"), py::arg("order"),
           py::arg("data_ptr"), py::arg("numel"), py::arg("dtype"))
      .def("submit_host_tensor_strided",
           [](PyAgent& a, uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
              uintptr_t data_ptr, int dtype, const std::vector<int64_t>& sizes,
              const std::vector<int64_t>& strides) {
             if (sizes.size() != strides.size()) {
               return ToPython(HostSubmit{HostOutcome::kBadLayout, 0});
             }
             return ToPython(a.host().SubmitStrided(
                 RecordKey{step, micro, id, order}, reinterpret_cast<const void*>(data_ptr),
                 static_cast<DType>(dtype), sizes.data(), strides.data(),
                 static_cast<int>(sizes.size())));
           },
           py::arg("step"), py::arg("micro"), py::arg("id"), py::arg("order"),
           py::arg("data_ptr"), py::arg("dtype"), py::arg("sizes"), py::arg("strides"))
      .def("host_done", [](const PyAgent& a) { return a.host().Done(); })
      .def("host_kick", [](PyAgent& a) { a.host().Kick(); })
      .def("host_wait", [](PyAgent& a, uint64_t ticket) { a.host().Wait(ticket); },
           py::arg("ticket"), py::call_guard<py::gil_scoped_release>())
      .def("host_settle",
           [](PyAgent& a, uint64_t ticket, bool keep, bool as_last) {
             return ToPython(a.host().Settle(ticket, keep, as_last));
           },
           py::arg("ticket"), py::arg("keep"), py::arg("as_last") = false);
}

}  // namespace

void BindHostOutcome(py::module_& m) {
  py::enum_<HostOutcome>(m, "HostOutcome",
                         "Why a host statistics call recorded nothing (host_recorder.h)")
      .value("REFUSED", HostOutcome::kRefused)
      .value("BAD_LAYOUT", HostOutcome::kBadLayout)
      .value("NOTHING_TO_REPEAT", HostOutcome::kNothingToRepeat)
      .value("DROPPED", HostOutcome::kDropped)
      .value("NOT_READY", HostOutcome::kNotReady)
      .value("FULL", HostOutcome::kFull);
}

void DefHostStatistics(py::class_<PyAgent>& agent) {
  DefHostRecords(agent);
  DefHostWorker(agent);
}

}  // namespace lockstep::python
