#include "lockstep/agent/host_stats_worker.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <system_error>

namespace lockstep {

namespace {

// Between jobs the worker sleeps until woken; it does not spin or nap. Waking it costs
// the submitting (training) thread a futex call and more (below), but anything the
// worker does on the other core while idle slowed the training thread more (measured in
// the CPU overhead bench: a 1 ms spin took 27 ms steps to 30 ms; 200 us timed naps took
// the overhead ratio from 1.048 to 1.078).
//
// A sleeping worker is woken once this many jobs or bytes wait (Publish), at most a
// quarter of the capacity in jobs, so Submit never runs out of slots for want of a wake.
// The producer also wakes it where a batch ends (Kick: the recorder at the start and the
// end of each backward pass; WaitDone at the end of the step). A wake costs more than
// its futex call: in a VM the sleeping worker's core is woken by an interrupt, and the
// training thread's time grew by ~15-20 us a wake. With 4 jobs or 4 MB a resnet18 step
// (CPU, batch 16: ~290 small tensors) woke the worker 36 times; with 64 jobs or 4 MB,
// 11 times, and the watched step cost ~0.5-1 % of a step less (docs/python.md "Waking
// the thread less"). The byte bound stays small: at 16 MB the transformer bench's few
// large tensors waited so long that the step's end waited for the thread (wall 1.06
// against 1.035-1.04).
constexpr uint32_t kWakeJobs = 64;
constexpr uint64_t kWakeBytes = uint64_t{4} << 20;

// How long WaitDone polls before it sleeps: a job is often a few microseconds from done.
constexpr auto kWaitSpin = std::chrono::microseconds(20);

// Bytes per element of the dtypes the kernel reads (only for the wake-up batch).
inline uint64_t KernelElementSize(DType dtype) noexcept {
  switch (dtype) {
    case DType::kF64: return 8;
    case DType::kF32: return 4;
    default: return 2;
  }
}

inline void CpuRelax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

StatusOr<std::unique_ptr<HostStatsWorker>> HostStatsWorker::Start(const StatsConfig& config,
                                                                  uint32_t capacity) {
  if (capacity < 1 || capacity > 65536) {
    return Status::InvalidArgument("lockstep: host stats worker capacity " +
                                   std::to_string(capacity) + " is not in 1..65536");
  }
  std::unique_ptr<HostStatsWorker> w(new HostStatsWorker(config, capacity));
  try {
    w->thread_ = std::thread([p = w.get()] { p->Run(); });
    // Named here, not by the thread itself, so the name is there when Start returns.
    (void)pthread_setname_np(w->thread_.native_handle(), "ls-host-stats");
  } catch (const std::system_error& e) {
    return Status::Unavailable(std::string("lockstep: cannot start the host stats thread: ") +
                               e.what());
  }
  return w;
}

HostStatsWorker::HostStatsWorker(const StatsConfig& config, uint32_t capacity)
    : config_(config),
      capacity_(capacity),
      wake_jobs_(std::max<uint32_t>(1, std::min<uint32_t>(kWakeJobs, capacity / 4))),
      slots_(capacity) {}

HostStatsWorker::~HostStatsWorker() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_seq_cst);
  }
  work_cv_.notify_one();
  thread_.join();
}

uint64_t HostStatsWorker::Submit(const Tag& tag, const void* data, DType dtype,
                                 uint64_t numel) noexcept {
  HostLayout layout;  // one run of numel elements
  layout.ndim = 1;
  layout.numel = numel;
  layout.sizes[0] = static_cast<int64_t>(numel);
  layout.strides[0] = 1;
  return Submit(tag, data, dtype, layout);
}

uint64_t HostStatsWorker::Submit(const Tag& tag, const void* data, DType dtype,
                                 const HostLayout& layout) noexcept {
  const uint64_t t = head_.load(std::memory_order_relaxed);
  if (t - tail_ >= capacity_) return kNoTicket;
  Slot& s = slots_[t % capacity_];
  s.tag = tag;
  s.data = data;
  s.dtype = dtype;
  s.layout = layout;
  return Publish(t, layout.numel * KernelElementSize(dtype));
}

uint64_t HostStatsWorker::Publish(uint64_t t, uint64_t bytes) noexcept {
  // seq_cst store, then seq_cst load of sleeping_: paired with the worker's store of
  // sleeping_ and load of head_, one of the two sees the other (no lost wake-up).
  head_.store(t + 1, std::memory_order_seq_cst);
  if (!sleeping_.load(std::memory_order_seq_cst)) {
    unwoken_jobs_ = unwoken_bytes_ = 0;  // awake: it will see this job
    return t;
  }
  // Asleep: wake it for a batch, not for every tensor (each wake is a futex call on
  // this, the training, thread). What waits is picked up by the next wake, Kick()
  // or WaitDone().
  ++unwoken_jobs_;
  unwoken_bytes_ += bytes;
  if (unwoken_jobs_ >= wake_jobs_ || unwoken_bytes_ >= kWakeBytes) Wake();
  return t;
}

void HostStatsWorker::Kick() noexcept {
  if (sleeping_.load(std::memory_order_seq_cst)) Wake();
}

void HostStatsWorker::Wake() noexcept {
  unwoken_jobs_ = unwoken_bytes_ = 0;
  // Taking the lock orders us after the worker's check of head_ (or before it); the
  // notify comes after the unlock, so the woken worker does not block on the mutex
  // we would still hold.
  { std::lock_guard<std::mutex> lock(mu_); }
  work_cv_.notify_one();
}

void HostStatsWorker::WaitDone(uint64_t ticket) noexcept {
  const uint64_t head = head_.load(std::memory_order_relaxed);
  if (ticket >= head) ticket = head == 0 ? 0 : head - 1;
  if (head == 0 || done_.load(std::memory_order_acquire) > ticket) return;
  Kick();  // it may be asleep on jobs below the wake-up batch
  const auto spin_until = std::chrono::steady_clock::now() + kWaitSpin;
  while (std::chrono::steady_clock::now() < spin_until) {
    if (done_.load(std::memory_order_acquire) > ticket) return;
    CpuRelax();
  }
  std::unique_lock<std::mutex> lock(mu_);
  waiting_.store(true, std::memory_order_seq_cst);
  done_cv_.wait(lock, [&] { return done_.load(std::memory_order_seq_cst) > ticket; });
  waiting_.store(false, std::memory_order_relaxed);
}

const TensorStats* HostStatsWorker::Result(uint64_t ticket, Tag* tag) const noexcept {
  if (ticket < tail_ || ticket >= done_.load(std::memory_order_acquire)) return nullptr;
  const Slot& s = slots_[ticket % capacity_];
  if (tag != nullptr) *tag = s.tag;
  return s.ok ? &s.stats : nullptr;
}

void HostStatsWorker::Release(uint64_t upto) noexcept {
  const uint64_t done = done_.load(std::memory_order_acquire);
  if (upto > done) upto = done;  // an unfinished job's slot is still the worker's
  if (upto > tail_) tail_ = upto;
}

void HostStatsWorker::Compute(uint64_t t) noexcept {
  Slot& s = slots_[t % capacity_];
  s.ok = ComputeHostStatsStrided(s.data, s.dtype, s.layout, config_, &s.stats).ok();
  if (!s.ok) kernel_errors_.fetch_add(1, std::memory_order_relaxed);
}

void HostStatsWorker::Run() noexcept {
  uint64_t done = 0;
  for (;;) {
    if (done < head_.load(std::memory_order_acquire)) {
      Compute(done);
      done_.store(++done, std::memory_order_seq_cst);
      if (waiting_.load(std::memory_order_seq_cst)) {
        { std::lock_guard<std::mutex> lock(mu_); }
        done_cv_.notify_all();
      }
      continue;
    }
    std::unique_lock<std::mutex> lock(mu_);
    sleeping_.store(true, std::memory_order_seq_cst);
    work_cv_.wait(lock, [&] {
      return done < head_.load(std::memory_order_seq_cst) ||
             stop_.load(std::memory_order_relaxed);
    });
    sleeping_.store(false, std::memory_order_relaxed);
    // Stop only with nothing left: the producer may free memory once Done() passes it.
    if (done >= head_.load(std::memory_order_acquire) && stop_.load(std::memory_order_relaxed)) {
      return;
    }
  }
}

}  // namespace lockstep
