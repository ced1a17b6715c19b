// `lockstep collect`: runs the Collector (ingest, run logs, registry) until SIGINT or
// SIGTERM, printing a status line every --status-interval-s.
//
// Threads: main() blocks SIGINT/SIGTERM before anything else starts (so every thread
// inherits the mask) and then waits for them with sigtimedwait(), which doubles as the
// status-line timer. No signal handler runs arbitrary code.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/align_flags.h"
#include "cli/alerting_flags.h"
#include "cli/commands.h"
#include "lockstep/common/flags.h"
#include "detect/analyzer.h"
#include "detect/detection_settings.h"
#include "detect/live_analyzer.h"
#include "runlog/log_replay.h"
#include "lockstep/alerting/dispatcher.h"
#include "ingest/curve_keys.h"
#include "lockstep/collector/collector.h"
#include "metrics/collector_metrics.h"
#include "metrics/http_server.h"
#include "metrics/metrics_feed.h"
#include "report/live_report.h"
#include "report/report_recorder.h"
#include "lockstep/common/json_out.h"
#include "runlog/log_format.h"
#include "view/view_model.h"
#include "view/view_publisher.h"

namespace lockstep::cli {
namespace {

using collector::Collector;
using collector::CollectorOptions;

int Usage(const std::string& msg) {
  std::fprintf(stderr, "lockstep collect: %s\n", OneLine(msg).c_str());
  return kExitUsage;
}

// Written once listening: {"listen":[...],"pid":N,"data_dir":"...","view":"...",
// "metrics":"HOST:PORT" or "" when not serving}. Tests and scripts
// wait for it instead of sleeping. Written to a temp name and renamed, so a reader
// never sees half of it.
Status WriteReadyFile(const std::string& path, const Collector& c, const std::string& view,
                      const std::string& metrics) {
  std::string json;
  collector::JsonOut j(&json);
  j.BeginObject().Key("listen").BeginArray();
  for (const auto& ep : c.endpoints()) j.Str(ep);
  j.EndArray().FieldI("pid", getpid()).Field("data_dir", c.options().data_dir).Field("view", view);
  j.Field("metrics", metrics).EndObject();
  json.push_back('\n');
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f || !(f << json) || !f.flush())
      return Status::IOError("cannot write the ready file '" + path + "': " + std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::IOError("cannot write the ready file '" + path + "': " + ec.message());
  return Status::OK();
}

// One line at start: who can reach the ingest socket (docs/security.md).
std::string AccessSummary(const Collector& c) {
  bool loopback = std::all_of(c.endpoints().begin(), c.endpoints().end(), collector::IsLoopbackEndpoint);
  std::string reach = loopback ? "loopback only: agents on other hosts cannot connect"
                               : "reachable from other hosts";
  std::string key = c.curve_public_key();
  if (key.empty()) return "access: " + reach + "; no CURVE (plain ZeroMQ, unauthenticated)";
  std::string who = c.options().curve.authorized_keys.empty()
                        ? "any agent holding the collector's public key"
                        : std::to_string(c.options().curve.authorized_keys.size()) + " authorized agent key(s)";
  return "access: " + reach + "; CURVE on (collector public key " + key + "), admitting " + who;
}

class StatusLine {
 public:
  explicit StatusLine(const Collector& c) : c_(c), last_(Clock::now()), prev_(c.counters()) {}
  void Print() {
    auto now = Clock::now();
    auto cur = c_.counters();
    double dt = std::chrono::duration<double>(now - last_).count();
    if (dt <= 0) dt = 1e-9;
    auto t = c_.registry().Totals();
    spdlog::info(
        "status: {} runs ({} ranks), {:.0f} records/s, {:.0f} messages/s, {} records in all; "
        "agent drops {}, gaps {}, duplicates {}, bad messages {}, log errors {}{}",
        t.runs, t.ranks, (cur.records - prev_.records) / dt, (cur.accepted - prev_.accepted) / dt,
        t.records, t.agent_records_dropped, t.gaps, t.duplicates, cur.rejected, cur.log_errors,
        c_.curve_public_key().empty() ? "" : fmt::format(", refused connections {}", cur.auth.refused));
    prev_ = cur;
    last_ = now;
  }

 private:
  using Clock = std::chrono::steady_clock;
  const Collector& c_;
  Clock::time_point last_;
  collector::CollectorCounters prev_;
};

int64_t WallNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The sinks of a restart's replay: what the live collector feeds, in the same order,
// with the analyzer's clock set to each message's receive time.
class ReplayFanOut : public collector::MessageSink {
 public:
  ReplayFanOut(std::vector<collector::MessageSink*> sinks, std::atomic<int64_t>* clock)
      : sinks_(std::move(sinks)), clock_(clock) {}
  void OnMessage(const wire::Envelope& env, int64_t recv_ns) override {
    clock_->store(recv_ns, std::memory_order_relaxed);
    for (auto* s : sinks_) s->OnMessage(env, recv_ns);
  }

 private:
  std::vector<collector::MessageSink*> sinks_;
  std::atomic<int64_t>* clock_;
};

}  // namespace

int CollectCommand(int argc, const char* const* argv) {
  std::vector<std::string> listen{"tcp://127.0.0.1:6200"};
  std::string data_dir = "./lockstep-data", ready_file, log_level = "info";
  int64_t fsync_ms = 1000, status_s = 10, max_bytes = static_cast<int64_t>(kMaxMessageBytes);
  FlagSet flags("collect", "collect [FLAGS]",
                "Runs the collector: agents push statistics to --listen; every verified message "
                "is appended to <data-dir>/<run>.lslog. Stops cleanly on Ctrl-C / SIGTERM.");
  flags.StringList("listen", &listen,
                   "ZeroMQ endpoint to bind (default tcp://127.0.0.1:6200; "
                   "tcp://127.0.0.1:* picks a free port)",
                   "ENDPOINT");
  flags.String("data-dir", &data_dir, "directory of the run logs (created if missing)", "DIR");
  flags.String("ready-file", &ready_file,
               "once listening, write {\"listen\":[bound endpoints],\"pid\":N} here", "FILE");
  flags.Int("fsync-interval-ms", &fsync_ms, "fsync the run logs this often (0 = after every burst)",
            "MS");
  flags.Int("status-interval-s", &status_s, "log a status line this often (0 = never)", "S");
  flags.Int("max-message-bytes", &max_bytes, "refuse messages larger than this", "BYTES");
  flags.String("log-level", &log_level, "trace, debug, info, warn, error or off", "LEVEL");
  std::string curve_key, curve_authorized;
  flags.String("curve-key", &curve_key,
               "the collector's key pair from 'lockstep keygen': agents must use CURVE with its public "
               "key (docs/security.md)", "FILE");
  flags.String("curve-authorized-keys", &curve_authorized,
               "with --curve-key: admit only agents whose public key is listed here, one per line", "FILE");
  std::string view_listen = "tcp://127.0.0.1:6201";
  flags.String("view-listen", &view_listen,
               "ZeroMQ endpoint of the view feed that 'lockstep top' connects to (docs/top.md); "
               "tcp://127.0.0.1:* picks a free port, 'off' serves none", "ENDPOINT");
  std::string metrics_listen = "127.0.0.1:9464";
  flags.String("metrics-listen", &metrics_listen,
               "HOST:PORT serving Prometheus /metrics over HTTP (docs/metrics.md); port 0 picks a free port, "
               "'off' serves none", "ADDR");
  // Alignment and detection (docs/rules.md) and where alerts go (docs/alerting.md).
  std::string baseline_log, name_map;
  int64_t max_buffered = 0;  // AddAlignFlags sets the default
  collector::AnalyzerOptions an_opt;
  flags.String("baseline", &baseline_log, "a recorded run log to use as the baseline of live candidates", "FILE");
  AddAlignFlags(&flags, &name_map, &max_buffered);
  collector::AddRuleFlags(&flags, &an_opt.rules);
  AlertingFlags alert_flags;
  RegisterAlertingFlags(&flags, &alert_flags);
  flags.Range("fsync-interval-ms", 0, 86400e3);
  flags.Range("status-interval-s", 0, 366 * 86400.0);

  Status s = flags.Parse(argc, argv);
  if (!s.ok()) return Usage(s.message());
  if (flags.help_requested()) {
    std::printf("%s\n", flags.Help().c_str());
    return kExitOk;
  }
  if (!flags.positional().empty())
    return Usage("unexpected argument '" + flags.positional().front() +
                 "' (collect takes only flags; see 'lockstep collect --help')");
  auto level = spdlog::level::from_str(log_level);
  if (level == spdlog::level::off && log_level != "off")
    return Usage("--log-level expects trace, debug, info, warn, error or off, got '" + log_level + "'");
  if (fsync_ms < 0) return Usage("--fsync-interval-ms must be 0 or more");
  if (status_s < 0) return Usage("--status-interval-s must be 0 or more");
  if (max_bytes < 1 || max_bytes > static_cast<int64_t>(collector::runlog::kMaxRecordBytes))
    return Usage("--max-message-bytes must be between 1 and " +
                 std::to_string(collector::runlog::kMaxRecordBytes));

  auto logger = spdlog::stderr_color_mt("collect");
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(level);

  // Recorded next to each run's log, so `lockstep compare` gives the live answer.
  collector::DetectionSettings settings{an_opt.rules, "", LOCKSTEP_VERSION};
  if (!name_map.empty()) {
    auto canon = collector::NameCanonicalizer::FromFile(name_map);
    if (!canon.ok()) return Usage(canon.status().message());
    an_opt.canon = std::move(*canon);
    std::ifstream nm(name_map);
    settings.name_map.assign(std::istreambuf_iterator<char>(nm), std::istreambuf_iterator<char>());
  }
  an_opt.max_buffered_steps = static_cast<size_t>(max_buffered);
  an_opt.data_dir = data_dir;  // a run far ahead of its partner is read back from its log
  auto alert_opts = BuildAlertingOptions(alert_flags, data_dir + "/alert-spool");
  if (!alert_opts.ok()) return Usage(alert_opts.status().message());

  // Before any thread exists, so ZeroMQ's and ours inherit the mask and the signals
  // wait for sigtimedwait() below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  CollectorOptions opts;
  if (!curve_authorized.empty() && curve_key.empty())
    return Usage("--curve-authorized-keys needs --curve-key (the collector's own key pair)");
  if (!curve_key.empty()) {
    auto pair = collector::ReadCurveKeyFile(curve_key, /*need_secret=*/true);
    if (!pair.ok()) return Usage(pair.status().message());
    opts.curve.secret_key = pair->secret_key;
  }
  if (!curve_authorized.empty()) {
    auto keys = collector::ReadAuthorizedKeys(curve_authorized);
    if (!keys.ok()) return Usage(keys.status().message());
    opts.curve.authorized_keys = std::move(*keys);
  }
  opts.listen = listen;
  opts.data_dir = data_dir;
  opts.fsync_interval_ms = fsync_ms;
  opts.max_message_bytes = static_cast<size_t>(max_bytes);
  // Set before the ingest thread starts (its start orders the write before any call).
  std::function<void(alerting::Alert)> collector_alert;
  opts.on_log_health = [&collector_alert, data_dir](bool failing, const std::string& message) {
    if (!failing || !collector_alert) return;  // recovery: the info line is enough
    alerting::Alert a;
    a.rule = "collector_disk";
    a.severity = alerting::Severity::kCritical;
    a.metric = "log_write_failed";
    a.first_seen_unix_ns = WallNowNs();
    a.id = a.DedupKey() + "@" + std::to_string(a.first_seen_unix_ns);
    a.message = message;
    collector_alert(std::move(a));
  };
  auto c = Collector::Create(std::move(opts));
  if (!c.ok()) {
    std::fprintf(stderr, "lockstep collect: %s\n", OneLine(c.status().message()).c_str());
    bool usage = c.status().IsInvalidArgument() || c.status().code() == Status::Code::kIOError;
    return usage ? kExitUsage : kExitRuntime;
  }
  Collector& col = **c;
  auto dispatcher = alerting::Dispatcher::Create(*alert_opts);
  if (!dispatcher.ok()) return Usage(dispatcher.status().message());
  alerting::Dispatcher* disp = dispatcher->get();
  collector::ViewModel view_model;  // outlives the analyzer, which calls into it
  collector::metrics::MetricsFeed metrics_feed;  // step times and alert counts for /metrics
  collector::ReportRecorder report_recorder;  // the live /report page's heatmap, curves and alerts
  // A restart replays the logs through the analysis first (below): alerts derived then
  // are marked `replayed` (each sink skips those its journal shows it handled before the
  // restart) and stamped with the replayed message's receive time.
  std::atomic<bool> replaying{false};
  std::atomic<int64_t> replay_now{0};
  uint64_t replayed_alerts = 0;
  auto analyzer = std::make_unique<collector::Analyzer>(
      std::move(an_opt),
      [disp, &view_model, &metrics_feed, &report_recorder, &replaying, &replayed_alerts](alerting::Alert a) {
        if (replaying.load(std::memory_order_relaxed)) {
          a.replayed = true;
          // The sinks' queues are bounded: a long history must not overflow them.
          if (++replayed_alerts % 1024 == 0) disp->Flush(std::chrono::seconds(2));
        }
        view_model.OnAlert(a);
        metrics_feed.OnAlert(a);
        report_recorder.OnAlert(a);
        disp->Submit(std::move(a));
      },
      [&replay_now] {
        int64_t t = replay_now.load(std::memory_order_relaxed);
        return t != 0 ? t : WallNowNs();
      });
  analyzer->SetPairStepObserver(
      [&view_model, &report_recorder](const collector::PairCtx& ctx, const collector::PairStepView& v) {
        view_model.OnPairStep(ctx, v);
        report_recorder.OnPairStep(ctx, v);
      });
  if (!baseline_log.empty()) {
    auto b = analyzer->AddBaselineLog(baseline_log);
    if (!b.ok()) {  // a run log that cannot be read: the input-data code
      std::fprintf(stderr, "lockstep collect: %s\n", OneLine(b.status().message()).c_str());
      return kExitBadInput;
    }
  }
  collector::LiveAnalyzer live(std::move(analyzer));
  collector::SettingsRecorder settings_recorder(data_dir, std::move(settings));
  s = col.AddSink(&settings_recorder);
  if (s.ok()) s = col.AddSink(&live);
  if (s.ok()) s = col.AddSink(&view_model);
  if (s.ok()) s = col.AddSink(&metrics_feed);
  if (!s.ok()) return Usage(s.message());
  // The view feed for `lockstep top`: its own thread; a snapshot reads the registry
  // and the view model, never the analyzer's lock.
  // Like /metrics: a default endpoint that is taken (a second collector on this host)
  // is a warning, an explicit one an error.
  std::unique_ptr<collector::ViewPublisher> view_pub;
  if (!view_listen.empty() && view_listen != "off") {
    collector::ViewPublisherOptions view_opt;
    view_opt.endpoint = view_listen;
    auto vp = collector::ViewPublisher::Create(view_opt, [&col, &view_model, &live] {
      auto cc = col.counters();
      collector::ViewExtras ex{cc.records, cc.rejected, live.errors()};
      return view_model.SnapshotJson(col.registry().Snapshot(), ex,
                                     std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::system_clock::now().time_since_epoch())
                                         .count());
    });
    if (vp.ok()) {
      view_pub = std::move(*vp);
    } else if (flags.WasSet("view-listen")) {
      return Usage(vp.status().message());
    } else {
      spdlog::warn("{}; collecting without a view feed", vp.status().message());
    }
  }
  const std::string view_ep = view_pub ? view_pub->endpoint() : "";
  // /metrics: its own thread; reads counters and snapshots (docs/metrics.md).
  std::unique_ptr<collector::metrics::MetricsServer> metrics_server;
  if (!metrics_listen.empty() && metrics_listen != "off") {
    // The live report (/ and /report?experiment=NAME) on the same port: docs/report.md.
    collector::LiveReportSources report_src{&report_recorder, &live, std::string("lockstep ") + LOCKSTEP_VERSION + " collect",
                                            "this collector's detection settings (" + data_dir + "/<run>.settings.toml)"};
    auto m = collector::metrics::StartCollectorMetrics(
        metrics_listen, {&col, &live, disp, &metrics_feed},
        [report_src](std::string_view target, std::string* type, std::string* body) {
          return collector::ServeLiveReport(report_src, target, type, body);
        });
    if (m.ok()) {
      metrics_server = std::move(*m);
      spdlog::info("Prometheus metrics at http://{}/metrics, the live report at http://{}/",
                   metrics_server->address(), metrics_server->address());
    } else if (flags.WasSet("metrics-listen")) {
      return Usage(m.status().message());
    } else {
      // The default port taken (a second collector on this host): collect anyway.
      spdlog::warn("{}; collecting without /metrics", m.status().message());
    }
  }
  collector_alert = [disp, &view_model, &metrics_feed](alerting::Alert a) {
    view_model.OnAlert(a);
    metrics_feed.OnAlert(a);
    disp->Submit(std::move(a));
  };
  // Restart: the logs are the truth. Replaying them rebuilds roles, tensor directories,
  // pairs, waiting steps and detector state, so alignment resumes where it stopped and
  // once-only rules stay fired (docs/runlog.md "Restart"). Agents may already connect:
  // their messages wait in the bound socket.
  if (col.counters().rebuilt_messages > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    ReplayFanOut fan({&settings_recorder, &live, &view_model, &metrics_feed}, &replay_now);
    replaying = true;
    auto st = collector::ReplayLogs(col.options().data_dir, &fan, [&live, &replay_now](int64_t t) {
      replay_now.store(t, std::memory_order_relaxed);
      live.Mutate([t](collector::Analyzer& a) { a.Tick(t); });
    });
    replaying = false;
    replay_now.store(0, std::memory_order_relaxed);
    const int64_t now = WallNowNs();
    live.Mutate([now](collector::Analyzer& a) { a.Resume(now); });
    if (!st.ok()) {
      spdlog::error("replaying the run logs: {}; analysis starts from live messages only", st.status().message());
    } else {
      spdlog::info(
          "replayed {} messages of {} run logs through the analysis in {:.2f} s ({} alerts derived again; "
          "sinks skip those they handled before the restart){}",
          st->messages, st->runs,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), replayed_alerts,
          st->skipped ? fmt::format(", {} unreadable records skipped", st->skipped) : "");
    }
  }
  live.Start();
  s = col.Start();
  if (!s.ok()) {
    std::fprintf(stderr, "lockstep collect: %s\n", s.message().c_str());
    return kExitRuntime;
  }
  std::string eps;
  for (const auto& ep : col.endpoints()) eps += (eps.empty() ? "" : ", ") + ep;
  if (view_pub) view_pub->Start();
  spdlog::info("lockstep {} collecting on {} into {}; view feed on {}", LOCKSTEP_VERSION, eps, data_dir,
               view_pub ? view_ep : "(none)");
  spdlog::info("{}", AccessSummary(col));
  if (!ready_file.empty()) {
    s = WriteReadyFile(ready_file, col, view_ep,
                       metrics_server ? metrics_server->address() : "");
    if (!s.ok()) {
      std::fprintf(stderr, "lockstep collect: %s\n", s.message().c_str());
      (void)col.Shutdown(std::chrono::seconds(5));
      return kExitUsage;
    }
  }

  StatusLine status(col);
  const auto interval = std::chrono::seconds(status_s > 0 ? status_s : 3600);
  auto next_status = std::chrono::steady_clock::now() + interval;
  auto next_trim = std::chrono::steady_clock::now();
  int sig = 0;
  while (true) {
    auto left = next_status - std::chrono::steady_clock::now();
    // At most a second, so a dead ingest thread is noticed promptly.
    left = std::clamp<std::chrono::steady_clock::duration>(left, std::chrono::nanoseconds(0),
                                                           std::chrono::seconds(1));
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    sig = sigtimedwait(&stop_signals, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM) break;
    if (sig < 0 && errno != EAGAIN && errno != EINTR) break;
    if (std::chrono::steady_clock::now() >= next_status) {
      if (status_s > 0) status.Print();
      next_status += interval;
    }
    Status h = col.health();
    if (!h.ok()) {
      std::fprintf(stderr, "lockstep collect: %s\n", h.message().c_str());
      return kExitRuntime;
    }
    // Hand freed heap back to the kernel every 10 s. A burst of messages (every
    // agent's step at once, or a moment without CPU) is allocated by ZeroMQ's I/O
    // thread and freed by ingest; glibc keeps the freed pages resident in that thread's
    // arena, so RSS would stay at the worst backlog ever seen and read like a leak
    // (docs/load.md). Once a second this cost ~1% of a core at the load bench's rate
    // (madvise, then faulting the pages back in); every 10 s about a tenth of that.
    if (std::chrono::steady_clock::now() >= next_trim) {
      malloc_trim(0);
      next_trim = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
  }
  spdlog::info("{} received: flushing the run logs and stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
  s = col.Shutdown(std::chrono::seconds(5));
  if (view_pub) view_pub->Shutdown();
  if (metrics_server) metrics_server->Shutdown();
  live.Shutdown();
  live.Mutate([](collector::Analyzer& a) { a.Finish(); });  // compare what is complete
  (*dispatcher)->Shutdown(std::chrono::seconds(3));
  if (status_s > 0) status.Print();
  if (!ready_file.empty()) std::remove(ready_file.c_str());
  if (!s.ok()) {
    spdlog::error("{}", s.message());
    return kExitRuntime;
  }
  return kExitOk;
}

}  // namespace lockstep::cli
