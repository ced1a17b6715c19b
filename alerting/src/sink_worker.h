// SinkWorker: one sink's thread. Takes alerts from its bounded queue, filters them
// (min severity; then, for an alert with an incident key on a grouping sink, the
// IncidentGrouper, which makes the few notifications of each incident; otherwise the
// dedup cooldown), rate-limits what is left (critical news always passes; the rest is
// held back and merged into the incident's next message, or for ungrouped alerts
// dropped and counted), appends it to its spool, and
// delivers the spool's head through its Transport — retrying with exponential
// backoff and jitter while the receiver fails in a way that may pass, dropping
// (with one clear log line) what a 4xx says will never succeed.
//
// Threads: Enqueue(), WaitIdle(), Snapshot() from any thread; Stop() from the owner
// (Dispatcher) once. The worker thread is the only user of the spool, filters and
// transport. Lock order: mu_ only (counters are atomics).
#ifndef LOCKSTEP_ALERTING_SRC_SINK_WORKER_H_
#define LOCKSTEP_ALERTING_SRC_SINK_WORKER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "lockstep/alerting/dispatcher.h"
#include "lockstep/alerting/options.h"
#include "lockstep/common/thread_annotations.h"
#include "incidents.h"
#include "sent_journal.h"
#include "spool.h"
#include "throttle.h"
#include "transport.h"

namespace lockstep::alerting {

class SinkWorker {
 public:
  // `index` makes the default name ("<kind>-<index>"). Opens the spool, starts the thread.
  static StatusOr<std::unique_ptr<SinkWorker>> Create(const SinkOptions& sink,
                                                      const AlertingOptions& all, size_t index);
  ~SinkWorker();
  SinkWorker(const SinkWorker&) = delete;
  SinkWorker& operator=(const SinkWorker&) = delete;

  // Never blocks beyond a short critical section; false (counted) when the queue is full.
  bool Enqueue(const Alert& alert) noexcept EXCLUDES(mu_);
  // True once nothing is queued, spooled or in flight; false at `deadline`.
  bool WaitIdle(std::chrono::steady_clock::time_point deadline) EXCLUDES(mu_);
  // Stops the thread, aborting a request in flight; queued alerts go to the spool.
  void Stop() noexcept EXCLUDES(mu_);
  SinkCounters Snapshot() const EXCLUDES(mu_);
  const std::string& name() const { return name_; }

 private:
  SinkWorker() = default;
  void Run() noexcept EXCLUDES(mu_);
  void Accept(Alert alert);
  // Rate limit, then spool: `n` is a notification or an ungrouped alert.
  void Offer(Alert n, std::chrono::nanoseconds now);
  // Digests, resolutions and held notifications due now; sets incident_wake_.
  void TickIncidents();
  void AttemptHead() EXCLUDES(mu_);
  std::chrono::milliseconds Backoff(int attempt);
  void Warn(const std::string& line);
  // The injected clock's monotonic time (dedup, rate limit, incidents).
  std::chrono::nanoseconds Now() const { return std::chrono::nanoseconds(clock_->NowMonotonicNs()); }
  // Journals a decision on `a` (see sent_journal.h); no-op without a journal.
  void Journal(const Alert& a, bool passed);

  SinkOptions sink_;
  std::string name_, redacted_target_;
  size_t capacity_ = 0;
  const Clock* clock_ = nullptr;  // never null once created
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Spool> spool_;
  std::unique_ptr<SentJournal> journal_;  // null without a spool dir
  bool journal_warned_ = false;
  std::unique_ptr<DedupFilter> dedup_;
  std::unique_ptr<IncidentGrouper> incidents_;  // null: this sink sends every alert
  // One bucket for everything this sink sends. Critical news (an alert, or an incident
  // opened or escalated to critical) takes a token when there is one but is never
  // refused, so a flood of warnings can never cost a NaN or a first divergence.
  std::unique_ptr<RateLimiter> rate_;
  std::mt19937_64 rng_{std::random_device{}()};

  // Worker-thread state.
  int attempt_ = 0;  // failed attempts of the current head
  bool down_ = false;
  std::chrono::steady_clock::time_point next_attempt_{};
  std::chrono::steady_clock::time_point last_warn_{};
  // When the incidents next need a look (digest, resolution, a held message).
  std::chrono::steady_clock::time_point incident_wake_ = std::chrono::steady_clock::time_point::max();
  uint64_t warns_suppressed_ = 0;

  mutable Mutex mu_;
  std::condition_variable wake_cv_;  // worker waits: new alerts, stop, retry due
  std::condition_variable idle_cv_;  // WaitIdle waits
  std::deque<Alert> queue_ GUARDED_BY(mu_);
  size_t spool_size_ GUARDED_BY(mu_) = 0;  // mirrors spool_->Size()
  size_t in_hand_ GUARDED_BY(mu_) = 0;     // taken from queue_, not yet in spool_size_
  bool busy_ GUARDED_BY(mu_) = false;      // alerts held outside queue_
  size_t held_ GUARDED_BY(mu_) = 0;        // incidents with a held message
  bool stop_ GUARDED_BY(mu_) = false;
  std::string last_error_ GUARDED_BY(mu_);

  struct Counters {
    std::atomic<uint64_t> delivered{0}, failed{0}, retried{0}, spooled{0}, spool_dropped{0},
        deduped{0}, rate_limited{0}, rate_held{0}, filtered{0}, queue_dropped{0}, already_sent{0};
  } c_;
  std::thread thread_;  // started last
};

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_SRC_SINK_WORKER_H_
