// lockstep._core's Agent class (bindings.h): create() raises ValueError with the
// agent's one-line message; every other method returns a value.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "lockstep/agent/agent.h"
#include "py_agent.h"

namespace lockstep::python {
namespace {

using Millis = std::chrono::milliseconds;

Millis ToMillis(double seconds) {
  if (!(seconds > 0)) return Millis(0);
  if (seconds > 1e6) seconds = 1e6;
  return Millis(static_cast<int64_t>(seconds * 1000.0));
}

Role ParseRole(const std::string& role) {
  if (role == "baseline") return Role::kBaseline;
  if (role == "candidate") return Role::kCandidate;
  if (role == "solo") return Role::kSolo;
  throw py::value_error("lockstep: role '" + role +
                        "' is not one of baseline, candidate, solo; pass one of those");
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
  d["requests_received"] = c.requests_received;
  d["requests_ignored"] = c.requests_ignored;
  d["requests_bad"] = c.requests_bad;
  d["host_stats_errors"] = a.host().errors();
  d["packed_errors"] = a.packed_errors();
  return d;
}

// create() and register_tensor().
void DefCreate(py::class_<PyAgent>& agent) {
  const AgentOptions defaults;
  agent
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
             bool identity_pending, const std::string& control_endpoint) {
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
            o.control_endpoint = control_endpoint;
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
          py::arg("curve_secret_key") = "", py::arg("identity_pending") = false,
          py::arg("control_endpoint") = "")
      .def("register_tensor",
           [](PyAgent& a, const std::string& name, int kind, int dtype,
              const std::vector<int64_t>& shape, uint32_t order, const std::string& module_type) {
             return a.agent().RegisterTensor(name, static_cast<TensorKind>(kind),
                                             static_cast<DType>(dtype), shape, order,
                                             module_type);
           },
           py::arg("name"), py::arg("kind"), py::arg("dtype"), py::arg("shape"),
           py::arg("order"), py::arg("module_type") = "");
}

// What training sends once a step, besides the tensors.
void DefStepRecords(py::class_<PyAgent>& agent) {
  agent
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
           py::call_guard<py::gil_scoped_release>());
}

// Flushing, closing and what the agent reports about itself.
void DefLifetime(py::class_<PyAgent>& agent) {
  agent
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
      // The control channel (docs/design.md "The control channel"). has_requests() is
      // one relaxed load: Monitor.step() asks it every step.
      .def("has_requests", [](const PyAgent& a) { return a.agent().HasRequests(); })
      // [(id, action, target, step, steps)], each request once, in arrival order.
      .def("take_requests",
           [](PyAgent& a) {
             py::list out;
             for (const ControlRequest& r : a.agent().TakeRequests()) {
               out.append(py::make_tuple(r.id, r.action, r.target, r.step, r.steps));
             }
             return out;
           })
      // status: "done", "refused" or "ignored"; false when it could not be queued.
      .def("acknowledge",
           [](PyAgent& a, uint64_t id, const std::string& status, uint64_t step, const std::string& detail) {
             AckStatus s;
             if (status == "done") {
               s = AckStatus::kDone;
             } else if (status == "refused") {
               s = AckStatus::kRefused;
             } else if (status == "ignored") {
               s = AckStatus::kIgnored;
             } else {
               throw py::value_error("lockstep: acknowledge status '" + status +
                                     "' is not one of done, refused, ignored");
             }
             return a.agent().Acknowledge(id, s, step, detail);
           },
           py::arg("id"), py::arg("status"), py::arg("step"), py::arg("detail") = "")
      // A capture request's second "done" answer with the job's replay of its own capture
      // (lockstep._self_replay: a dict of SelfReplay's fields; settings and precision as
      // [(key, value)]). Any thread; false when it could not be queued.
      .def("acknowledge_replay",
           [](PyAgent& a, uint64_t id, uint64_t step, const std::string& detail, const py::dict& r) {
             SelfReplay s;
             auto str = [&r](const char* k) { return r.contains(k) ? py::str(r[k]).cast<std::string>() : std::string(); };
             auto pairs = [&r](const char* k) {
               std::vector<std::pair<std::string, std::string>> out;
               if (r.contains(k)) {
                 for (const auto& kv : r[k]) {
                   auto t = kv.cast<py::tuple>();
                   out.emplace_back(py::str(t[0]).cast<std::string>(), py::str(t[1]).cast<std::string>());
                 }
               }
               return out;
             };
             s.file = str("file");
             s.row = str("row");
             s.dtype = str("dtype");
             s.coarsest = str("coarsest");
             s.max_rel_error = r.contains("max_rel_error") ? r["max_rel_error"].cast<double>() : 0.0;
             s.ulps = r.contains("ulps") ? r["ulps"].cast<double>() : 0.0;
             s.width = r.contains("width") ? r["width"].cast<uint32_t>() : 1;
             s.settings_digest = str("settings_digest");
             s.inputs_digest = str("inputs_digest");
             s.output_digest = str("output_digest");
             s.settings = pairs("settings");
             s.precision = pairs("precision");
             s.error = str("error");
             return a.agent().AcknowledgeReplay(id, step, detail, s);
           },
           py::arg("id"), py::arg("step"), py::arg("detail"), py::arg("replay"))
      // "" while delivery looks fine; else one sentence naming the endpoint (once set, kept).
      .def("delivery_problem", [](const PyAgent& a) { return a.agent().DeliveryProblem(); })
      .def_property_readonly("sketch_k", [](const PyAgent& a) { return a.host().config().sketch_k; })
      .def_property_readonly("hist_bins",
                             [](const PyAgent& a) { return a.host().config().hist_bins; });
}

}  // namespace

void BindAgent(py::module_& m) {
  py::class_<PyAgent> agent(m, "Agent");
  DefCreate(agent);
  DefHostStatistics(agent);
  DefStepRecords(agent);
  DefLifetime(agent);
}

}  // namespace lockstep::python
