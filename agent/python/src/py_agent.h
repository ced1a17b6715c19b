// PyAgent: what `lockstep._core.Agent` wraps — a lockstep::Agent plus the host
// statistics kernel, shaped for calls from Python hooks.
//
// Threads: the hot calls (RecordHostTensor, RecordPacked, RecordScalars, EndStep) are
// called by lockstep's Python hooks on whatever thread torch runs them (the training
// thread, autograd's worker threads); they are as thread-safe as lockstep::Agent and
// run with the GIL released. They never throw: a failure returns false / a count and
// is counted by the agent (Counters().errors) or here (host_stats_errors).
#ifndef LOCKSTEP_AGENT_PYTHON_PY_AGENT_H_
#define LOCKSTEP_AGENT_PYTHON_PY_AGENT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include <utility>

#include "lockstep/agent/agent.h"
#include "lockstep/agent/host_stats.h"
#include "lockstep/agent/host_stats_worker.h"
#include "lockstep/agent/types.h"
#include "lockstep/common/status.h"

namespace lockstep::python {

// Column layout of one row of lockstep._torch_stats.device_stats(): kPackedFixed
// fixed columns, then sketch_k sketch values, then hist_bins histogram counts.
enum PackedColumn : int {
  kColNumel = 0, kColMin, kColMax, kColMean, kColStd, kColL2, kColAbsmax, kColNan,
  kColInf, kColZero, kColSat, kColSubnormal, kColLimitDtype, kPackedFixed
};

class PyAgent {
 public:
  static StatusOr<std::unique_ptr<PyAgent>> Create(const AgentOptions& options);
  ~PyAgent();
  PyAgent(const PyAgent&) = delete;
  PyAgent& operator=(const PyAgent&) = delete;

  uint32_t RegisterTensor(const std::string& name, TensorKind kind, DType dtype,
                          const std::vector<int64_t>& shape, uint32_t order,
                          const std::string& module_type = std::string()) noexcept;
  // Runs the one-pass host kernel over `numel` contiguous elements at `data` and
  // records the result. Returns the tensor's l2 norm (for the global grad norm), or
  // -1 when the kernel refused the tensor (bad dtype). A record the queue refuses is
  // counted by the agent (records_dropped), not reported here.
  double RecordHostTensor(uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
                        const void* data, uint64_t numel, DType dtype) noexcept;
  // The same for a strided view (a transposed tensor), read without a copy.
  double RecordHostTensor(uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
                          const void* data, DType dtype, const HostLayout& layout) noexcept;
  // Records again, for tensor `id`, the statistics of this thread's last successful
  // RecordHostTensor() on this agent: for a tensor the caller knows is the very same
  // memory, unchanged (a container module's output is its last child's output; one
  // gradient reaches the hooks of all of them). Returns its l2 norm, or -2 when this
  // thread has no such statistics (the caller then computes them).
  double RecordRepeat(uint64_t step, uint32_t micro, uint32_t id, uint32_t order) noexcept;

  // Host statistics off the calling thread (HostStatsWorker; the Python recorder holds
  // the GIL around every call below, which makes it the worker's single producer).
  // StartHostWorker: false (and the reason in *error) if the thread cannot start.
  bool StartHostWorker(uint32_t capacity, std::string* error) noexcept;
  bool has_host_worker() const noexcept { return worker_ != nullptr; }
  // Queues RecordHostTensor's work; returns the ticket, or -1 when the worker is full
  // or absent (the caller then calls RecordHostTensor itself). The memory must stay
  // alive and unchanged until HostDone() passes the ticket.
  int64_t SubmitHostTensor(uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
                           const void* data, uint64_t numel, DType dtype) noexcept;
  int64_t SubmitHostTensor(uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
                           const void* data, DType dtype, const HostLayout& layout) noexcept;
  // Wakes the worker for jobs below its wake-up batch (the end of a backward pass).
  void HostKick() noexcept {
    if (worker_) worker_->Kick();
  }
  // Tickets below this are computed.
  uint64_t HostDone() const noexcept { return worker_ ? worker_->Done() : 0; }
  // Waits until `ticket` is computed (bounded by the kernel time of the jobs ahead).
  void HostWait(uint64_t ticket) noexcept;
  // Settles the oldest unsettled ticket, which must be computed: records its result
  // when `keep` (the caller found the tensor unchanged), drops it otherwise. With
  // `as_last` the result also becomes this thread's last statistics (RecordRepeat).
  // Returns the l2 norm, -1 when the kernel refused the tensor, -2 when dropped or
  // when `ticket` is not the oldest computed one.
  double HostSettle(uint64_t ticket, bool keep, bool as_last) noexcept;

  // Records `n` rows of a [n, cols] row-major float64 matrix in the packed layout.
  // Returns how many were accepted.
  size_t RecordPacked(uint64_t step, const uint32_t* micros, const uint32_t* ids,
                      const uint32_t* orders, const double* rows, size_t n,
                      size_t cols, const uint8_t* flags = nullptr) noexcept;
  bool RecordScalars(uint64_t step, const StepScalars& scalars) noexcept;
  bool EndStep(uint64_t step) noexcept;
  bool SetFingerprint(std::vector<std::pair<std::string, std::string>> entries) noexcept {
    return agent_->SetFingerprint(std::move(entries));
  }
  bool SetSampling(const Sampling& sampling) noexcept { return agent_->SetSampling(sampling); }
  bool SetIdentity(uint32_t rank, uint32_t world_size) noexcept {
    return agent_->SetIdentity(rank, world_size);
  }
  bool Flush(std::chrono::milliseconds timeout) noexcept;
  bool Close(std::chrono::milliseconds timeout) noexcept;

  AgentCounters Counters() const noexcept;
  std::string DeliveryProblem() const noexcept { return agent_->DeliveryProblem(); }
  uint64_t host_stats_errors() const noexcept {
    return host_stats_errors_.load(std::memory_order_relaxed);
  }
  uint64_t packed_errors() const noexcept {
    return packed_errors_.load(std::memory_order_relaxed);
  }
  const AgentOptions& options() const noexcept { return agent_->options(); }
  const StatsConfig& stats_config() const noexcept { return stats_config_; }

 private:
  PyAgent(std::unique_ptr<Agent> agent, StatsConfig config);
  // Records this thread's last statistics (just computed, `computed` says how it went).
  double RecordLast(uint64_t step, uint32_t micro, uint32_t id, uint32_t order,
                    const Status& computed) noexcept;

  std::unique_ptr<Agent> agent_;
  StatsConfig stats_config_;
  std::unique_ptr<HostStatsWorker> worker_;  // declared after agent_: stops first
  uint64_t settled_ = 0;                     // tickets below are settled (GIL-guarded)
  const uint64_t generation_;  // process-unique: keys this agent's per-thread last stats
  std::atomic<uint64_t> host_stats_errors_{0};
  std::atomic<uint64_t> packed_errors_{0};
};

// Converts one packed row into TensorStats. false when the row is malformed (width
// does not match sketch_k/hist_bins, or a count/limit code out of range).
bool UnpackRow(const double* row, size_t cols, int sketch_k, int hist_bins,
               TensorStats* out) noexcept;

}  // namespace lockstep::python

#endif  // LOCKSTEP_AGENT_PYTHON_PY_AGENT_H_
