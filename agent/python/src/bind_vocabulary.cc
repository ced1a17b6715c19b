// lockstep._core's shared vocabulary (bindings.h): the constants, names and agent
// defaults the Python package reads instead of restating them.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <iterator>
#include <string>
#include <utility>

#include "bindings.h"
#include "lockstep/agent/agent.h"
#include "lockstep/agent/packed_rows.h"
#include "lockstep/agent/types.h"
#include "lockstep/common/control_endpoint.h"
#include "lockstep/common/wire.h"
#include "lockstep/common/wire_names.h"
#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::python {
namespace {

// The agent's enums carry the wire's values (types.h): checked here, where both meet.
static_assert(wire::SameValue(TensorKind::kAct, wire::TensorKind::Act) &&
              wire::SameValue(TensorKind::kActGrad, wire::TensorKind::ActGrad) &&
              wire::SameValue(TensorKind::kParamGrad, wire::TensorKind::ParamGrad) &&
              wire::SameValue(TensorKind::kParam, wire::TensorKind::Param) &&
              wire::SameValue(TensorKind::kOptim, wire::TensorKind::Optim) &&
              wire::SameValue(TensorKind::kLoss, wire::TensorKind::Loss) &&
              wire::SameValue(TensorKind::kInput, wire::TensorKind::Input) &&
              wire::SameValue(TensorKind::kActIn, wire::TensorKind::ActIn) &&
              wire::SameValue(TensorKind::kGradReduced, wire::TensorKind::GradReduced) &&
              wire::TensorKind::MAX == wire::TensorKind::GradReduced);
static_assert(wire::SameValue(Role::kBaseline, wire::Role::Baseline) &&
              wire::SameValue(Role::kCandidate, wire::Role::Candidate) &&
              wire::SameValue(Role::kSolo, wire::Role::Solo) && wire::Role::MAX == wire::Role::Solo);
static_assert(kStatRepeat == static_cast<uint8_t>(wire::StatFlags::kRepeat));
static_assert(kStatDevice == static_cast<uint8_t>(wire::StatFlags::kDevice));

// torch's dtype names for the wire's DTypes (every one but Unknown).
constexpr std::pair<const char*, DType> kTorchDTypes[] = {
    {"float32", DType::kF32},  {"float16", DType::kF16}, {"bfloat16", DType::kBF16},
    {"float64", DType::kF64},  {"int8", DType::kI8},     {"uint8", DType::kU8},
    {"int16", DType::kI16},    {"int32", DType::kI32},   {"int64", DType::kI64},
    {"bool", DType::kBool},    {"float8_e4m3fn", DType::kF8E4M3},
    {"float8_e5m2", DType::kF8E5M2}};
static_assert(std::size(kTorchDTypes) == static_cast<size_t>(wire::DType::MAX));
static_assert(wire::SameValue(DType::kF32, wire::DType::F32) &&
              wire::SameValue(DType::kBF16, wire::DType::BF16) &&
              wire::SameValue(DType::kBool, wire::DType::Bool) &&
              wire::SameValue(DType::kF8E5M2, wire::DType::F8E5M2));

// "ActGrad" -> "act_grad".
std::string SnakeCase(const char* name) {
  std::string out;
  for (const char* c = name; *c; ++c) {
    if (*c >= 'A' && *c <= 'Z') {
      if (!out.empty()) out += '_';
      out += static_cast<char>(*c - 'A' + 'a');
    } else {
      out += *c;
    }
  }
  return out;
}

void BindConstants(py::module_& m) {
  m.attr("DEFAULT_SKETCH_K") = kDefaultSketchK;
  m.attr("MAX_SKETCH_K") = kMaxSketchK;
  m.attr("HIST_BINS") = kHistBins;
  // A run id names the collector's log file: the collector's own check (wire.h).
  m.attr("MAX_RUN_ID_LENGTH") = kMaxRunIdLength;
  m.def("is_valid_run_id", [](const std::string& id) { return IsValidRunId(id); }, py::arg("id"));
  // The control endpoint a collector derives from its --listen ("" when none can be).
  m.def("control_endpoint_for", [](const std::string& endpoint) { return ControlEndpointFor(endpoint); },
        py::arg("endpoint"));
  m.attr("STAT_REPEAT") = kStatRepeat;  // record_packed flags: this row repeats an earlier one
  py::dict stat_flags;
  stat_flags["repeat"] = kStatRepeat;
  m.attr("STAT_FLAGS") = stat_flags;
  m.attr("PACKED_FIXED_COLUMNS") = static_cast<int>(kPackedFixed);
  py::tuple fields(static_cast<size_t>(kPackedFixed));
  for (int i = 0; i < kPackedFixed; ++i) fields[i] = py::str(kPackedColumnNames[i]);
  m.attr("PACKED_FIXED_FIELDS") = fields;
}

void BindKindsAndRoles(py::module_& m) {
  // Kinds and roles: the schema's names in snake case ("ActGrad" -> "act_grad").
  py::dict kinds;
  for (auto k : wire::EnumValuesTensorKind()) {
    kinds[py::str(SnakeCase(wire::EnumNameTensorKind(k)))] = static_cast<int>(k);
  }
  m.attr("KINDS") = kinds;
  py::dict roles;
  for (auto r : wire::EnumValuesRole()) {
    if (r == wire::Role::Unknown) continue;
    roles[py::str(SnakeCase(wire::EnumNameRole(r)))] = static_cast<int>(r);
  }
  m.attr("ROLES") = roles;
}

void BindAgentDefaults(py::module_& m) {
  // The agent's defaults (AgentOptions), which lockstep._config uses for its options.
  const AgentOptions defaults;
  py::dict agent_defaults;
  agent_defaults["endpoint"] = defaults.endpoint;
  agent_defaults["sketch_k"] = defaults.sketch_k;
  agent_defaults["hist_bins"] = defaults.hist_bins;
  agent_defaults["start_step"] = defaults.start_step;
  agent_defaults["queue_capacity"] = defaults.queue_capacity;
  agent_defaults["send_hwm"] = defaults.send_hwm;
  agent_defaults["send_buffer_mb"] = defaults.send_buffer_bytes >> 20;
  agent_defaults["heartbeat_interval"] = defaults.heartbeat_interval.count() / 1000.0;
  m.attr("AGENT_DEFAULTS") = agent_defaults;
  // The ranges the C++ agent accepts (agent.h), so Python checks the same ones.
  py::dict agent_limits;
  agent_limits["queue_capacity"] = py::make_tuple(1, kMaxQueueCapacity);
  agent_limits["max_records_per_message"] = py::make_tuple(1, kMaxRecordsPerMessage);
  agent_limits["sketch_k"] = py::make_tuple(0, kMaxSketchK);
  m.attr("AGENT_LIMITS") = agent_limits;
}

void BindDTypes(py::module_& m) {
  // DTypes by torch's names (the wire's own names are F32, ...: see DTypeNames()).
  py::dict dtypes;
  for (const auto& [name, dtype] : kTorchDTypes) dtypes[py::str(name)] = static_cast<int>(dtype);
  m.attr("DTYPES") = dtypes;
}

}  // namespace

void BindVocabulary(py::module_& m) {
  // The shared vocabulary, defined once (schema/lockstep.fbs, types.h, packed_rows.h)
  // and read from here by the Python package (tests/python/test_vocabulary.py).
  BindConstants(m);
  BindKindsAndRoles(m);
  BindAgentDefaults(m);
  BindDTypes(m);
}

}  // namespace lockstep::python
