// CollectService: the `lockstep collect` daemon as one object. It builds every part from
// one CollectOptions, wires them once, and stops them in one written order (the idea of
// opentelemetry-cpp's TracerContext: the owner and destroyer of its processors).
//
//   CollectPart failed;
//   auto svc = CollectService::Create(options, &failed);  // binds ingest, view, /metrics
//   if (!svc.ok()) ...;                                    // `failed` says which part
//   (*svc)->Start();        // replays existing logs, then starts the threads
//   (*svc)->Run(wait_fn);   // status lines and health checks until wait_fn says stop
//   (*svc)->Shutdown();     // the teardown below; also run by the destructor
//
// The parts, and who feeds whom:
//   Collector (ingest thread) -> SettingsRecorder, LiveAnalyzer, ViewModel, MetricsFeed
//                                (MessageSinks, called in that order per message)
//   LiveAnalyzer (ingest + timer threads) -> pair steps to ViewModel, ReportRecorder;
//                                            alerts to the fan-out
//   Collector's disk health (ingest thread) -> a "collector_disk" alert to the fan-out
//   the fan-out (DeliverAlert) -> ViewModel, MetricsFeed, ReportRecorder, Dispatcher
//                                 (whose sinks are the log, the --alerts-file jsonl file,
//                                 webhooks, Alertmanager)
//   Retention (own thread) thins closed log segments; its problems are "collector_disk"
//                          alerts to the fan-out, which notes each alert's steps for it
//   ViewPublisher (own thread) reads the Registry, the ViewModel, LiveAnalyzer::errors()
//   MetricsServer (own thread) reads the Collector, LiveAnalyzer, Dispatcher, MetricsFeed,
//                              Retention's counters and serves the live report from the
//                              ReportRecorder
//
// Start(), in this order:
//   1. Restart replay: when Collector::Create found run logs in the data dir, they are fed
//      through SettingsRecorder, LiveAnalyzer, ViewModel and MetricsFeed in receive order
//      (docs/runlog.md "Restart") with the analyzer's clock at each message's receive
//      time. Alerts derived again are marked `replayed` (each alert sink skips those its
//      journal shows it handled before). Agents may already connect: their messages wait
//      in the bound socket.
//   2. The analyzer's timer thread, 3. the ingest thread, 4. the view feed's thread,
//   5. the retention thread. (/metrics serves from Create on: it only reads.)
//
// Shutdown() (and the destructor), in reverse dependency order:
//   0. Retention: its thread stops (a segment being thinned is finished first).
//   1. Collector: drain the socket, flush and fsync the logs, join the ingest thread.
//      First, so no message reaches a sink and no disk alert is raised past this point.
//   2. ViewPublisher, 3. MetricsServer: the readers stop before what they read goes.
//   4. LiveAnalyzer: stop its timer, then Finish() (compare what is complete, read
//      recorded baselines to their end); its last alerts still reach the dispatcher.
//   5. Dispatcher: flush (up to 3 s), then stop; undelivered alerts stay spooled.
//   6. A last status line (Shutdown only, when status lines are on).
// The stopped objects are then destroyed in the reverse order of their declaration below:
// each one before every part it points to (the status line and the two readers, then the
// Collector, which points to its sinks, then the analyzer, which calls the recorders and
// the fan-out, and the dispatcher last).
//
// Threads: Create, Start, Run, Shutdown and the destructor from one controlling thread.
// The accessors from any thread after Create (the parts' own contracts apply).
// DeliverAlert runs on the ingest, the analyzer's timer or the retention thread (or the
// controlling thread during replay) and never blocks.
#ifndef LOCKSTEP_COLLECTOR_SERVICE_COLLECT_SERVICE_H_
#define LOCKSTEP_COLLECTOR_SERVICE_COLLECT_SERVICE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runlog/log_replay.h"
#include "lockstep/alerting/alert.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/status.h"
#include "lockstep/common/thread_annotations.h"
#include "service/collect_options.h"
#include "service/follow_up.h"

namespace lockstep::alerting {
class Dispatcher;
}

namespace lockstep::collector {

// The analyzer's clock in a CollectService: while a restart replays the logs, unix time
// is the replayed message's receive time (so alerts and silences are dated as they were
// first seen); otherwise, and for monotonic time always, the service's clock.
// Threads: SetReplayUnixNs from the controlling thread during the replay; the readings
// from any thread.
class ReplayClock final : public Clock {
 public:
  explicit ReplayClock(const Clock* base) : base_(base) {}
  // 0 ends the replay: unix time is the base clock's again.
  void SetReplayUnixNs(int64_t ns) noexcept { replay_ns_.store(ns, std::memory_order_relaxed); }
  int64_t NowUnixNs() const noexcept override {
    const int64_t t = replay_ns_.load(std::memory_order_relaxed);
    return t != 0 ? t : base_->NowUnixNs();
  }
  int64_t NowMonotonicNs() const noexcept override { return base_->NowMonotonicNs(); }

 private:
  const Clock* base_;
  std::atomic<int64_t> replay_ns_{0};
};

class Collector;
class LiveAnalyzer;
class Retention;
class ReportRecorder;
class SettingsRecorder;
class ViewModel;
class ViewPublisher;
namespace metrics {
class MetricsFeed;
class MetricsServer;
}  // namespace metrics

// Which part Create() failed to build: the caller maps it to its exit code.
enum class CollectPart {
  kNone,
  kIngest,    // Collector::Create (endpoint, data dir, its lock) or adding a sink
  kAlerting,  // Dispatcher::Create (spool dir, a sink that cannot be set up)
  kBaseline,  // the --baseline run log cannot be read
  kView,      // the view feed could not be bound and view_required
  kMetrics,   // /metrics could not be bound and metrics_required
};

class CollectService {
 public:
  // Builds and wires every part; binds the ingest socket, the view feed and /metrics;
  // starts the dispatcher's workers and the metrics server. Every error is one sentence
  // naming the thing; `*failed` (optional) names the part.
  static StatusOr<std::unique_ptr<CollectService>> Create(CollectOptions options,
                                                          CollectPart* failed = nullptr);
  ~CollectService();  // the teardown above, without the last status line
  CollectService(const CollectService&) = delete;
  CollectService& operator=(const CollectService&) = delete;

  // The restart replay, then the threads (the order above). Logs where it collects and
  // who may connect. An error when the ingest thread cannot start; call once.
  Status Start();

  // Waits for a stop: calls `wait_for_stop(max)` (wait at most `max`, return true to
  // stop) again and again, at least once a second, and between the calls logs a status
  // line every status_interval_s, checks the ingest thread's health and hands freed heap
  // back to the kernel every 10 s. OK once `wait_for_stop` returned true; the ingest
  // thread's error if it died (then call Shutdown, or let the destructor run).
  using WaitFn = std::function<bool(std::chrono::nanoseconds max)>;
  Status Run(const WaitFn& wait_for_stop);

  // The teardown above. Idempotent. The Collector's shutdown result: Timeout when
  // messages were still queued at the 5 s deadline, the ingest thread's error if it died.
  Status Shutdown();

  const CollectOptions& options() const { return options_; }
  const Collector& collector() const { return *collector_; }  // endpoints(), counters()
  const LiveAnalyzer& analyzer() const { return *live_; }
  const alerting::Dispatcher& dispatcher() const { return *dispatcher_; }
  const ReportRecorder& report() const { return *report_recorder_; }
  const metrics::MetricsFeed& metrics_feed() const { return *metrics_feed_; }
  // The view feed's endpoint with its port resolved; "" when none is served.
  std::string view_endpoint() const;
  // /metrics' bound "HOST:PORT"; "" when none is served.
  std::string metrics_address() const;
  // Alerts handed to the fan-out so far (live and replayed), and the replayed ones.
  uint64_t alerts() const { return alerts_.load(std::memory_order_relaxed); }
  uint64_t replayed_alerts() const { return replayed_alerts_.load(std::memory_order_relaxed); }
  // What Start()'s replay did (all zero when there was nothing to replay).
  const ReplayStats& replay_stats() const { return replay_stats_; }

 private:
  class StatusLine;

  explicit CollectService(CollectOptions options);
  Status Build(CollectPart* failed);
  void Replay();
  Status Teardown(bool last_status_line);
  // The one alert fan-out: every alert of the analyzer and of the collector goes here.
  void DeliverAlert(alerting::Alert a);
  // A POST from this machine on the HTTP port (metrics::MetricsServerHandlers::action):
  // /zoom?experiment=NAME&module=MODULE[&steps=N], `lockstep zoom`.
  int Act(std::string_view target, std::string* reply);
  void OnLogHealth(bool failing, const std::string& message);
  void OnRetentionProblem(const std::string& metric, const std::string& message);

  CollectOptions options_;
  const Clock* clock_;           // options_.clock or the real clock
  ReplayClock analyzer_clock_;   // the analyzer's: clock_, or the replayed time in Replay()

  // Declared so that destruction (reverse order) stops users before what they use.
  std::unique_ptr<alerting::Dispatcher> dispatcher_;
  std::unique_ptr<ViewModel> view_model_;
  std::unique_ptr<metrics::MetricsFeed> metrics_feed_;
  std::unique_ptr<ReportRecorder> report_recorder_;
  std::unique_ptr<SettingsRecorder> settings_recorder_;
  std::unique_ptr<LiveAnalyzer> live_;
  std::unique_ptr<Collector> collector_;  // holds pointers to the four sinks above
  std::unique_ptr<ViewPublisher> view_pub_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
  std::unique_ptr<StatusLine> status_line_;
  // What the collector asks of the runs after a first divergence (zoom, capture);
  // after collector_, which it uses, and fed by the analyzer and ingest threads.
  std::unique_ptr<FollowUp> follow_up_;
  // Thins closed log segments; last, so destroyed (and stopped) first. The metrics
  // server reads its counters, and is stopped by Teardown before this goes.
  std::unique_ptr<Retention> retention_;

  // The last step compared of each experiment's (baseline, candidate) pairs: retention
  // thins no step a pair that still compares has not compared (runlog/retention.h).
  // Written by the analyzer's pair-step observer, read by the retention thread; a leaf
  // lock.
  mutable Mutex progress_mu_;
  std::map<std::string, std::map<std::pair<std::string, std::string>, uint64_t>> pair_progress_
      GUARDED_BY(progress_mu_);
  std::vector<PairProgress> Pairs(const std::string& experiment) const EXCLUDES(progress_mu_);

  // During the replay alerts are marked replayed.
  std::atomic<bool> replaying_{false};
  std::atomic<uint64_t> alerts_{0};
  std::atomic<uint64_t> replayed_alerts_{0};
  ReplayStats replay_stats_;
  bool started_ = false;
  bool torn_down_ = false;
  Status shutdown_status_;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_SERVICE_COLLECT_SERVICE_H_
