#include "engine/agent_impl.h"

#include <algorithm>
#include <cstring>

#include "lockstep/common/clock.h"
#include "lockstep/common/thread_name.h"

namespace lockstep::engine {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kDestructorCloseTimeout = std::chrono::milliseconds(2000);

std::atomic<uint64_t> g_next_agent_id{1};

// A tiny per-thread cache of (agent id -> slot). Ids are never reused, so an entry of a
// destroyed agent is never matched again; the slot itself is owned by its agent.
struct TokenCache {
  static constexpr int kSlots = 4;
  uint64_t ids[kSlots] = {0, 0, 0, 0};
  ProducerSlot* tokens[kSlots] = {nullptr, nullptr, nullptr, nullptr};
  int next = 0;
};
thread_local TokenCache t_tokens;

}  // namespace

AgentImpl::AgentImpl(const AgentOptions& options, std::unique_ptr<Transport> transport)
    : options_(options),
      id_(g_next_agent_id.fetch_add(1, std::memory_order_relaxed)),
      wake_every_(static_cast<uint32_t>(std::max<size_t>(
          1, std::min(options.max_records_per_message, options.queue_capacity / 8)))),
      shared_(options.queue_capacity) {
  sender_ = std::make_unique<Sender>(options_, &shared_, std::move(transport), UnixNowNs());
  thread_ = std::thread([this] {
    SetCurrentThreadName("lockstep-agent");
    sender_->Run();
  });
}

AgentImpl::~AgentImpl() {
  Close(kDestructorCloseTimeout);
  // The sender exits once the queue is drained and the transport closed; a ZeroMQ
  // transport never blocks past its linger, so this join is bounded.
  if (thread_.joinable()) thread_.join();
}

ProducerSlot* AgentImpl::Slot() noexcept {
  TokenCache& c = t_tokens;
  for (int i = 0; i < TokenCache::kSlots; ++i) {
    if (c.ids[i] == id_) return c.tokens[i];
  }
  // Warm-up: first call of this thread on this agent.
  ProducerSlot* token = nullptr;
  try {
    std::lock_guard<std::mutex> lock(tokens_mu_);
    token = shared_.slots.Add(shared_.queue);
    if (token == nullptr || !token->token.valid()) return nullptr;
  } catch (...) {
    return nullptr;
  }
  c.ids[c.next] = id_;
  c.tokens[c.next] = token;
  c.next = (c.next + 1) % TokenCache::kSlots;
  return token;
}

uint32_t AgentImpl::RegisterTensor(const std::string& name, TensorKind kind, DType dtype,
                                   const std::vector<int64_t>& shape, uint32_t order,
                                   const std::string& module_type) noexcept {
  uint32_t id = TensorRegistry::kInvalidId;
  bool added = false;
  try {
    id = shared_.registry.Register(name, kind, dtype, shape, order, &added, module_type);
  } catch (...) {
    id = TensorRegistry::kInvalidId;
  }
  if (id == TensorRegistry::kInvalidId) {
    shared_.producer.errors.fetch_add(1, std::memory_order_relaxed);
    return id;
  }
  if (added) {
    // A hint for the sender to ship the entry soon; if it is refused (queue full), the
    // sender still ships every new entry before the next stats message.
    QueueItem item;
    item.type = ItemType::kDirectory;
    item.tensor_id = id;
    EnqueueOther(item);
  }
  return id;
}

bool AgentImpl::RecordStats(uint64_t step, uint32_t micro_step, uint32_t tensor_id,
                            uint32_t order, const TensorStats& stats) noexcept {
  ProducerSlot* slot;
  if (closed_.load(std::memory_order_relaxed) || (slot = Slot()) == nullptr) {
    shared_.producer.records_refused.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  QueueItem item;
  item.type = ItemType::kStats;
  item.micro_step = micro_step;
  item.tensor_id = tensor_id;
  item.order = order;
  item.step = step;
  QueueItem::CopyStats(stats, &item.stats);
  if (!shared_.queue.try_enqueue(slot->token, std::move(item))) {
    BumpOwned(slot->counts.records_refused);
    return false;
  }
  BumpOwned(slot->counts.records_enqueued);
  // Records wake the sender only in bunches: it ships a step's records together at
  // EndStep (which wakes it) anyway, and a wake per record put the sender (and, through
  // its socket, ZeroMQ's I/O thread) on the training thread's core once per tensor,
  // preempting the training step (measured: ~4 ms of a 37 ms CPU step off-CPU).
  if (++slot->unsignaled >= wake_every_) {
    slot->unsignaled = 0;
    shared_.WakeSender();
  }
  return true;
}

bool AgentImpl::EnqueueOther(QueueItem& item) noexcept {
  ProducerSlot* slot;
  if (closed_.load(std::memory_order_relaxed) || (slot = Slot()) == nullptr) {
    shared_.producer.other_refused.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (!shared_.queue.try_enqueue(slot->token, std::move(item))) {
    BumpOwned(slot->counts.other_refused);
    return false;
  }
  BumpOwned(slot->counts.other_enqueued);
  shared_.WakeSender();
  return true;
}

bool AgentImpl::RecordScalars(uint64_t step, const StepScalars& scalars) noexcept {
  QueueItem item;
  item.type = ItemType::kScalars;
  item.step = step;
  item.scalars = scalars;
  item.stats.sketch_k = 0;
  item.stats.hist_bins = 0;
  return EnqueueOther(item);
}

bool AgentImpl::SetFingerprint(std::vector<std::pair<std::string, std::string>> entries) noexcept {
  try {
    {
      MutexLock lock(&shared_.fingerprint_mu);
      shared_.fingerprint = std::move(entries);
    }
    shared_.fingerprint_version.fetch_add(1, std::memory_order_acq_rel);
  } catch (...) {
    shared_.producer.errors.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // Like a directory entry: a hint for the sender to ship it soon; it goes before the
  // next statistics message anyway.
  QueueItem item;
  item.type = ItemType::kDirectory;
  EnqueueOther(item);
  return true;
}

bool AgentImpl::SetSampling(const Sampling& sampling) noexcept {
  try {
    {
      MutexLock lock(&shared_.fingerprint_mu);
      shared_.sampling = sampling;
    }
    shared_.sampling_version.fetch_add(1, std::memory_order_acq_rel);
  } catch (...) {
    shared_.producer.errors.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  QueueItem item;  // a hint, as for the fingerprint: it goes before the next statistics anyway
  item.type = ItemType::kDirectory;
  EnqueueOther(item);
  return true;
}

bool AgentImpl::EndStep(uint64_t step) noexcept {
  QueueItem item;
  item.type = ItemType::kEndStep;
  item.step = step;
  return EnqueueOther(item);
}

bool AgentImpl::SetIdentity(uint32_t rank, uint32_t world_size) noexcept {
  if (world_size < 1 || rank >= world_size) {
    shared_.producer.errors.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  QueueItem item;
  item.type = ItemType::kIdentity;
  item.tensor_id = rank;
  item.order = world_size;
  return EnqueueOther(item);
}

bool AgentImpl::WaitDone(uint64_t target, Clock::time_point deadline) noexcept {
  try {
    MutexLock lock(&shared_.mu);
    return shared_.cv.wait_until(lock.native(), deadline, [&] {
      shared_.mu.AssertHeld();
      return shared_.items_done >= target || shared_.exited;
    }) && shared_.items_done >= target;
  } catch (...) {
    shared_.producer.errors.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
}

bool AgentImpl::Flush(std::chrono::milliseconds timeout) noexcept {
  auto deadline = Clock::now() + timeout;
  const auto& c = shared_.producer;
  uint64_t target = shared_.slots.Sum(c, &ProducerCounters::records_enqueued) +
                    shared_.slots.Sum(c, &ProducerCounters::other_enqueued);
  uint64_t prev = shared_.flush_target.load(std::memory_order_relaxed);
  while (prev < target &&
         !shared_.flush_target.compare_exchange_weak(prev, target, std::memory_order_acq_rel)) {
  }
  shared_.wake.signal();
  return WaitDone(target, deadline);
}

// A Record*() racing with Close() (it passed the closed_ check just before) may land
// an item after the sender's last look at the queue: that item is counted as enqueued
// but never sent. Tolerated: recording while closing is a caller bug we must not crash
// on, and closing must not wait for producers.
bool AgentImpl::Close(std::chrono::milliseconds timeout) noexcept {
  auto deadline = Clock::now() + timeout;
  if (!closed_.exchange(true, std::memory_order_acq_rel)) {
    int64_t deadline_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
    // An eighth of the timeout (at least 50 ms) is kept for what comes after the wait
    // for the send buffer: a fixed 50 ms was missed on a loaded machine (a sanitized
    // build sharing 2 cores), and Close() then returned at its deadline, not before.
    const auto reserve = std::max<std::chrono::nanoseconds>(std::chrono::milliseconds(50), timeout / 8);
    shared_.close_reserve_ns.store(reserve.count(), std::memory_order_relaxed);
    shared_.close_deadline_ns.store(deadline_ns, std::memory_order_release);
    shared_.stop.store(true, std::memory_order_release);
    shared_.wake.signal();
  }
  bool exited = false;
  try {
    MutexLock lock(&shared_.mu);
    exited = shared_.cv.wait_until(lock.native(), deadline, [&] {
      shared_.mu.AssertHeld();
      return shared_.exited;
    });
  } catch (...) {
    shared_.producer.errors.fetch_add(1, std::memory_order_relaxed);
  }
  return exited;
}

AgentCounters AgentImpl::Counters() const noexcept {
  const auto& p = shared_.producer;
  const auto& s = shared_.sender;
  AgentCounters out;
  out.records_enqueued = shared_.slots.Sum(p, &ProducerCounters::records_enqueued);
  out.records_sent = s.records_sent.load(std::memory_order_relaxed);
  out.records_dropped = shared_.slots.Sum(p, &ProducerCounters::records_refused) +
                        s.records_dropped.load(std::memory_order_relaxed);
  out.messages_sent = s.messages_sent.load(std::memory_order_relaxed);
  out.messages_dropped = s.messages_dropped.load(std::memory_order_relaxed);
  out.errors = p.errors.load(std::memory_order_relaxed) + s.errors.load(std::memory_order_relaxed);
  out.queue_depth = shared_.queue.size_approx();
  out.reconnects = s.reconnects.load(std::memory_order_relaxed);
  out.other_dropped = shared_.slots.Sum(p, &ProducerCounters::other_refused);
  out.handshakes = s.handshakes.load(std::memory_order_relaxed);
  out.handshake_failures = s.handshake_failures.load(std::memory_order_relaxed);
  out.delivery_problem = shared_.delivery_problem.load(std::memory_order_acquire);
  out.requests_received = s.requests_received.load(std::memory_order_relaxed);
  out.requests_ignored = s.requests_ignored.load(std::memory_order_relaxed);
  out.requests_bad = s.requests_bad.load(std::memory_order_relaxed);
  return out;
}

std::vector<ControlRequest> AgentImpl::TakeRequests() noexcept {
  std::vector<ControlRequest> out;
  if (!shared_.control.requests_waiting.load(std::memory_order_acquire)) return out;
  MutexLock lock(&shared_.control.mu);
  out.swap(shared_.control.requests);
  shared_.control.requests_waiting.store(false, std::memory_order_relaxed);
  return out;
}

bool AgentImpl::Acknowledge(uint64_t id, AckStatus status, uint64_t step, const std::string& detail) noexcept {
  return Answer(id, status, step, detail, nullptr);
}

bool AgentImpl::AcknowledgeReplay(uint64_t id, uint64_t step, const std::string& detail,
                                  const SelfReplay& replay) noexcept {
  try {
    // Cut to what the collector accepts (envelope_check.cc): a longer string would get
    // the whole answer refused there.
    auto cut = [](std::string s) { return s.size() > kMaxTensorNameLength ? s.substr(0, kMaxTensorNameLength) : s; };
    auto r = std::make_shared<SelfReplay>(replay);
    for (std::string* s : {&r->file, &r->row, &r->dtype, &r->coarsest, &r->settings_digest, &r->inputs_digest,
                           &r->output_digest, &r->error})
      *s = cut(std::move(*s));
    for (auto* kv : {&r->settings, &r->precision}) {
      if (kv->size() > kMaxSelfReplaySettings) kv->resize(kMaxSelfReplaySettings);
      for (auto& [k, v] : *kv) {
        k = cut(std::move(k));
        v = cut(std::move(v));
      }
    }
    return Answer(id, AckStatus::kDone, step, detail, std::move(r));
  } catch (...) {
    shared_.producer.errors.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
}

bool AgentImpl::Answer(uint64_t id, AckStatus status, uint64_t step, const std::string& detail,
                       std::shared_ptr<const SelfReplay> replay) noexcept {
  constexpr size_t kMaxDetail = kMaxTensorNameLength;  // the collector refuses longer
  try {
    {
      MutexLock lock(&shared_.control.mu);
      if (shared_.stop.load(std::memory_order_acquire) ||
          shared_.control.answers.size() >= ControlMailbox::kMaxWaiting) {
        return false;
      }
      shared_.control.answers.push_back({id, status, step, detail.substr(0, kMaxDetail), std::move(replay)});
      shared_.control.answers_waiting.store(true, std::memory_order_release);
    }
    shared_.WakeSender();
    return true;
  } catch (...) {
    shared_.producer.errors.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
}

std::string AgentImpl::DeliveryProblem() const noexcept {
  if (!shared_.delivery_problem.load(std::memory_order_acquire)) return {};
  try {
    MutexLock lock(&shared_.mu);
    return shared_.delivery_message;
  } catch (...) {
    return {};
  }
}

}  // namespace lockstep::engine
