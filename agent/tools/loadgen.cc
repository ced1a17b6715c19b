// lockstep-loadgen: drives the public Agent API with synthetic, deterministic
// statistics, as a training job would, and prints the agent's counters at the end.
//
// Two loadgens with the same --tensors/--steps produce identical statistics, except that
// a candidate given --drift-after S drifts from step S on, in the second half of the
// tensors (in execution order) and in the loss, growing each step: a divergence whose
// first layer is tensor N/2, for demos and end-to-end tests. --init-tensors M adds M
// tensors of kind param recorded at step 0 only (initial weights, as Monitor.watch does).
//
// Pacing (--steps-per-s R): step s starts at t0 + s/R (an absolute schedule, so a slow
// step is caught up by the next ones instead of shifting all that follow). A step that
// starts more than half a period after its slot is "late"; the JSON reports how many
// were late and the worst lag, so a load test can tell a generator that fell behind
// from a collector that did.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/common/exit_codes.h"
#include "lockstep/common/flags.h"
#include "lockstep/agent/agent.h"

namespace {

using lockstep::AgentOptions;

uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1), a pure function of its arguments.
double Noise(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = SplitMix(SplitMix(SplitMix(a) ^ b) ^ c);
  return static_cast<double>(h >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

bool ParseRole(const std::string& s, lockstep::Role* role) {
  if (s == "baseline") *role = lockstep::Role::kBaseline;
  else if (s == "candidate") *role = lockstep::Role::kCandidate;
  else if (s == "solo") *role = lockstep::Role::kSolo;
  else return false;
  return true;
}

void FillStats(uint64_t tensor, uint64_t step, double drift, int sketch_k,
               lockstep::TensorStats* st) {
  const uint64_t numel = 8 * 1024;
  double scale = (0.5 + 0.25 * Noise(tensor, 0, 1)) * (1.0 + 0.05 * Noise(tensor, step, 2));
  scale *= 1.0 + drift;
  st->numel = numel;
  st->mean = 0.01 * Noise(tensor, step, 3) * (1.0 + drift);
  st->std = scale;
  st->l2 = std::sqrt(static_cast<double>(numel) * (st->std * st->std + st->mean * st->mean));
  st->absmax = 4.0 * scale;
  st->min = -st->absmax;
  st->max = st->absmax;
  st->nan_count = 0;
  st->inf_count = 0;
  st->zero_count = static_cast<uint64_t>(numel * 0.001);
  st->sat_count = 0;
  st->subnormal_count = 0;
  st->limit_dtype = lockstep::DType::kBF16;
  st->sketch_k = static_cast<uint16_t>(sketch_k);
  for (int j = 0; j < sketch_k; ++j) {
    // The sketch turns away from the baseline's as drift grows (cosine falls).
    st->sketch[j] = static_cast<float>(scale * 90.0 * (Noise(tensor, step, 100 + j) +
                                                         drift * Noise(tensor, step, 1000 + j)));
  }
  st->hist_bins = lockstep::kHistBins;
  for (int b = 0; b < lockstep::kHistBins; ++b) {
    st->hist[b] = static_cast<uint32_t>(numel / lockstep::kHistBins);
  }
}

}  // namespace

int main(int argc, char** argv) {
  AgentOptions o;
  o.run = "loadgen";
  std::string role = "solo";
  int64_t rank = 0, world_size = 1, tensors = 64, steps = 100, sketch_k = lockstep::kDefaultSketchK;
  int64_t init_tensors = 0;
  int64_t drift_after = -1, queue_capacity = static_cast<int64_t>(o.queue_capacity);
  int64_t send_hwm = o.send_hwm, max_records = static_cast<int64_t>(o.max_records_per_message);
  int64_t close_timeout_ms = 5000, heartbeat_ms = 1000;
  int64_t start_at_unix_ms = 0;
  double steps_per_s = 0;
  bool backpressure = false;

  lockstep::cli::FlagSet flags(
      "loadgen", "lockstep-loadgen [FLAGS]",
      "Sends synthetic, deterministic statistics through the lockstep agent to a collector, "
      "then prints the agent's counters as one JSON object.");
  flags.String("endpoint", &o.endpoint, "collector endpoint", "EP");
  flags.String("run", &o.run, "run id", "RUN");
  flags.String("experiment", &o.experiment, "experiment name", "NAME");
  flags.String("role", &role, "baseline, candidate or solo", "ROLE");
  flags.Int("rank", &rank, "rank of this process");
  flags.Int("world-size", &world_size, "number of ranks");
  flags.Int("tensors", &tensors, "tensors recorded per step");
  flags.Int("steps", &steps, "steps to run");
  flags.Int("init-tensors", &init_tensors, "tensors of kind param recorded at step 0 only (initial weights)");
  flags.Double("steps-per-s", &steps_per_s, "steps per second (0 = as fast as possible)", "R");
  flags.Int("start-at-unix-ms", &start_at_unix_ms,
            "wait until this wall-clock time (ms since the epoch) before step 0, so that "
            "several loadgens step together like the ranks of one job (0 = now)", "MS");
  flags.Int("sketch-k", &sketch_k, "count-sketch width per record (0 = off)", "K");
  flags.Int("drift-after", &drift_after, "candidate values drift from this step on (-1 = never)", "S");
  flags.Int("queue-capacity", &queue_capacity, "agent queue capacity in records");
  flags.Int("send-hwm", &send_hwm, "ZeroMQ send high-water mark in messages");
  flags.Int("max-records-per-message", &max_records, "records per StepStats message");
  flags.Int("heartbeat-ms", &heartbeat_ms, "heartbeat interval in milliseconds", "MS");
  flags.Int("close-timeout-ms", &close_timeout_ms, "how long Close() may take", "MS");
  flags.Bool("backpressure", &backpressure,
             "wait for the agent's queue to drain when it is half full, instead of dropping");
  flags.Range("drift-after", -1, 9e18);  // -1 = never (numbers are otherwise 0 or more)
  lockstep::Status st = flags.Parse(argc - 1, argv + 1);
  if (!st.ok()) {
    std::fprintf(stderr, "lockstep-loadgen: %s\n", st.message().c_str());
    return lockstep::cli::kExitUsage;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return lockstep::cli::kExitOk;
  }
  if (!ParseRole(role, &o.role)) {
    std::fprintf(stderr, "lockstep-loadgen: --role must be baseline, candidate or solo, not '%s'\n",
                 role.c_str());
    return lockstep::cli::kExitUsage;
  }
  if (tensors < 1 || steps < 0 || init_tensors < 0 || steps_per_s < 0 || start_at_unix_ms < 0 || queue_capacity < 1 ||
      rank < 0 || world_size < 1 || max_records < 1 || heartbeat_ms < 1 || close_timeout_ms < 0) {
    std::fprintf(stderr, "lockstep-loadgen: --tensors, --queue-capacity, --world-size, "
                         "--max-records-per-message and --heartbeat-ms must be >= 1, the others >= 0\n");
    return lockstep::cli::kExitUsage;
  }
  o.rank = static_cast<uint32_t>(rank);
  o.world_size = static_cast<uint32_t>(world_size);
  o.sketch_k = static_cast<int>(sketch_k);
  o.queue_capacity = static_cast<size_t>(queue_capacity);
  o.send_hwm = static_cast<int>(send_hwm);
  o.max_records_per_message = static_cast<size_t>(max_records);
  o.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  o.platform = "cpu";
  o.framework = "lockstep-loadgen";

  auto created = lockstep::Agent::Create(o);
  if (!created.ok()) {
    std::fprintf(stderr, "lockstep-loadgen: %s\n", created.status().message().c_str());
    return lockstep::cli::kExitUsage;
  }
  std::unique_ptr<lockstep::Agent> agent = std::move(created).value();

  std::vector<uint32_t> ids(static_cast<size_t>(tensors));
  for (int64_t t = 0; t < tensors; ++t) {
    std::string name = "layers." + std::to_string(t / 4) + ".op" + std::to_string(t % 4);
    ids[t] = agent->RegisterTensor(name, lockstep::TensorKind::kAct, lockstep::DType::kBF16,
                                   {8, 1024}, static_cast<uint32_t>(t));
  }

  std::vector<uint32_t> init_ids(static_cast<size_t>(init_tensors));
  for (int64_t t = 0; t < init_tensors; ++t) {
    init_ids[t] = agent->RegisterTensor("layers." + std::to_string(t / 2) + (t % 2 ? ".bias" : ".weight"),
                                        lockstep::TensorKind::kParam, lockstep::DType::kF32, {1024},
                                        static_cast<uint32_t>(tensors + t));
  }

  if (start_at_unix_ms > 0) {
    std::this_thread::sleep_until(std::chrono::system_clock::time_point(
        std::chrono::milliseconds(start_at_unix_ms)));
  }
  auto stats = std::make_unique<lockstep::TensorStats>();
  auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  uint64_t attempts = 0, refused = 0, late_steps = 0;
  double max_lag_s = 0;
  for (int64_t s = 0; s < steps; ++s) {
    if (steps_per_s > 0) {
      auto slot = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(s / steps_per_s));
      std::this_thread::sleep_until(slot);
      double lag = std::chrono::duration<double>(std::chrono::steady_clock::now() - slot).count();
      max_lag_s = std::max(max_lag_s, lag);
      if (lag > 0.5 / steps_per_s) ++late_steps;
    }
    if (backpressure && agent->Counters().queue_depth * 2 + static_cast<uint64_t>(tensors) >
                            static_cast<uint64_t>(queue_capacity)) {
      agent->Flush(std::chrono::seconds(5));
    }
    for (int64_t t = 0; s == 0 && t < init_tensors; ++t) {
      FillStats(static_cast<uint64_t>(tensors + t), 0, 0.0, o.sketch_k, stats.get());
      ++attempts;
      if (!agent->RecordStats(0, 0, init_ids[t], static_cast<uint32_t>(tensors + t), *stats)) ++refused;
    }
    bool drifting = o.role == lockstep::Role::kCandidate && drift_after >= 0 && s >= drift_after;
    double step_drift = drifting ? 0.02 * static_cast<double>(s - drift_after + 1) : 0.0;
    for (int64_t t = 0; t < tensors; ++t) {
      double drift = t >= tensors / 2 ? step_drift : 0.0;
      FillStats(static_cast<uint64_t>(t), static_cast<uint64_t>(s), drift, o.sketch_k, stats.get());
      ++attempts;
      if (!agent->RecordStats(static_cast<uint64_t>(s), 0, ids[t], static_cast<uint32_t>(t), *stats)) ++refused;
    }
    lockstep::StepScalars sc;
    sc.loss = 2.0 * std::exp(-static_cast<double>(s) / 200.0) + 0.01 * Noise(7, s, 0) + step_drift;
    sc.lr = 1e-4;
    sc.grad_norm = 1.0 + 0.1 * Noise(8, s, 0);
    auto now = std::chrono::steady_clock::now();
    sc.step_time_s = std::chrono::duration<double>(now - last).count();
    last = now;
    agent->RecordScalars(static_cast<uint64_t>(s), sc);
    agent->EndStep(static_cast<uint64_t>(s));
  }
  bool flushed = agent->Flush(std::chrono::milliseconds(close_timeout_ms));
  bool closed = agent->Close(std::chrono::milliseconds(close_timeout_ms));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  lockstep::AgentCounters c = agent->Counters();
  std::printf(
      "{\"run\":\"%s\",\"rank\":%u,\"attempts\":%llu,\"refused\":%llu,\"records_enqueued\":%llu,"
      "\"records_sent\":%llu,\"records_dropped\":%llu,\"messages_sent\":%llu,"
      "\"messages_dropped\":%llu,\"other_dropped\":%llu,\"errors\":%llu,\"reconnects\":%llu,"
      "\"late_steps\":%llu,\"max_lag_ms\":%.1f,\"flushed\":%s,\"closed\":%s,\"seconds\":%.3f}\n",
      o.run.c_str(), o.rank, (unsigned long long)attempts, (unsigned long long)refused,
      (unsigned long long)c.records_enqueued, (unsigned long long)c.records_sent,
      (unsigned long long)c.records_dropped, (unsigned long long)c.messages_sent,
      (unsigned long long)c.messages_dropped, (unsigned long long)c.other_dropped,
      (unsigned long long)c.errors, (unsigned long long)c.reconnects,
      (unsigned long long)late_steps, max_lag_s * 1e3, flushed ? "true" : "false",
      closed ? "true" : "false", secs);
  return closed ? lockstep::cli::kExitOk : lockstep::cli::kExitRuntime;
}
