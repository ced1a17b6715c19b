// HostRecorder: the host statistics path of the agent engine. It runs the one-pass host
// kernel (host_stats.h) on a CPU tensor's memory, inline or on a HostStatsWorker, and
// hands the result to an Agent; it also records a result again for another name (a
// tensor the caller knows is the same memory, unchanged: a container module's output is
// its last child's output) without computing it twice.
//
// Every call answers with a typed HostResult (what happened, and the tensor's l2 norm
// when something was recorded) instead of sentinel values; bindings only convert it.
//
// Threads: Record() and Repeat() are as thread-safe as the Agent (autograd's threads
// call them concurrently): the "last statistics" that Repeat() repeats are kept per
// thread, with no lock and no allocation. The worker calls (StartWorker, Submit, Kick,
// Wait, Settle) have one producer at a time: the caller serialises them (the Python
// recorder holds the GIL and a lock around them). Nothing here allocates or locks after
// StartWorker(), except that Submit/Kick may take the worker's mutex to wake it.
// The Agent must outlive the HostRecorder.
#ifndef LOCKSTEP_AGENT_HOST_RECORDER_H_
#define LOCKSTEP_AGENT_HOST_RECORDER_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "lockstep/agent/agent.h"
#include "lockstep/agent/host_stats.h"
#include "lockstep/agent/host_stats_worker.h"
#include "lockstep/agent/types.h"
#include "lockstep/common/status.h"

namespace lockstep {

// Where a record goes: step, micro step, tensor id, execution order.
using RecordKey = HostStatsWorker::Tag;

enum class HostOutcome : uint8_t {
  kRecorded = 0,   // statistics computed (or repeated) and handed to the agent
  kRefused,        // the kernel refused the tensor (dtype): counted in errors()
  kBadLayout,      // a strided layout the kernel cannot read: copy it and try again
  kNothingToRepeat,  // Repeat(): this thread has no last statistics of this recorder
  kDropped,        // Settle(keep=false): the result was thrown away as asked
  kNotReady,       // Settle(): not the oldest computed, unsettled ticket
  kQueued,         // Submit(): the worker has it (see HostSubmit::ticket)
  kFull,           // Submit(): no worker, or it is full: compute inline instead
};

// The answer of Record / Repeat / Settle.
struct HostResult {
  HostOutcome outcome = HostOutcome::kNotReady;
  double l2 = 0;  // the tensor's l2 norm when outcome == kRecorded (NaN: no finite value)
  bool recorded() const noexcept { return outcome == HostOutcome::kRecorded; }
};

// The answer of Submit: kQueued with its ticket, or kFull / kBadLayout.
struct HostSubmit {
  HostOutcome outcome = HostOutcome::kFull;
  uint64_t ticket = 0;
  bool queued() const noexcept { return outcome == HostOutcome::kQueued; }
};

class HostRecorder {
 public:
  // `agent` is not owned and must outlive this object.
  HostRecorder(Agent* agent, const StatsConfig& config) noexcept;
  ~HostRecorder();  // stops the worker (after it computed what was submitted)
  HostRecorder(const HostRecorder&) = delete;
  HostRecorder& operator=(const HostRecorder&) = delete;

  // The kernel over `numel` contiguous elements at `data`, recorded at `key`. The
  // result becomes this thread's last statistics (Repeat). A record the agent's queue
  // refuses is counted by the agent (records_dropped), and still answers kRecorded.
  HostResult Record(const RecordKey& key, const void* data, uint64_t numel,
                    DType dtype) noexcept;
  // The same for a strided view (torch's sizes and strides, in elements), read in place.
  // kBadLayout for a layout the kernel cannot read (a negative stride, too many dims).
  HostResult RecordStrided(const RecordKey& key, const void* data, DType dtype,
                           const int64_t* sizes, const int64_t* strides, int ndim) noexcept;
  // Records again, at `key`, the statistics of this thread's last successful Record on
  // this recorder, flagged kStatRepeat on the wire. kNothingToRepeat when there is none.
  HostResult Repeat(const RecordKey& key) noexcept;

  // The kernel on a thread of its own (HostStatsWorker). `capacity`: jobs unreleased.
  Status StartWorker(uint32_t capacity) noexcept;
  bool has_worker() const noexcept { return worker_ != nullptr; }
  // Queues Record's work. The memory must stay alive and unchanged until Done() passes
  // the ticket. kFull without a worker or when it is full; kBadLayout as above.
  HostSubmit Submit(const RecordKey& key, const void* data, uint64_t numel,
                    DType dtype) noexcept;
  HostSubmit SubmitStrided(const RecordKey& key, const void* data, DType dtype,
                           const int64_t* sizes, const int64_t* strides, int ndim) noexcept;
  // Wakes the worker for jobs below its wake-up batch (the end of a backward pass).
  void Kick() noexcept {
    if (worker_) worker_->Kick();
  }
  // Tickets below this are computed.
  uint64_t Done() const noexcept { return worker_ ? worker_->Done() : 0; }
  // Waits until `ticket` is computed (bounded by the kernel time of the jobs ahead).
  void Wait(uint64_t ticket) noexcept {
    if (worker_) worker_->WaitDone(ticket);
  }
  // Settles the oldest unsettled ticket, which must be computed (else kNotReady):
  // records its result when `keep` (the caller found the memory unchanged), drops it
  // otherwise (kDropped). With `as_last` the kept result also becomes this thread's last
  // statistics (Repeat). kRefused when the kernel refused the tensor.
  HostResult Settle(uint64_t ticket, bool keep, bool as_last) noexcept;

  // Tensors the kernel refused (inline or on the worker).
  uint64_t errors() const noexcept { return errors_.load(std::memory_order_relaxed); }
  const StatsConfig& config() const noexcept { return config_; }

 private:
  HostResult RecordComputed(const RecordKey& key, const Status& computed) noexcept;

  Agent* const agent_;
  const StatsConfig config_;
  const uint64_t generation_;  // process-unique: keys this recorder's per-thread last stats
  std::unique_ptr<HostStatsWorker> worker_;
  uint64_t settled_ = 0;  // tickets below are settled (producer's)
  std::atomic<uint64_t> errors_{0};
};

}  // namespace lockstep

#endif  // LOCKSTEP_AGENT_HOST_RECORDER_H_
