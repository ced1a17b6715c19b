// Dispatcher: takes alerts from the collector and delivers them to every configured
// sink, each on its own thread, so a slow or dead receiver never slows the caller.
//
// Threads: Submit(), Flush(), Counters() may be called from any thread; Shutdown()
// and the destructor from the owner only. Each sink owns one worker thread that does
// dedup, rate limit, delivery (with retries and backoff) and spooling.
//
// Delivery is at-least-once: an alert is removed from the spool only after the
// receiver answered 2xx (or a 4xx that retrying cannot fix, which is logged and
// counted as failed). A retry after a lost answer may deliver it twice, with the
// same id and dedup key.
#ifndef LOCKSTEP_ALERTING_DISPATCHER_H_
#define LOCKSTEP_ALERTING_DISPATCHER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/alerting/alert.h"
#include "lockstep/alerting/options.h"
#include "lockstep/common/status.h"

namespace lockstep::alerting {

class SinkWorker;

// A snapshot of one sink's counters (monotonic since Create, except pending).
struct SinkCounters {
  std::string name;
  std::string kind;
  std::string target;         // redacted
  uint64_t delivered = 0;     // accepted by the receiver (or written, for log/jsonl)
  uint64_t failed = 0;        // given up: a 4xx that will never succeed, or a local error
  uint64_t retried = 0;       // attempts after the first, over all alerts
  uint64_t spooled = 0;       // alerts that outlived their first round of retries
  uint64_t spool_dropped = 0; // oldest spooled alerts dropped to respect the size cap
  uint64_t deduped = 0;       // suppressed inside the cooldown
  uint64_t rate_limited = 0;  // dropped by the token bucket (ungrouped non-critical alerts)
  uint64_t rate_held = 0;     // incident messages held by the bucket, merged into a later one
  uint64_t filtered = 0;      // below the sink's min severity
  uint64_t queue_dropped = 0; // Submit found the sink's queue full
  uint64_t pending = 0;       // in the queue or spool now
  uint64_t already_sent = 0;  // replayed after a restart, handled before it (journal)
  std::string last_error;     // "" if the last attempt succeeded
};

class Dispatcher {
 public:
  // Validates `options` (one sentence per mistake), opens spools, starts the workers.
  static StatusOr<std::unique_ptr<Dispatcher>> Create(const AlertingOptions& options);
  ~Dispatcher();  // Shutdown(2 s)
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Hands `alert` to every sink's queue; never blocks or throws. Returns false if
  // any sink's queue was full (that copy is dropped and counted) or after Shutdown.
  bool Submit(Alert alert) noexcept;
  // Waits until every sink has nothing queued or spooled (delivered or given up).
  // Returns false at the timeout (e.g. a receiver is down; its alerts stay spooled).
  bool Flush(std::chrono::milliseconds timeout) noexcept;
  // Flushes for up to `timeout`, then stops the workers (aborting a request in
  // flight). What is still undelivered stays in the on-disk spool for next time.
  void Shutdown(std::chrono::milliseconds timeout) noexcept;

  std::vector<SinkCounters> Counters() const;

 private:
  Dispatcher() = default;
  std::vector<std::unique_ptr<SinkWorker>> workers_;
  std::atomic<bool> shut_down_{false};
};

// `lockstep alert-test`: sends `alert` once through each sink of `options` (with its
// retries, without dedup, rate limit or spool) and reports per sink.
struct SinkTestResult {
  std::string name;
  std::string target;  // redacted
  bool delivered = false;
  bool setup_failed = false;  // the sink could not be set up (a bad CA file, a path
                              // that cannot be written): a configuration mistake
  int attempts = 0;
  std::string detail;  // "HTTP 200" or why it failed
};
StatusOr<std::vector<SinkTestResult>> SendTestAlert(const AlertingOptions& options,
                                                    const Alert& alert);

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_DISPATCHER_H_
