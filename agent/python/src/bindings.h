// The parts of lockstep._core, one function per area, each called once from
// core_module.cc's PYBIND11_MODULE in the order below (which is the order of the
// module's attributes and of Agent's methods).
//
// Threads: module import only, with the GIL held.
#ifndef LOCKSTEP_AGENT_PYTHON_BINDINGS_H_
#define LOCKSTEP_AGENT_PYTHON_BINDINGS_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>

#include "py_agent.h"

namespace lockstep::python {

namespace py = pybind11;

using U32Array = py::array_t<uint32_t, py::array::c_style | py::array::forcecast>;
using F64Array = py::array_t<double, py::array::c_style | py::array::forcecast>;
using U8Array = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

// The shared vocabulary: constants, KINDS, ROLES, DTYPES, the agent's defaults and
// limits, is_valid_run_id (bind_vocabulary.cc).
void BindVocabulary(py::module_& m);

// The host kernel and the packed-row reader for tests and tools: host_stats,
// host_stats_strided, unpack_row (bind_host_stats.cc).
void BindHostStats(py::module_& m);

// HostOutcome, what Agent's host statistics methods return instead of a value
// (bind_agent_host.cc). Before BindAgent.
void BindHostOutcome(py::module_& m);

// The Agent class (bind_agent.cc); its host statistics methods come from
// DefHostStatistics.
void BindAgent(py::module_& m);

// Agent's host statistics path: record_host_tensor ... host_settle (bind_agent_host.cc).
void DefHostStatistics(py::class_<PyAgent>& agent);

}  // namespace lockstep::python

#endif  // LOCKSTEP_AGENT_PYTHON_BINDINGS_H_
