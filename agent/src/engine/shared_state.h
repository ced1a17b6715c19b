// SharedState: what the agent's producers (training threads), its control calls
// (Flush/Close, any thread) and its sender thread share.
//
// Counters are relaxed atomics: each is written by one side only (producers or the
// sender) and read for snapshots and heartbeats, where an approximate value is fine.
// The two sides' counters sit on separate cache lines so the hot path does not bounce
// the sender's line. Lock order: only `mu` exists here (TensorRegistry has its own mutex,
// never held together with it).
#ifndef LOCKSTEP_AGENT_ENGINE_SHARED_STATE_H_
#define LOCKSTEP_AGENT_ENGINE_SHARED_STATE_H_

#include <atomic>
#include <cassert>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/queue_item.h"
#include "engine/tensor_registry.h"
#include "lockstep/common/thread_annotations.h"
// After queue_item.h: the semaphore header relies on concurrentqueue.h's macros.
#include <concurrentqueue/lightweightsemaphore.h>  // NOLINT(build/include_order)

namespace lockstep::engine {

// The producer side's counts. Every producer thread keeps its own (ProducerSlot) and
// readers sum them with the shared ones below, which count only the rare cases
// without a slot (closed agent, no token) and are bumped with fetch_add.
struct alignas(64) ProducerCounters {
  std::atomic<uint64_t> records_enqueued{0};  // stats records accepted by the queue
  std::atomic<uint64_t> records_refused{0};   // stats records refused (queue full or closed)
  std::atomic<uint64_t> other_enqueued{0};    // scalars / end-step / directory notices accepted
  std::atomic<uint64_t> other_refused{0};     // ... refused
  std::atomic<uint64_t> errors{0};            // caught exceptions, token failures
};

// One producer thread's queue token and counters. Its only writer is that thread, so a
// count is a relaxed load + store: no locked instruction. On x86 a locked add (what
// fetch_add is) waits for every store before it — the ~330 bytes of the item just
// written into cold queue memory — and that wait was two thirds of RecordStats.
struct alignas(64) ProducerSlot {
  explicit ProducerSlot(Queue& q) : token(q) {}
  moodycamel::ProducerToken token;
  ProducerCounters counts;  // `errors` unused here
  uint32_t unsignaled = 0;  // records enqueued since this thread last woke the sender
};

inline void BumpOwned(std::atomic<uint64_t>& a) noexcept {
  a.store(a.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

// The producer slots of an agent: appended under the owner's mutex, read lock-free.
class ProducerSlots {
 public:
  static constexpr size_t kMax = 64;  // producer threads per agent; later ones are refused
  ~ProducerSlots() {
    for (size_t i = 0; i < count_.load(std::memory_order_acquire); ++i) delete slots_[i].load();
  }
  // nullptr when full. Callers serialize Add() (AgentImpl::tokens_mu_).
  ProducerSlot* Add(Queue& q) {
    size_t n = count_.load(std::memory_order_relaxed);
    if (n >= kMax) return nullptr;
    auto* slot = new ProducerSlot(q);
    slots_[n].store(slot, std::memory_order_release);
    count_.store(n + 1, std::memory_order_release);
    return slot;
  }
  // `shared` plus the same counter of every slot.
  uint64_t Sum(const ProducerCounters& shared, std::atomic<uint64_t> ProducerCounters::*field) const noexcept {
    uint64_t total = (shared.*field).load(std::memory_order_relaxed);
    size_t n = count_.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i)
      total += (slots_[i].load(std::memory_order_acquire)->counts.*field).load(std::memory_order_relaxed);
    return total;
  }

 private:
  std::atomic<ProducerSlot*> slots_[kMax] = {};
  std::atomic<size_t> count_{0};
};

struct alignas(64) SenderCounters {
  std::atomic<uint64_t> records_sent{0};
  std::atomic<uint64_t> records_dropped{0};   // records inside messages the socket refused
  std::atomic<uint64_t> messages_sent{0};
  std::atomic<uint64_t> messages_dropped{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> reconnects{0};
  std::atomic<uint64_t> last_step{0};
  std::atomic<uint64_t> handshakes{0};
  std::atomic<uint64_t> handshake_failures{0};
  std::atomic<uint64_t> requests_received{0};
  std::atomic<uint64_t> requests_ignored{0};
  std::atomic<uint64_t> requests_bad{0};
};

// The control channel's two mailboxes (docs/design.md "The control channel"): requests
// the sender thread took off the control socket, for the job (Agent::TakeRequests),
// and the job's answers, for the sender to put on the wire. Rare (a few per run), so a
// mutex; `waiting` lets the job's per-step check be one relaxed load.
struct ControlMailbox {
  static constexpr size_t kMaxWaiting = 64;  // each way; more are refused (and counted)
  struct Answer {
    uint64_t id = 0;
    AckStatus status = AckStatus::kDone;
    uint64_t step = 0;
    std::string detail;
    std::shared_ptr<const SelfReplay> replay;  // a capture's own replay (or none)
  };
  Mutex mu;
  std::vector<ControlRequest> requests GUARDED_BY(mu);
  std::vector<Answer> answers GUARDED_BY(mu);
  std::atomic<bool> requests_waiting{false};
  std::atomic<bool> answers_waiting{false};
};

struct SharedState {
  explicit SharedState(size_t capacity) : queue(capacity) {}

  Queue queue;
  ProducerSlots slots;  // after the queue: the tokens go before it
  TensorRegistry registry;
  ProducerCounters producer;
  SenderCounters sender;
  ControlMailbox control;

  // Wakes the sender. Producers signal only while `sender_sleeping` is set, so a busy
  // sender costs them one relaxed load, not a shared read-modify-write.
  moodycamel::LightweightSemaphore wake;
  alignas(64) std::atomic<bool> sender_sleeping{false};

  // Control (Flush/Close): the sender publishes, under `mu`, how many queue items it
  // has fully handled (sent or dropped) and whether it has exited; waiters use `cv`.
  std::atomic<uint64_t> flush_target{0};  // items that a Flush() waits for (max over callers)
  std::atomic<bool> stop{false};          // Close(): drain, say goodbye, exit
  std::atomic<int64_t> close_deadline_ns{0};  // steady_clock; bounds the final linger
  // How long before that deadline the sender stops waiting for the send buffer, so the
  // final batch, heartbeat and Goodbye still fit (Close() sets it from its timeout).
  std::atomic<int64_t> close_reserve_ns{0};
  mutable Mutex mu;  // mutable: DeliveryProblem() reads under it
  std::condition_variable cv;
  uint64_t items_done GUARDED_BY(mu) = 0;

  // The run fingerprint (Agent::SetFingerprint): written by the caller, read by the
  // sender, both under fingerprint_mu; fingerprint_version counts the updates.
  Mutex fingerprint_mu;
  std::vector<std::pair<std::string, std::string>> fingerprint GUARDED_BY(fingerprint_mu);
  std::atomic<uint32_t> fingerprint_version{0};
  // The sampling (Agent::SetSampling), the same way: under fingerprint_mu, versioned.
  Sampling sampling GUARDED_BY(fingerprint_mu);
  std::atomic<uint32_t> sampling_version{0};
  bool exited GUARDED_BY(mu) = false;
  // Set once by the sender (under mu, then the flag): nothing reached a collector.
  std::atomic<bool> delivery_problem{false};
  std::string delivery_message GUARDED_BY(mu);  // written once before the flag

  void WakeSender() noexcept {
    // Deliberately no fence between the enqueue and this load: a seq_cst fence here
    // waits for the item's stores to reach (cold) memory and cost ~90% of RecordStats.
    // The price is a rare missed wake-up (the sender went to sleep just as we
    // enqueued), bounded by the sender's longest sleep (sender.cc kMaxSleep).
    // The exchange lets one producer (not every one until the sender is scheduled)
    // pay for the semaphore's shared read-modify-write.
    if (sender_sleeping.load(std::memory_order_relaxed) &&
        sender_sleeping.exchange(false, std::memory_order_relaxed)) {
      wake.signal();
    }
  }
};

}  // namespace lockstep::engine

#endif  // LOCKSTEP_AGENT_ENGINE_SHARED_STATE_H_
