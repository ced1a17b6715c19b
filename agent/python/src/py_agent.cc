#include "py_agent.h"

#include <atomic>
#include <cmath>
#include <string>
#include <utility>

namespace lockstep::python {

namespace {

// A count arrives as a double; it must be a non-negative integer below 2^53.
bool ToCount(double v, uint64_t* out) noexcept {
  if (!(v >= 0.0) || v > 9007199254740992.0) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

// The calling thread's last statistics (RecordRepeat). Per thread, so concurrent
// callers (autograd threads) need no lock and nothing is allocated. `owner` is the
// PyAgent's generation number, not its address, which a later agent could reuse.
struct LastStats {
  uint64_t owner = 0;
  TensorStats stats;
};
thread_local LastStats t_last;
std::atomic<uint64_t> g_next_generation{1};

}  // namespace

StatusOr<std::unique_ptr<PyAgent>> PyAgent::Create(const AgentOptions& options) {
  StatsConfig config;
  config.sketch_k = options.sketch_k;
  config.hist_bins = options.hist_bins;
  auto agent = Agent::Create(options);
  if (!agent.ok()) return agent.status();
  return std::unique_ptr<PyAgent>(new PyAgent(std::move(agent).value(), config));
}

PyAgent::PyAgent(std::unique_ptr<Agent> agent, StatsConfig config)
    : agent_(std::move(agent)),
      stats_config_(config),
      generation_(g_next_generation.fetch_add(1, std::memory_order_relaxed)) {}

PyAgent::~PyAgent() = default;

uint32_t PyAgent::RegisterTensor(const std::string& name, TensorKind kind, DType dtype,
                                 const std::vector<int64_t>& shape, uint32_t order,
                                 const std::string& module_type) noexcept {
  return agent_->RegisterTensor(name, kind, dtype, shape, order, module_type);
}


double PyAgent::RecordHostTensor(uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
                               const void* data, uint64_t numel, DType dtype) noexcept {
  LastStats& last = t_last;
  last.owner = 0;
  return RecordLast(step, micro, id, order,
                    ComputeHostStats(data, dtype, numel, stats_config_, &last.stats));
}

double PyAgent::RecordHostTensor(uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
                                 const void* data, DType dtype,
                                 const HostLayout& layout) noexcept {
  LastStats& last = t_last;
  last.owner = 0;
  return RecordLast(step, micro, id, order,
                    ComputeHostStatsStrided(data, dtype, layout, stats_config_, &last.stats));
}

double PyAgent::RecordLast(uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
                           const Status& computed) noexcept {
  LastStats& last = t_last;
  if (!computed.ok()) {
    host_stats_errors_.fetch_add(1, std::memory_order_relaxed);
    return -1.0;
  }
  last.owner = generation_;
  agent_->RecordStats(step, micro, id, order, last.stats);
  return last.stats.l2;
}

double PyAgent::RecordRepeat(uint64_t step, uint32_t micro, uint32_t id, uint32_t order) noexcept {
  const LastStats& last = t_last;
  if (last.owner != generation_) return -2.0;
  // Said on the wire: this name is an alias of the record just sent (the collector
  // reports the producer once, with this name as its alias).
  TensorStats repeat = last.stats;
  repeat.flags |= kStatRepeat;
  agent_->RecordStats(step, micro, id, order, repeat);
  return last.stats.l2;
}

bool PyAgent::StartHostWorker(uint32_t capacity, std::string* error) noexcept {
  if (worker_) return true;
  auto w = HostStatsWorker::Start(stats_config_, capacity);
  if (!w.ok()) {
    *error = w.status().message();
    return false;
  }
  worker_ = std::move(w).value();
  return true;
}

int64_t PyAgent::SubmitHostTensor(uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
                                  const void* data, uint64_t numel, DType dtype) noexcept {
  if (!worker_) return -1;
  uint64_t t = worker_->Submit(HostStatsWorker::Tag{step, micro, id, order}, data, dtype, numel);
  return t == HostStatsWorker::kNoTicket ? -1 : static_cast<int64_t>(t);
}

int64_t PyAgent::SubmitHostTensor(uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
                                  const void* data, DType dtype,
                                  const HostLayout& layout) noexcept {
  if (!worker_) return -1;
  uint64_t t = worker_->Submit(HostStatsWorker::Tag{step, micro, id, order}, data, dtype, layout);
  return t == HostStatsWorker::kNoTicket ? -1 : static_cast<int64_t>(t);
}

void PyAgent::HostWait(uint64_t ticket) noexcept {
  if (worker_) worker_->WaitDone(ticket);
}

double PyAgent::HostSettle(uint64_t ticket, bool keep, bool as_last) noexcept {
  if (!worker_ || ticket != settled_ || ticket >= worker_->Done()) return -2.0;
  HostStatsWorker::Tag tag;
  const TensorStats* stats = worker_->Result(ticket, &tag);
  double l2 = -2.0;
  if (stats == nullptr) {
    host_stats_errors_.fetch_add(1, std::memory_order_relaxed);
    l2 = -1.0;
  } else if (keep) {
    agent_->RecordStats(tag.step, tag.micro, tag.id, tag.order, *stats);
    if (as_last) {
      t_last.stats = *stats;
      t_last.owner = generation_;
    }
    l2 = stats->l2;
  }
  worker_->Release(++settled_);
  return l2;
}

bool UnpackRow(const double* row, size_t cols, int sketch_k, int hist_bins,
               TensorStats* out) noexcept {
  if (sketch_k < 0 || sketch_k > kMaxSketchK || hist_bins < 0 || hist_bins > kHistBins) {
    return false;
  }
  if (cols != static_cast<size_t>(kPackedFixed + sketch_k + hist_bins)) return false;
  TensorStats& s = *out;
  if (!ToCount(row[kColNumel], &s.numel) || !ToCount(row[kColNan], &s.nan_count) ||
      !ToCount(row[kColInf], &s.inf_count) || !ToCount(row[kColZero], &s.zero_count) ||
      !ToCount(row[kColSat], &s.sat_count) ||
      !ToCount(row[kColSubnormal], &s.subnormal_count)) {
    return false;
  }
  uint64_t limit = 0;
  if (!ToCount(row[kColLimitDtype], &limit) || limit > static_cast<uint64_t>(DType::kF8E5M2)) {
    return false;
  }
  s.limit_dtype = static_cast<DType>(limit);
  s.min = row[kColMin];
  s.max = row[kColMax];
  s.mean = row[kColMean];
  s.std = row[kColStd];
  s.l2 = row[kColL2];
  s.absmax = row[kColAbsmax];
  s.sketch_k = static_cast<uint16_t>(sketch_k);
  s.hist_bins = static_cast<uint8_t>(hist_bins);
  const double* sketch = row + kPackedFixed;
  for (int i = 0; i < sketch_k; ++i) s.sketch[i] = static_cast<float>(sketch[i]);
  const double* hist = sketch + sketch_k;
  for (int i = 0; i < hist_bins; ++i) {
    uint64_t c = 0;
    if (!ToCount(hist[i], &c) || c > UINT32_MAX) return false;
    s.hist[i] = static_cast<uint32_t>(c);
  }
  return true;
}

size_t PyAgent::RecordPacked(uint64_t step, const uint32_t* micros, const uint32_t* ids,
                             const uint32_t* orders, const double* rows, size_t n,
                             size_t cols, const uint8_t* flags) noexcept {
  size_t accepted = 0;
  TensorStats stats;
  for (size_t i = 0; i < n; ++i) {
    if (!UnpackRow(rows + i * cols, cols, stats_config_.sketch_k, stats_config_.hist_bins,
                   &stats)) {
      packed_errors_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    // flags[i] & kStatRepeat: row i repeats a tensor recorded before it under another
    // name (the device path computes it once); said on the wire as on the host path.
    stats.flags = flags != nullptr ? (flags[i] & kStatRepeat) : 0;
    if (agent_->RecordStats(step, micros[i], ids[i], orders[i], stats)) ++accepted;
  }
  return accepted;
}

bool PyAgent::RecordScalars(uint64_t step, const StepScalars& scalars) noexcept {
  return agent_->RecordScalars(step, scalars);
}

bool PyAgent::EndStep(uint64_t step) noexcept { return agent_->EndStep(step); }

bool PyAgent::Flush(std::chrono::milliseconds timeout) noexcept {
  return agent_->Flush(timeout);
}

bool PyAgent::Close(std::chrono::milliseconds timeout) noexcept {
  return agent_->Close(timeout);
}

AgentCounters PyAgent::Counters() const noexcept { return agent_->Counters(); }

}  // namespace lockstep::python
