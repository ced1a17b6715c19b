#include "service/collect_service.h"

#include <malloc.h>

#include <algorithm>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "lockstep/common/url_encoding.h"

#include "rules/detection_settings.h"
#include "detect/live_analyzer.h"
#include "lockstep/alerting/dispatcher.h"
#include "lockstep/collector/collector.h"
#include "metrics/collector_metrics.h"
#include "metrics/http_server.h"
#include "metrics/metrics_feed.h"
#include "report/live_report.h"
#include "report/report_recorder.h"
#include "runlog/retention.h"
#include "view/view_model.h"
#include "view/view_publisher.h"

namespace lockstep::collector {
namespace {

// One line at start: who can reach the ingest socket (docs/security.md).
std::string AccessSummary(const Collector& c) {
  bool loopback = std::all_of(c.endpoints().begin(), c.endpoints().end(), IsLoopbackEndpoint);
  std::string reach = loopback ? "loopback only: agents on other hosts cannot connect"
                               : "reachable from other hosts";
  std::string key = c.curve_public_key();
  if (key.empty()) return "access: " + reach + "; no CURVE (plain ZeroMQ, unauthenticated)";
  std::string who =
      c.options().curve.authorized_keys.empty()
          ? "any agent holding the collector's public key"
          : std::to_string(c.options().curve.authorized_keys.size()) + " authorized agent key(s)";
  return "access: " + reach + "; CURVE on (collector public key " + key + "), admitting " + who;
}

// The sinks of a restart's replay: what the live collector feeds, in the same order,
// with the analyzer's clock set to each message's receive time.
class ReplayFanOut : public MessageSink {
 public:
  ReplayFanOut(std::vector<MessageSink*> sinks, ReplayClock* clock)
      : sinks_(std::move(sinks)), clock_(clock) {}
  void OnMessage(const wire::Envelope& env, int64_t recv_ns) override {
    clock_->SetReplayUnixNs(recv_ns);
    for (auto* s : sinks_) s->OnMessage(env, recv_ns);
  }

 private:
  std::vector<MessageSink*> sinks_;
  ReplayClock* clock_;
};

}  // namespace

// Rates since the previous line; the controlling thread only.
class CollectService::StatusLine {
 public:
  StatusLine(const Collector& c, const Clock* clock)
      : c_(c), clock_(clock), last_ns_(clock->NowMonotonicNs()), prev_(c.counters()) {}
  void Print() {
    const int64_t now_ns = clock_->NowMonotonicNs();
    auto cur = c_.counters();
    double dt = static_cast<double>(now_ns - last_ns_) * 1e-9;
    if (dt <= 0) dt = 1e-9;
    auto t = c_.registry().Totals();
    spdlog::info(
        "status: {} runs ({} ranks), {:.0f} records/s, {:.0f} messages/s, {} records in all; "
        "agent drops {}, gaps {}, duplicates {}, bad messages {}, log errors {}{}",
        t.runs, t.ranks, (cur.records - prev_.records) / dt, (cur.accepted - prev_.accepted) / dt,
        t.records, t.agent_records_dropped, t.gaps, t.duplicates, cur.rejected, cur.log_errors,
        c_.curve_public_key().empty() ? ""
                                      : fmt::format(", refused connections {}", cur.auth.refused));
    prev_ = cur;
    last_ns_ = now_ns;
  }

 private:
  const Collector& c_;
  const Clock* clock_;
  int64_t last_ns_;
  CollectorCounters prev_;
};

CollectService::CollectService(CollectOptions options)
    : options_(std::move(options)),
      clock_(RealClockOr(options_.clock)),
      analyzer_clock_(clock_) {}

CollectService::~CollectService() { (void)Teardown(/*last_status_line=*/false); }

StatusOr<std::unique_ptr<CollectService>> CollectService::Create(CollectOptions options,
                                                                 CollectPart* failed) {
  CollectPart where = CollectPart::kNone;
  std::unique_ptr<CollectService> svc(new CollectService(std::move(options)));
  Status s = svc->Build(&where);
  if (failed) *failed = where;
  if (!s.ok()) return s;  // the destructor stops what was built
  return svc;
}

// The order of the steps is the order of the errors a user sees first: the ingest
// endpoint and data dir, the alert sinks, the baseline, the view feed, /metrics.
Status CollectService::Build(CollectPart* failed) {
  CollectorOptions ingest = options_.ingest;
  // Called on the ingest thread only, which starts after every part below exists.
  ingest.on_log_health = [this](bool failing, const std::string& message) {
    OnLogHealth(failing, message);
  };
  // follow_up_ exists before the ingest thread starts (below, with the analyzer).
  ingest.on_control_answer = [this](const std::string& run, const ControlRequestState& r) {
    follow_up_->OnAnswer(run, r);
  };
  auto c = Collector::Create(std::move(ingest));
  if (!c.ok()) {
    *failed = CollectPart::kIngest;
    return c.status();
  }
  collector_ = std::move(*c);

  if (options_.ingest.segment_bytes > 0) {
    RetentionOptions r = options_.retention;
    r.data_dir = options_.ingest.data_dir;
    // On the retention thread, which starts after every part exists (Start()).
    r.on_alert = [this](const std::string& metric, const std::string& message) {
      OnRetentionProblem(metric, message);
    };
    r.pairs = [this](const std::string& experiment) { return Pairs(experiment); };
    retention_ = std::make_unique<Retention>(std::move(r));
  }

  auto d = alerting::Dispatcher::Create(options_.alerting);
  if (!d.ok()) {
    *failed = CollectPart::kAlerting;
    return d.status();
  }
  dispatcher_ = std::move(*d);
  view_model_ = std::make_unique<ViewModel>();
  metrics_feed_ = std::make_unique<metrics::MetricsFeed>();
  report_recorder_ = std::make_unique<ReportRecorder>();

  AnalyzerOptions an_opt = options_.analysis;
  an_opt.data_dir = options_.ingest.data_dir;
  auto analyzer = std::make_unique<Analyzer>(
      std::move(an_opt), [this](alerting::Alert a) { DeliverAlert(std::move(a)); },
      &analyzer_clock_);
  analyzer->SetPairStepObserver([this](const PairCtx& ctx, const PairStepView& v) {
    view_model_->OnPairStep(ctx, v);
    report_recorder_->OnPairStep(ctx, v);
    if (retention_) {
      MutexLock l(&progress_mu_);
      uint64_t& p = pair_progress_[ctx.experiment][{ctx.baseline, ctx.candidate}];
      p = std::max(p, v.step);
    }
    if (!replaying_.load(std::memory_order_relaxed)) follow_up_->OnPairStep(ctx);
  });
  follow_up_ = std::make_unique<FollowUp>(
      collector_.get(), options_.zoom_steps, options_.capture_birth, clock_,
      [this](alerting::Alert a) { DeliverAlert(std::move(a)); }, options_.sample_quiet,
      std::chrono::duration_cast<std::chrono::nanoseconds>(options_.alerting.incident_resolve_after).count());
  analyzer->SetDivergenceObserver([this](const PairCtx& ctx) {
    if (!replaying_.load()) follow_up_->OnDivergence(ctx);  // a restart's replay: old news
  });
  if (!options_.baseline_log.empty()) {
    auto b = analyzer->AddBaselineLog(options_.baseline_log);
    if (!b.ok()) {
      *failed = CollectPart::kBaseline;
      return b.status();
    }
  }
  live_ = std::make_unique<LiveAnalyzer>(std::move(analyzer), options_.analyzer_tick_ms);
  settings_recorder_ = std::make_unique<SettingsRecorder>(
      options_.ingest.data_dir,
      DetectionSettings{options_.analysis.rules, options_.name_map_text, options_.version});
  Status s = collector_->AddSink(settings_recorder_.get());
  if (s.ok()) s = collector_->AddSink(live_.get());
  if (s.ok()) s = collector_->AddSink(view_model_.get());
  if (s.ok()) s = collector_->AddSink(metrics_feed_.get());
  if (!s.ok()) {
    *failed = CollectPart::kIngest;
    return s;
  }

  // The view feed for `lockstep top`: a snapshot reads the registry and the view model,
  // never the analyzer's lock.
  if (!options_.view_listen.empty()) {
    ViewPublisherOptions view_opt;
    view_opt.endpoint = options_.view_listen;
    auto vp = ViewPublisher::Create(view_opt, [this] {
      auto cc = collector_->counters();
      ViewExtras ex{cc.records, cc.rejected, live_->errors()};
      return view_model_->SnapshotJson(collector_->registry().Snapshot(), ex, clock_->NowUnixNs());
    });
    if (vp.ok()) {
      view_pub_ = std::move(*vp);
    } else if (options_.view_required) {
      *failed = CollectPart::kView;
      return vp.status();
    } else {
      spdlog::warn("{}; collecting without a view feed", vp.status().message());
    }
  }

  // /metrics and, on the same port, the live report (/ and /report?experiment=NAME:
  // docs/report.md).
  if (!options_.metrics_listen.empty()) {
    LiveReportSources report_src{report_recorder_.get(), live_.get(),
                                 "lockstep " + options_.version + " collect",
                                 "this collector's detection settings (" +
                                     options_.ingest.data_dir + "/<run>.settings.toml)"};
    auto m = metrics::StartCollectorMetrics(
        options_.metrics_listen,
        {collector_.get(), live_.get(), dispatcher_.get(), metrics_feed_.get(), retention_.get()},
        [report_src](std::string_view target, std::string* type, std::string* body) {
          return ServeLiveReport(report_src, target, type, body);
        },
        [this](std::string_view target, std::string* reply) { return Act(target, reply); });
    if (m.ok()) {
      metrics_server_ = std::move(*m);
      spdlog::info("Prometheus metrics at http://{}/metrics, the live report at http://{}/",
                   metrics_server_->address(), metrics_server_->address());
    } else if (options_.metrics_required) {
      *failed = CollectPart::kMetrics;
      return m.status();
    } else {
      // The default port taken (a second collector on this host): collect anyway.
      spdlog::warn("{}; collecting without /metrics", m.status().message());
    }
  }
  return Status::OK();
}

void CollectService::DeliverAlert(alerting::Alert a) {
  alerts_.fetch_add(1, std::memory_order_relaxed);
  if (replaying_.load(std::memory_order_relaxed)) {
    a.replayed = true;
    // The sinks' queues are bounded: a long history must not overflow them.
    if (replayed_alerts_.fetch_add(1, std::memory_order_relaxed) % 1024 == 1023)
      dispatcher_->Flush(std::chrono::seconds(2));
  }
  if (!a.replayed && follow_up_) follow_up_->OnAlert(a);  // --sample-quiet: the pair is loud
  if (retention_ && !a.runs.empty()) {
    // The incident's neighbourhood stays in full in every run of the experiment
    // (replayed alerts too: the same steps).
    const uint64_t m = options_.retention.incident_margin_steps;
    retention_->KeepSteps(a.experiment, a.step > m ? a.step - m : 0, a.step + m);
  }
  view_model_->OnAlert(a);
  metrics_feed_->OnAlert(a);
  report_recorder_->OnAlert(a);
  dispatcher_->Submit(std::move(a));
}

void CollectService::OnLogHealth(bool failing, const std::string& message) {
  if (!failing || !dispatcher_) return;  // recovery: the collector's info line is enough
  alerting::Alert a;
  a.rule = "collector_disk";
  a.severity = alerting::Severity::kCritical;
  a.metric = "log_write_failed";
  a.first_seen_unix_ns = clock_->NowUnixNs();
  a.id = a.DedupKey() + "@" + std::to_string(a.first_seen_unix_ns);
  a.message = message;
  DeliverAlert(std::move(a));
}

std::vector<PairProgress> CollectService::Pairs(const std::string& experiment) const {
  std::vector<PairProgress> out;
  MutexLock l(&progress_mu_);
  auto it = pair_progress_.find(experiment);
  if (it == pair_progress_.end()) return out;
  for (const auto& [pair, p] : it->second) out.push_back({pair.first, pair.second, p});
  return out;
}

void CollectService::OnRetentionProblem(const std::string& metric, const std::string& message) {
  if (!dispatcher_) return;
  alerting::Alert a;
  a.rule = "collector_disk";
  a.severity = alerting::Severity::kWarning;
  a.metric = metric;
  a.first_seen_unix_ns = clock_->NowUnixNs();
  a.id = a.DedupKey() + "@" + std::to_string(a.first_seen_unix_ns);
  a.message = message;
  DeliverAlert(std::move(a));
}

// Restart: the logs are the truth. Replaying them rebuilds roles, tensor directories,
// pairs, waiting steps and detector state, so alignment resumes where it stopped and
// once-only rules stay fired (docs/runlog.md "Restart").
void CollectService::Replay() {
  const int64_t t0 = clock_->NowMonotonicNs();
  ReplayFanOut fan({settings_recorder_.get(), live_.get(), view_model_.get(), metrics_feed_.get()},
                   &analyzer_clock_);
  replaying_ = true;
  auto st = ReplayLogs(collector_->options().data_dir, &fan, [this](int64_t t) {
    analyzer_clock_.SetReplayUnixNs(t);
    live_->Mutate([t](Analyzer& a) { a.Tick(t); });
  });
  replaying_ = false;
  analyzer_clock_.SetReplayUnixNs(0);
  const int64_t now = clock_->NowUnixNs();
  live_->Mutate([now](Analyzer& a) { a.Resume(now); });
  if (!st.ok()) {
    spdlog::error("replaying the run logs: {}; analysis starts from live messages only",
                  st.status().message());
    return;
  }
  replay_stats_ = *st;
  spdlog::info(
      "replayed {} messages of {} run logs through the analysis in {:.2f} s ({} alerts derived "
      "again; "
      "sinks skip those they handled before the restart){}",
      st->messages, st->runs,
      static_cast<double>(clock_->NowMonotonicNs() - t0) * 1e-9,
      replayed_alerts(),
      st->skipped ? fmt::format(", {} unreadable records skipped", st->skipped) : "");
}

Status CollectService::Start() {
  if (started_ || torn_down_) return Status::Internal("the collect service was started twice");
  started_ = true;
  if (collector_->counters().rebuilt_messages > 0) Replay();
  live_->Start();
  Status s = collector_->Start();
  if (!s.ok()) return s;
  std::string eps;
  for (const auto& ep : collector_->endpoints()) eps += (eps.empty() ? "" : ", ") + ep;
  if (view_pub_) view_pub_->Start();
  if (retention_) retention_->Start();
  spdlog::info("lockstep {} collecting on {} into {}; view feed on {}; control channel on {}", options_.version,
               eps, options_.ingest.data_dir, view_pub_ ? view_pub_->endpoint() : "(none)",
               collector_->control_endpoint().empty() ? "(none)" : collector_->control_endpoint());
  spdlog::info("{}", AccessSummary(*collector_));
  status_line_ = std::make_unique<StatusLine>(*collector_, clock_);
  return Status::OK();
}

Status CollectService::Run(const WaitFn& wait_for_stop) {
  constexpr int64_t kSecondNs = 1'000'000'000;
  const int64_t status_s = options_.status_interval_s;
  const int64_t interval_ns = (status_s > 0 ? status_s : 3600) * kSecondNs;
  int64_t next_status = clock_->NowMonotonicNs() + interval_ns;
  int64_t next_trim = clock_->NowMonotonicNs();
  while (true) {
    // At most a second, so a dead ingest thread is noticed promptly.
    const int64_t left = std::clamp<int64_t>(next_status - clock_->NowMonotonicNs(), 0, kSecondNs);
    if (wait_for_stop(std::chrono::nanoseconds(left))) return Status::OK();
    if (clock_->NowMonotonicNs() >= next_status) {
      if (status_s > 0 && status_line_) status_line_->Print();
      next_status += interval_ns;
    }
    Status h = collector_->health();
    if (!h.ok()) return h;
    // Hand freed heap back to the kernel every 10 s. A burst of messages (every
    // agent's step at once, or a moment without CPU) is allocated by ZeroMQ's I/O
    // thread and freed by ingest; glibc keeps the freed pages resident in that thread's
    // arena, so RSS would stay at the worst backlog ever seen and read like a leak
    // (docs/load.md). Once a second this cost ~1% of a core at the load bench's rate
    // (madvise, then faulting the pages back in); every 10 s about a tenth of that.
    if (clock_->NowMonotonicNs() >= next_trim) {
      malloc_trim(0);
      next_trim = clock_->NowMonotonicNs() + 10 * kSecondNs;
    }
  }
}

Status CollectService::Shutdown() { return Teardown(/*last_status_line=*/true); }

// The order is written down in the header; each step tolerates a part Build() never made.
Status CollectService::Teardown(bool last_status_line) {
  if (torn_down_) return shutdown_status_;
  torn_down_ = true;
  if (retention_) retention_->Shutdown();
  if (collector_) shutdown_status_ = collector_->Shutdown(std::chrono::seconds(5));
  if (view_pub_) view_pub_->Shutdown();
  if (metrics_server_) metrics_server_->Shutdown();
  if (live_) {
    live_->Shutdown();
    if (started_) live_->Mutate([](Analyzer& a) { a.Finish(); });  // compare what is complete
  }
  if (dispatcher_) dispatcher_->Shutdown(std::chrono::seconds(3));
  if (last_status_line && options_.status_interval_s > 0 && status_line_) status_line_->Print();
  return shutdown_status_;
}

std::string CollectService::view_endpoint() const { return view_pub_ ? view_pub_->endpoint() : ""; }

int CollectService::Act(std::string_view target, std::string* reply) {
  const size_t q = target.find('?');
  const std::string_view path = target.substr(0, q);
  const std::string_view query = q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
  if (path != "/zoom") {
    *reply = "not found: this collector takes POST /zoom?experiment=NAME&module=MODULE[&steps=N]";
    return 404;
  }
  const std::string experiment = QueryValue(query, "experiment"), module = QueryValue(query, "module");
  const std::string steps_text = QueryValue(query, "steps");
  uint32_t steps = 2;
  if (!steps_text.empty()) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(steps_text.c_str(), &end, 10);
    if (*end != '\0' || v < 1 || v > 10000) {
      *reply = "steps=" + steps_text + " is not valid: give an integer from 1 to 10000";
      return 400;
    }
    steps = static_cast<uint32_t>(v);
  }
  if (experiment.empty() || module.empty()) {
    *reply = "POST /zoom needs experiment= and module= (a module's name in the rows, e.g. blocks.1.attn)";
    return 400;
  }
  return follow_up_->ZoomByHand(experiment, module, steps, reply);
}

std::string CollectService::metrics_address() const {
  return metrics_server_ ? metrics_server_->address() : "";
}

}  // namespace lockstep::collector
