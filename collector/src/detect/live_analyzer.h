// LiveAnalyzer: the Analyzer inside `lockstep collect`.
//
// OnMessage() runs the analyzer on the ingest thread, right after the message was
// logged: the envelope is only valid during the call and carries no size to copy it
// by, and analysis is cheap (decoding copies a few hundred bytes per record; a step
// comparison costs well under a microsecond per tensor, see align_bench). A timer
// thread calls Analyzer::Tick every tick_ms (idle step close, stall) under the same
// mutex, at the analyzer's clock's unix time (Analyzer::clock()). Exceptions inside the analyzer are caught, counted and logged; they never
// reach the ingest thread.
//
// Threads: OnMessage from the ingest thread; Start/Shutdown from the owner;
// Inspect() from any thread (it holds the analyzer's mutex while `fn` runs: keep it
// short). Alerts are handed to the analyzer's AlertFn on the ingest or timer thread,
// so that callback must not block (Dispatcher::Submit does not).
#ifndef LOCKSTEP_COLLECTOR_DETECT_LIVE_ANALYZER_H_
#define LOCKSTEP_COLLECTOR_DETECT_LIVE_ANALYZER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "detect/analyzer.h"
#include "lockstep/collector/message_sink.h"
#include "lockstep/common/thread_annotations.h"

namespace lockstep::collector {

class LiveAnalyzer : public MessageSink {
 public:
  // tick_ms bounds how late rule 3b of RunDecoder (50 ms of silence after a step's scalars)
  // closes a step; a tick costs a walk over the runs (microseconds).
  explicit LiveAnalyzer(std::unique_ptr<Analyzer> analyzer, int64_t tick_ms = 10);
  ~LiveAnalyzer() override;  // Shutdown
  LiveAnalyzer(const LiveAnalyzer&) = delete;
  LiveAnalyzer& operator=(const LiveAnalyzer&) = delete;

  void Start();      // starts the timer thread
  void Shutdown();   // stops it; idempotent

  void OnMessage(const wire::Envelope& env, int64_t recv_unix_ns) override;
  void Inspect(const std::function<void(const Analyzer&)>& fn) const;
  // Runs `fn` on the analyzer under its mutex (e.g. Finish at shutdown).
  void Mutate(const std::function<void(Analyzer&)>& fn);
  uint64_t errors() const { return errors_.load(std::memory_order_relaxed); }

 private:
  void Loop();

  std::unique_ptr<Analyzer> analyzer_ PT_GUARDED_BY(mu_);
  mutable Mutex mu_;
  Mutex stop_mu_;  // never held together with mu_
  std::condition_variable stop_cv_;
  bool stop_ GUARDED_BY(stop_mu_) = false;
  int64_t tick_ms_;
  const Clock* clock_;  // the analyzer's; immutable, read without mu_
  std::thread thread_;
  std::atomic<uint64_t> errors_{0};
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_DETECT_LIVE_ANALYZER_H_
