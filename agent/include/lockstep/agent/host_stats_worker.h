// HostStatsWorker: the host statistics kernel run on a thread of its own, so that a
// core the training job leaves idle does the kernel's work while the step goes on.
//
// Roles: one producer at a time (the Python agent calls it under the GIL, so at most one
// thread is inside at once, and the GIL orders them) submits jobs, waits for them and
// settles them; the worker thread ("ls-host-stats") computes them in ticket order.
// A job's result stays in its slot until the producer releases it: the producer decides
// after the fact whether a result may be used (the Python side checks that the tensor
// was not changed in place while the job was in flight, and drops the result if it was).
//
// Contract with the producer: a submitted job's memory stays alive and unchanged until
// Done() has passed its ticket. Submit never blocks: with `capacity` jobs unreleased it
// returns kNoTicket and the caller computes on its own thread. Nothing here allocates
// after Start(); the producer takes a lock only to wake a sleeping worker.
#ifndef LOCKSTEP_AGENT_HOST_STATS_WORKER_H_
#define LOCKSTEP_AGENT_HOST_STATS_WORKER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "lockstep/agent/host_stats.h"
#include "lockstep/agent/types.h"
#include "lockstep/common/status.h"

namespace lockstep {

class HostStatsWorker {
 public:
  // What the caller wants recorded with the result; carried through untouched.
  struct Tag {
    uint64_t step = 0;
    uint32_t micro = 0, id = 0, order = 0;
  };
  static constexpr uint64_t kNoTicket = ~uint64_t{0};

  // Starts the worker thread. `capacity`: jobs in flight or unreleased, 1..65536.
  static StatusOr<std::unique_ptr<HostStatsWorker>> Start(const StatsConfig& config,
                                                          uint32_t capacity);
  // Computes what was submitted (the producer's memory may still be read until then),
  // then stops the thread.
  ~HostStatsWorker();
  HostStatsWorker(const HostStatsWorker&) = delete;
  HostStatsWorker& operator=(const HostStatsWorker&) = delete;

  // Queues the statistics of `numel` elements of `dtype` at `data` (contiguous).
  // Returns the job's ticket (consecutive from 0), or kNoTicket when full.
  uint64_t Submit(const Tag& tag, const void* data, DType dtype, uint64_t numel) noexcept;
  // The same for a strided view (ComputeHostStatsStrided): no copy is made, so the
  // view's memory is what must stay alive and unchanged.
  uint64_t Submit(const Tag& tag, const void* data, DType dtype,
                  const HostLayout& layout) noexcept;

  // A sleeping worker is woken for a batch of jobs, not for each (see Publish); Kick()
  // wakes it for whatever waits (the end of a backward pass, say).
  void Kick() noexcept;

  // Tickets below this are computed (acquire: their results are visible).
  uint64_t Done() const noexcept { return done_.load(std::memory_order_acquire); }
  // Tickets handed out so far.
  uint64_t Submitted() const noexcept { return head_.load(std::memory_order_relaxed); }
  // Blocks until Done() > ticket (or nothing is outstanding). Bounded by the kernel's
  // time for the jobs ahead of it.
  void WaitDone(uint64_t ticket) noexcept;

  // The result of a done, unreleased ticket, and its tag; nullptr when the kernel
  // refused the input (bad dtype: counted in kernel_errors()).
  const TensorStats* Result(uint64_t ticket, Tag* tag) const noexcept;
  // Slots of tickets below `upto` may be reused. Tickets are released in order.
  void Release(uint64_t upto) noexcept;

  uint64_t kernel_errors() const noexcept {
    return kernel_errors_.load(std::memory_order_relaxed);
  }

 private:
  struct Slot {
    Tag tag;
    const void* data = nullptr;
    HostLayout layout;
    DType dtype = DType::kF32;
    bool ok = false;
    TensorStats stats;
  };

  HostStatsWorker(const StatsConfig& config, uint32_t capacity);
  uint64_t Publish(uint64_t ticket, uint64_t bytes) noexcept;  // makes `ticket` visible
  void Wake() noexcept;
  void Run() noexcept;
  void Compute(uint64_t ticket) noexcept;

  const StatsConfig config_;
  const uint64_t capacity_;
  const uint32_t wake_jobs_;  // a sleeping worker is woken once this many jobs wait
  std::vector<Slot> slots_;  // ticket t lives in slots_[t % capacity_]
  uint64_t tail_ = 0;        // producer's: tickets below are released
  uint32_t unwoken_jobs_ = 0;   // producer's: submitted since the worker went to sleep
  uint64_t unwoken_bytes_ = 0;

  alignas(64) std::atomic<uint64_t> head_{0};   // producer writes: tickets submitted
  alignas(64) std::atomic<uint64_t> done_{0};   // worker writes: tickets computed
  alignas(64) std::atomic<bool> sleeping_{false};  // the worker waits on work_cv_
  std::atomic<bool> waiting_{false};            // the producer waits on done_cv_
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> kernel_errors_{0};
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::thread thread_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_AGENT_HOST_STATS_WORKER_H_
