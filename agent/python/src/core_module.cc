// lockstep._core: the pybind11 face of the C++ agent (see py_agent.h).
//
// Called from lockstep's pure-Python package only. Agent.create() raises ValueError
// with the agent's one-line message (the package turns it into a warning and a no-op
// monitor); every method used from training hooks returns a value instead of raising
// and releases the GIL while it works.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "lockstep/agent/host_recorder.h"
#include "lockstep/agent/host_stats.h"
#include "lockstep/agent/packed_rows.h"
#include "lockstep/schema/lockstep_generated.h"
#include "py_agent.h"

namespace py = pybind11;

namespace lockstep::python {
namespace {

using Millis = std::chrono::milliseconds;

Millis ToMillis(double seconds) {
  if (!(seconds > 0)) return Millis(0);
  if (seconds > 1e6) seconds = 1e6;
  return Millis(static_cast<int64_t>(seconds * 1000.0));
}

// The agent's enums carry the wire's values (types.h): checked here, where both meet.
// Same value: an agent enum member and its wire counterpart.
template <typename A, typename W>
constexpr bool Same(A a, W w) {
  return static_cast<int>(a) == static_cast<int>(w);
}
static_assert(Same(TensorKind::kAct, wire::TensorKind::Act) &&
              Same(TensorKind::kActGrad, wire::TensorKind::ActGrad) &&
              Same(TensorKind::kParamGrad, wire::TensorKind::ParamGrad) &&
              Same(TensorKind::kParam, wire::TensorKind::Param) &&
              Same(TensorKind::kOptim, wire::TensorKind::Optim) &&
              Same(TensorKind::kLoss, wire::TensorKind::Loss) &&
              Same(TensorKind::kInput, wire::TensorKind::Input) &&
              Same(TensorKind::kActIn, wire::TensorKind::ActIn) &&
              wire::TensorKind::MAX == wire::TensorKind::ActIn);
static_assert(Same(Role::kBaseline, wire::Role::Baseline) &&
              Same(Role::kCandidate, wire::Role::Candidate) &&
              Same(Role::kSolo, wire::Role::Solo) && wire::Role::MAX == wire::Role::Solo);
static_assert(kStatRepeat == static_cast<uint8_t>(wire::StatFlags::kRepeat));

// Records of fewer elements keep the GIL. On a small tensor (most of a convnet's:
// BatchNorm's 64-512-element gradients) the kernel takes ~1 us, and releasing the GIL
// there buys nothing: it costs ~0.1 us alone, and when another Python thread waits for
// the GIL (a data loader's), taking it back can wait for that thread's switch interval.
// From 64 Ki elements (~15 us of kernel at 4.5 GB/s) the other threads may run meanwhile.
constexpr uint64_t kReleaseGilElems = uint64_t{1} << 16;

// Releases the GIL for the scope only when `release`.
class MaybeReleaseGil {
 public:
  explicit MaybeReleaseGil(bool release) {
    if (release) release_.emplace();
  }

 private:
  std::optional<py::gil_scoped_release> release_;
};

uint64_t NumelOf(const std::vector<int64_t>& sizes) {
  uint64_t n = 1;
  for (int64_t s : sizes) n *= s > 0 ? static_cast<uint64_t>(s) : 0;
  return n;
}

// torch's dtype names for the wire's DTypes (every one but Unknown).
constexpr std::pair<const char*, DType> kTorchDTypes[] = {
    {"float32", DType::kF32},  {"float16", DType::kF16}, {"bfloat16", DType::kBF16},
    {"float64", DType::kF64},  {"int8", DType::kI8},     {"uint8", DType::kU8},
    {"int16", DType::kI16},    {"int32", DType::kI32},   {"int64", DType::kI64},
    {"bool", DType::kBool},    {"float8_e4m3fn", DType::kF8E4M3},
    {"float8_e5m2", DType::kF8E5M2}};
static_assert(std::size(kTorchDTypes) == static_cast<size_t>(wire::DType::MAX));
static_assert(Same(DType::kF32, wire::DType::F32) && Same(DType::kBF16, wire::DType::BF16) &&
              Same(DType::kBool, wire::DType::Bool) &&
              Same(DType::kF8E5M2, wire::DType::F8E5M2));

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

Role ParseRole(const std::string& role) {
  if (role == "baseline") return Role::kBaseline;
  if (role == "candidate") return Role::kCandidate;
  if (role == "solo") return Role::kSolo;
  throw py::value_error("lockstep: role '" + role +
                        "' is not one of baseline, candidate, solo; pass one of those");
}

py::dict StatsToDict(const TensorStats& s) {
  py::dict d;
  d["numel"] = s.numel;
  d["min"] = s.min;
  d["max"] = s.max;
  d["mean"] = s.mean;
  d["std"] = s.std;
  d["l2"] = s.l2;
  d["absmax"] = s.absmax;
  d["nan_count"] = s.nan_count;
  d["inf_count"] = s.inf_count;
  d["zero_count"] = s.zero_count;
  d["sat_count"] = s.sat_count;
  d["subnormal_count"] = s.subnormal_count;
  d["limit_dtype"] = static_cast<int>(s.limit_dtype);
  py::list sketch, hist;
  for (int i = 0; i < s.sketch_k; ++i) sketch.append(s.sketch[i]);
  for (int i = 0; i < s.hist_bins; ++i) hist.append(s.hist[i]);
  d["sketch"] = sketch;
  d["hist"] = hist;
  return d;
}

py::dict CountersToDict(const PyAgent& a) {
  AgentCounters c = a.agent().Counters();
  py::dict d;
  d["records_enqueued"] = c.records_enqueued;
  d["records_sent"] = c.records_sent;
  d["records_dropped"] = c.records_dropped;
  d["messages_sent"] = c.messages_sent;
  d["messages_dropped"] = c.messages_dropped;
  d["errors"] = c.errors;
  d["queue_depth"] = c.queue_depth;
  d["reconnects"] = c.reconnects;
  d["handshakes"] = c.handshakes;
  d["handshake_failures"] = c.handshake_failures;
  d["delivery_problem"] = c.delivery_problem;
  d["host_stats_errors"] = a.host().errors();
  d["packed_errors"] = a.packed_errors();
  return d;
}

using U32Array = py::array_t<uint32_t, py::array::c_style | py::array::forcecast>;
using F64Array = py::array_t<double, py::array::c_style | py::array::forcecast>;
using U8Array = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

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

}  // namespace
}  // namespace lockstep::python

PYBIND11_MODULE(_core, m) {
  using namespace lockstep;
  using namespace lockstep::python;
  m.doc() = "lockstep C++ agent core (use the `lockstep` package, not this module)";

  // The shared vocabulary, defined once (schema/lockstep.fbs, types.h, packed_rows.h)
  // and read from here by the Python package (tests/python/test_vocabulary.py).
  m.attr("DEFAULT_SKETCH_K") = kDefaultSketchK;
  m.attr("MAX_SKETCH_K") = kMaxSketchK;
  m.attr("HIST_BINS") = kHistBins;
  // A run id names the collector's log file: the collector's own check (wire.h).
  m.attr("MAX_RUN_ID_LENGTH") = kMaxRunIdLength;
  m.def("is_valid_run_id", [](const std::string& id) { return IsValidRunId(id); }, py::arg("id"));
  m.attr("STAT_REPEAT") = kStatRepeat;  // record_packed flags: this row repeats an earlier one
  py::dict stat_flags;
  stat_flags["repeat"] = kStatRepeat;
  m.attr("STAT_FLAGS") = stat_flags;
  m.attr("PACKED_FIXED_COLUMNS") = static_cast<int>(kPackedFixed);
  py::tuple fields(static_cast<size_t>(kPackedFixed));
  for (int i = 0; i < kPackedFixed; ++i) fields[i] = py::str(kPackedColumnNames[i]);
  m.attr("PACKED_FIXED_FIELDS") = fields;
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
  // DTypes by torch's names (the wire's own names are F32, ...: see DTypeNames()).
  py::dict dtypes;
  for (const auto& [name, dtype] : kTorchDTypes) dtypes[py::str(name)] = static_cast<int>(dtype);
  m.attr("DTYPES") = dtypes;

  // For tests and tools: the host kernel on `numel` contiguous elements at address
  // `data_ptr` (the caller keeps the memory alive). Raises ValueError on a bad dtype.
  m.def(
      "host_stats",
      [](uintptr_t data_ptr, uint64_t numel, int dtype, int sketch_k, int hist_bins) {
        StatsConfig cfg;
        cfg.sketch_k = sketch_k;
        cfg.hist_bins = hist_bins;
        TensorStats stats;
        Status s;
        {
          py::gil_scoped_release release;
          s = ComputeHostStats(reinterpret_cast<const void*>(data_ptr),
                               static_cast<DType>(dtype), numel, cfg, &stats);
        }
        if (!s.ok()) throw py::value_error(s.message());
        return StatsToDict(stats);
      },
      py::arg("data_ptr"), py::arg("numel"), py::arg("dtype"),
      py::arg("sketch_k") = kDefaultSketchK, py::arg("hist_bins") = kHistBins);
  // The same for a strided view at `data_ptr` (its first element; sizes and strides in
  // elements, as torch gives them). Raises ValueError for a layout it cannot read.
  m.def(
      "host_stats_strided",
      [](uintptr_t data_ptr, int dtype, const std::vector<int64_t>& sizes,
         const std::vector<int64_t>& strides, int sketch_k, int hist_bins) {
        if (sizes.size() != strides.size())
          throw py::value_error("host_stats_strided: " + std::to_string(sizes.size()) +
                                " sizes but " + std::to_string(strides.size()) + " strides.");
        HostLayout layout;
        Status s = MakeHostLayout(sizes.data(), strides.data(), static_cast<int>(sizes.size()),
                                  &layout);
        StatsConfig cfg;
        cfg.sketch_k = sketch_k;
        cfg.hist_bins = hist_bins;
        TensorStats stats;
        if (s.ok()) {
          py::gil_scoped_release release;
          s = ComputeHostStatsStrided(reinterpret_cast<const void*>(data_ptr),
                                      static_cast<DType>(dtype), layout, cfg, &stats);
        }
        if (!s.ok()) throw py::value_error(s.message());
        return StatsToDict(stats);
      },
      py::arg("data_ptr"), py::arg("dtype"), py::arg("sizes"), py::arg("strides"),
      py::arg("sketch_k") = kDefaultSketchK, py::arg("hist_bins") = kHistBins);

  // For tests: what record_packed() makes of one row (None if it rejects it).
  m.def(
      "unpack_row",
      [](F64Array row, int sketch_k, int hist_bins) -> py::object {
        TensorStats stats;
        if (row.ndim() != 1) return py::none();
        if (!UnpackRow(row.data(), static_cast<size_t>(row.shape(0)), sketch_k, hist_bins,
                       &stats)) {
          return py::none();
        }
        return StatsToDict(stats);
      },
      py::arg("row"), py::arg("sketch_k"), py::arg("hist_bins"));

  py::enum_<HostOutcome>(m, "HostOutcome",
                         "Why a host statistics call recorded nothing (host_recorder.h)")
      .value("REFUSED", HostOutcome::kRefused)
      .value("BAD_LAYOUT", HostOutcome::kBadLayout)
      .value("NOTHING_TO_REPEAT", HostOutcome::kNothingToRepeat)
      .value("DROPPED", HostOutcome::kDropped)
      .value("NOT_READY", HostOutcome::kNotReady)
      .value("FULL", HostOutcome::kFull);

  py::class_<PyAgent>(m, "Agent")
      .def_static(
          "create",
          [](const std::string& endpoint, const std::string& run, const std::string& experiment,
             const std::string& role, const std::string& platform,
             const std::string& device_name, const std::string& framework, uint32_t rank,
             uint32_t world_size, uint64_t start_step, size_t queue_capacity, int send_hwm,
             size_t send_buffer_mb, int sketch_k, int hist_bins, uint32_t every, const std::string& include_regex,
             const std::string& exclude_regex, double heartbeat_interval_s,
             size_t max_records_per_message, const std::string& curve_server_key,
             const std::string& curve_public_key, const std::string& curve_secret_key,
             bool identity_pending) {
            AgentOptions o;
            o.endpoint = endpoint;
            o.run = run;
            o.experiment = experiment;
            o.role = ParseRole(role);
            o.platform = platform;
            o.device_name = device_name;
            o.framework = framework;
            o.rank = rank;
            o.world_size = world_size;
            o.identity_pending = identity_pending;
            o.start_step = start_step;
            o.queue_capacity = queue_capacity;
            o.send_hwm = send_hwm;
            o.send_buffer_bytes = send_buffer_mb << 20;
            o.sketch_k = sketch_k;
            o.hist_bins = hist_bins;
            o.every = every;
            o.include_regex = include_regex;
            o.exclude_regex = exclude_regex;
            o.heartbeat_interval = ToMillis(heartbeat_interval_s);
            o.max_records_per_message = max_records_per_message;
            o.curve_server_key = curve_server_key;
            o.curve_public_key = curve_public_key;
            o.curve_secret_key = curve_secret_key;
            StatusOr<std::unique_ptr<PyAgent>> agent = [&] {
              py::gil_scoped_release release;
              return PyAgent::Create(o);
            }();
            if (!agent.ok()) throw py::value_error(agent.status().message());
            return std::move(agent).value();
          },
          py::arg("endpoint"), py::arg("run"), py::arg("experiment") = "",
          py::arg("role") = "solo", py::arg("platform") = "cpu", py::arg("device_name") = "",
          py::arg("framework") = "", py::arg("rank") = 0, py::arg("world_size") = 1,
          py::arg("start_step") = defaults.start_step,
          py::arg("queue_capacity") = defaults.queue_capacity,
          py::arg("send_hwm") = defaults.send_hwm,
          py::arg("send_buffer_mb") = defaults.send_buffer_bytes >> 20,
          py::arg("sketch_k") = kDefaultSketchK,
          py::arg("hist_bins") = kHistBins, py::arg("every") = 1,
          py::arg("include_regex") = "", py::arg("exclude_regex") = "",
          py::arg("heartbeat_interval_s") = defaults.heartbeat_interval.count() / 1000.0,
          py::arg("max_records_per_message") = defaults.max_records_per_message,
          py::arg("curve_server_key") = "", py::arg("curve_public_key") = "",
          py::arg("curve_secret_key") = "", py::arg("identity_pending") = false)
      .def("register_tensor",
           [](PyAgent& a, const std::string& name, int kind, int dtype,
              const std::vector<int64_t>& shape, uint32_t order, const std::string& module_type) {
             return a.agent().RegisterTensor(name, static_cast<TensorKind>(kind),
                                             static_cast<DType>(dtype), shape, order,
                                             module_type);
           },
           py::arg("name"), py::arg("kind"), py::arg("dtype"), py::arg("shape"),
           py::arg("order"), py::arg("module_type") = "")
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
           py::arg("step"), py::arg("micro"), py::arg("id"), py::arg("order"))
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
           py::arg("ticket"), py::arg("keep"), py::arg("as_last") = false)
      // One call per step: row i of `rows` ([n, PACKED_FIXED_COLUMNS + sketch_k +
      // hist_bins] float64, packed_rows.h) is tensor ids[i] at micro step micros[i]
      // with order orders[i]; flags (optional, uint8 [n]) marks rows that repeat a
      // tensor recorded before them (STAT_REPEAT). Returns how many were accepted.
      .def("record_packed",
           [](PyAgent& a, uint64_t step, U32Array micros, U32Array ids, U32Array orders,
              F64Array rows, py::object flags) -> size_t {
             if (rows.ndim() != 2) return 0;
             size_t n = static_cast<size_t>(rows.shape(0));
             size_t cols = static_cast<size_t>(rows.shape(1));
             if (ids.size() != static_cast<py::ssize_t>(n) ||
                 orders.size() != static_cast<py::ssize_t>(n) ||
                 micros.size() != static_cast<py::ssize_t>(n)) {
               return 0;
             }
             U8Array flag_array;
             const uint8_t* f_ptr = nullptr;
             if (!flags.is_none()) {
               flag_array = py::cast<U8Array>(flags);
               if (flag_array.size() != static_cast<py::ssize_t>(n)) return 0;
               f_ptr = flag_array.data();
             }
             const uint32_t* m_ptr = micros.data();
             const uint32_t* i_ptr = ids.data();
             const uint32_t* o_ptr = orders.data();
             const double* r_ptr = rows.data();
             py::gil_scoped_release release;
             return a.RecordPacked(step, m_ptr, i_ptr, o_ptr, r_ptr, n, cols, f_ptr);
           },
           py::arg("step"), py::arg("micros"), py::arg("ids"), py::arg("orders"),
           py::arg("rows"), py::arg("flags") = py::none())
      .def("record_scalars",
           [](PyAgent& a, uint64_t step, double loss, double lr, double grad_norm,
              double loss_scale, double step_time_s, uint32_t micro_steps, uint64_t samples,
              uint8_t given) {
             StepScalars s;
             s.loss = loss;
             s.lr = lr;
             s.grad_norm = grad_norm;
             s.loss_scale = loss_scale;
             s.step_time_s = step_time_s;
             s.micro_steps = micro_steps;
             s.samples = samples;
             s.given = given;
             py::gil_scoped_release release;
             return a.agent().RecordScalars(step, s);
           },
           py::arg("step"), py::arg("loss") = NAN, py::arg("lr") = NAN,
           py::arg("grad_norm") = NAN, py::arg("loss_scale") = NAN,
           py::arg("step_time_s") = NAN, py::arg("micro_steps") = 1, py::arg("samples") = 0,
           py::arg("given") = 0)
      .def("set_fingerprint",
           [](PyAgent& a, std::vector<std::pair<std::string, std::string>> entries) {
             return a.agent().SetFingerprint(std::move(entries));
           },
           py::arg("entries"))
      // The sampling watch() chose (wire Sampling): kinds are KINDS values.
      .def("set_sampling",
           [](PyAgent& a, uint32_t every, std::string include, std::string exclude,
              const std::vector<int>& kinds) {
             Sampling s;
             s.every = every;
             s.include_regex = std::move(include);
             s.exclude_regex = std::move(exclude);
             for (int k : kinds) s.kinds.push_back(static_cast<TensorKind>(k));
             return a.agent().SetSampling(s);
           },
           py::arg("every"), py::arg("include"), py::arg("exclude"), py::arg("kinds"))
      .def("end_step", [](PyAgent& a, uint64_t step) { return a.agent().EndStep(step); },
           py::arg("step"), py::call_guard<py::gil_scoped_release>())
      // The rank and world size from now on (the process group appeared after create());
      // ends identity_pending. False when invalid or refused.
      .def("set_identity",
           [](PyAgent& a, uint32_t rank, uint32_t world_size) {
             return a.agent().SetIdentity(rank, world_size);
           },
           py::arg("rank"), py::arg("world_size"),
           py::call_guard<py::gil_scoped_release>())
      .def("flush",
           [](PyAgent& a, double timeout_s) {
             py::gil_scoped_release release;
             return a.agent().Flush(ToMillis(timeout_s));
           },
           py::arg("timeout_s") = 5.0)
      .def("close",
           [](PyAgent& a, double timeout_s) {
             py::gil_scoped_release release;
             return a.agent().Close(ToMillis(timeout_s));
           },
           py::arg("timeout_s") = 5.0)
      .def("counters", &CountersToDict)
      // "" while delivery looks fine; else one sentence naming the endpoint (once set, kept).
      .def("delivery_problem", [](const PyAgent& a) { return a.agent().DeliveryProblem(); })
      .def_property_readonly("sketch_k", [](const PyAgent& a) { return a.host().config().sketch_k; })
      .def_property_readonly("hist_bins",
                             [](const PyAgent& a) { return a.host().config().hist_bins; });
}
