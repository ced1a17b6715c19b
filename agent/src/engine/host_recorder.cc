#include "lockstep/agent/host_recorder.h"

#include <utility>

namespace lockstep {

namespace {

// The calling thread's last statistics (Repeat). Per thread, so concurrent callers
// (autograd threads) need no lock and nothing is allocated. `owner` is the recorder's
// generation number, not its address, which a later recorder could reuse.
struct LastStats {
  uint64_t owner = 0;
  TensorStats stats;
};
thread_local LastStats t_last;
std::atomic<uint64_t> g_next_generation{1};

HostResult Outcome(HostOutcome o) noexcept { return HostResult{o, 0.0}; }

}  // namespace

HostRecorder::HostRecorder(Agent* agent, const StatsConfig& config) noexcept
    : agent_(agent),
      config_(config),
      generation_(g_next_generation.fetch_add(1, std::memory_order_relaxed)) {}

HostRecorder::~HostRecorder() = default;

HostResult HostRecorder::Record(const RecordKey& key, const void* data, uint64_t numel,
                                DType dtype) noexcept {
  LastStats& last = t_last;
  last.owner = 0;
  return RecordComputed(key, ComputeHostStats(data, dtype, numel, config_, &last.stats));
}

HostResult HostRecorder::RecordStrided(const RecordKey& key, const void* data, DType dtype,
                                       const int64_t* sizes, const int64_t* strides,
                                       int ndim) noexcept {
  HostLayout layout;
  if (!MakeHostLayout(sizes, strides, ndim, &layout).ok()) {
    return Outcome(HostOutcome::kBadLayout);
  }
  LastStats& last = t_last;
  last.owner = 0;
  return RecordComputed(key,
                        ComputeHostStatsStrided(data, dtype, layout, config_, &last.stats));
}

HostResult HostRecorder::RecordComputed(const RecordKey& key, const Status& computed) noexcept {
  LastStats& last = t_last;
  if (!computed.ok()) {
    errors_.fetch_add(1, std::memory_order_relaxed);
    return Outcome(HostOutcome::kRefused);
  }
  last.owner = generation_;
  agent_->RecordStats(key.step, key.micro, key.id, key.order, last.stats);
  return HostResult{HostOutcome::kRecorded, last.stats.l2};
}

HostResult HostRecorder::Repeat(const RecordKey& key) noexcept {
  const LastStats& last = t_last;
  if (last.owner != generation_) return Outcome(HostOutcome::kNothingToRepeat);
  // Said on the wire: this name is an alias of the record just sent (the collector
  // reports the producer once, with this name as its alias).
  TensorStats repeat = last.stats;
  repeat.flags |= kStatRepeat;
  agent_->RecordStats(key.step, key.micro, key.id, key.order, repeat);
  return HostResult{HostOutcome::kRecorded, last.stats.l2};
}

Status HostRecorder::StartWorker(uint32_t capacity) noexcept {
  if (worker_) return Status::OK();
  auto w = HostStatsWorker::Start(config_, capacity);
  if (!w.ok()) return w.status();
  worker_ = std::move(w).value();
  return Status::OK();
}

HostSubmit HostRecorder::Submit(const RecordKey& key, const void* data, uint64_t numel,
                                DType dtype) noexcept {
  if (!worker_) return HostSubmit{HostOutcome::kFull, 0};
  uint64_t t = worker_->Submit(key, data, dtype, numel);
  if (t == HostStatsWorker::kNoTicket) return HostSubmit{HostOutcome::kFull, 0};
  return HostSubmit{HostOutcome::kQueued, t};
}

HostSubmit HostRecorder::SubmitStrided(const RecordKey& key, const void* data, DType dtype,
                                       const int64_t* sizes, const int64_t* strides,
                                       int ndim) noexcept {
  HostLayout layout;
  if (!MakeHostLayout(sizes, strides, ndim, &layout).ok()) {
    return HostSubmit{HostOutcome::kBadLayout, 0};
  }
  if (!worker_) return HostSubmit{HostOutcome::kFull, 0};
  uint64_t t = worker_->Submit(key, data, dtype, layout);
  if (t == HostStatsWorker::kNoTicket) return HostSubmit{HostOutcome::kFull, 0};
  return HostSubmit{HostOutcome::kQueued, t};
}

HostResult HostRecorder::Settle(uint64_t ticket, bool keep, bool as_last) noexcept {
  if (!worker_ || ticket != settled_ || ticket >= worker_->Done()) {
    return Outcome(HostOutcome::kNotReady);
  }
  RecordKey key;
  const TensorStats* stats = worker_->Result(ticket, &key);
  HostResult result = Outcome(HostOutcome::kDropped);
  if (stats == nullptr) {
    errors_.fetch_add(1, std::memory_order_relaxed);
    result = Outcome(HostOutcome::kRefused);
  } else if (keep) {
    agent_->RecordStats(key.step, key.micro, key.id, key.order, *stats);
    if (as_last) {
      t_last.stats = *stats;
      t_last.owner = generation_;
    }
    result = HostResult{HostOutcome::kRecorded, stats->l2};
  }
  worker_->Release(++settled_);
  return result;
}

}  // namespace lockstep
