// `lockstep collect`: parses the flags into a CollectOptions, runs a CollectService
// (service/collect_service.h: the daemon's parts, their wiring and their teardown order)
// until SIGINT or SIGTERM, and maps what fails to an exit code.
//
// Threads: this command blocks SIGINT/SIGTERM before anything else starts (so every
// thread inherits the mask) and then waits for them with sigtimedwait() inside
// CollectService::Run, which doubles as the status-line timer. No signal handler runs
// arbitrary code.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/align_flags.h"
#include "cli/alerting_flags.h"
#include "cli/commands.h"
#include "cli/rule_flags.h"
#include "lockstep/common/flags.h"
#include "detect/analyzer.h"
#include "ingest/curve_keys.h"
#include "lockstep/collector/collector.h"
#include "lockstep/common/json_out.h"
#include "runlog/log_format.h"
#include "service/collect_service.h"

namespace lockstep::cli {
namespace {

using collector::CollectPart;
using collector::CollectService;

int Usage(const std::string& msg) {
  std::fprintf(stderr, "lockstep collect: %s\n", OneLine(msg).c_str());
  return kExitUsage;
}

// Written once listening: {"listen":[...],"pid":N,"data_dir":"...","view":"...",
// "metrics":"HOST:PORT" or "" when not serving, "control":"..." or ""}. Tests and scripts
// wait for it instead of sleeping. Written to a temp name and renamed, so a reader
// never sees half of it.
Status WriteReadyFile(const std::string& path, const CollectService& svc) {
  std::string json;
  collector::JsonOut j(&json);
  j.BeginObject().Key("listen").BeginArray();
  for (const auto& ep : svc.collector().endpoints()) j.Str(ep);
  j.EndArray().FieldI("pid", getpid()).Field("data_dir", svc.options().ingest.data_dir);
  j.Field("view", svc.view_endpoint()).Field("metrics", svc.metrics_address());
  j.Field("control", svc.collector().control_endpoint()).EndObject();
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

// The exit code of a part that could not be built (cli/exit_codes.h).
int CreateFailure(CollectPart part, const Status& s) {
  std::fprintf(stderr, "lockstep collect: %s\n", OneLine(s.message()).c_str());
  switch (part) {
    case CollectPart::kBaseline:
      return kExitBadInput;  // a run log that cannot be read: the input-data code
    case CollectPart::kIngest:
      return s.IsInvalidArgument() || s.code() == Status::Code::kIOError ? kExitUsage : kExitRuntime;
    default:
      return kExitUsage;
  }
}

// "20G", "512M", "64K", "1T" or plain bytes (powers of 1024); false when it is none.
bool ParseSize(const std::string& text, uint64_t* out) {
  if (text.empty() || text.size() > 24) return false;
  size_t i = 0;
  uint64_t v = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    if (v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + static_cast<uint64_t>(text[i] - '0');
  }
  if (i == 0) return false;
  int shift = 0;
  if (i < text.size()) {
    switch (text[i] == 'k' ? 'K' : text[i]) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: return false;
    }
    ++i;
    if (i < text.size() && (text[i] == 'B' || text[i] == 'b')) ++i;  // 20GB
    if (i != text.size()) return false;
  }
  if (shift > 0 && v > (UINT64_MAX >> shift)) return false;
  *out = v << shift;
  return true;
}

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
  std::string log_compression = "zstd";
  flags.String("log-compression", &log_compression,
               "zstd: new run logs are written in compressed blocks (about 3x smaller); none: "
               "plain records, as lockstep wrote before compression (an existing log keeps its format)",
               "zstd|none");
  std::string segment_size = "64M", max_disk = "0";
  int64_t retain_steps = 2000, thin_every = 100;
  flags.String("segment-size", &segment_size,
               "close a run's log into a numbered segment (<run>.lslog.000001, ...) once it holds this much, "
               "so that retention can thin the closed ones (docs/runlog.md \"Segments and retention\"); "
               "0 = one file per run and no retention", "SIZE");
  flags.Int("retain-steps", &retain_steps,
            "retention: every step of a run's last N steps stays in full; older closed segments are thinned",
            "N");
  flags.Int("thin-every", &thin_every,
            "retention: outside the window and the incidents' neighbourhoods, the tensor statistics of every "
            "K-th step are kept and the other steps keep their scalars (loss, lr, grad norm) only; 1 = thin nothing",
            "K");
  flags.String("max-disk", &max_disk,
               "retention: when the run logs use more than this (e.g. 20G), thin closed segments oldest first "
               "whatever the window; still more is a collector_disk alert, never a stop; 0 = no limit", "SIZE");
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
  std::string control_listen = "auto";
  flags.String("control-listen", &control_listen,
               "ZeroMQ endpoint where agents take the collector's requests (zoom, capture, sample; docs/design.md "
               "\"The control channel\"); 'auto' is the --listen port + 2 (6202), 'off' serves none", "ENDPOINT");
  int64_t zoom_steps = 2;
  flags.Int("zoom-steps", &zoom_steps,
            "when the error is born in a module's own code, ask both runs to record every call inside it "
            "for this many steps (docs/rules.md \"Zoomed: the call\"); 0 = never", "N");
  int64_t sample_quiet = 0;
  flags.Int("sample-quiet", &sample_quiet,
            "while a pair's runs agree, ask both to record tensors every K-th step, and every step from the "
            "moment a drift, trend or incident opens until it resolves (docs/rules.md \"Sampling that follows "
            "the runs' state\"); 0 = never change how the runs sample", "K");
  std::string capture = "on";
  flags.String("capture", &capture,
               "'on': when the first divergence names an op, ask both runs to save its inputs and output at "
               "the same step, for 'python -m lockstep replay' (docs/python.md \"Capture and replay\"); "
               "'off': never", "on|off");
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
  AddRuleFlags(&flags, &an_opt.rules);
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

  collector::CollectOptions opts;
  opts.version = LOCKSTEP_VERSION;
  if (!name_map.empty()) {
    auto canon = collector::NameCanonicalizer::FromFile(name_map);
    if (!canon.ok()) return Usage(canon.status().message());
    an_opt.canon = std::move(*canon);
    std::ifstream nm(name_map);  // recorded next to each run's log (settings.toml)
    opts.name_map_text.assign(std::istreambuf_iterator<char>(nm), std::istreambuf_iterator<char>());
  }
  an_opt.max_buffered_steps = static_cast<size_t>(max_buffered);
  auto alert_opts = BuildAlertingOptions(alert_flags, data_dir + "/alert-spool");
  if (!alert_opts.ok()) return Usage(alert_opts.status().message());

  // Before any thread exists, so ZeroMQ's and ours inherit the mask and the signals
  // wait for sigtimedwait() below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (!curve_authorized.empty() && curve_key.empty())
    return Usage("--curve-authorized-keys needs --curve-key (the collector's own key pair)");
  if (!curve_key.empty()) {
    auto pair = collector::ReadCurveKeyFile(curve_key, /*need_secret=*/true);
    if (!pair.ok()) return Usage(pair.status().message());
    opts.ingest.curve.secret_key = pair->secret_key;
  }
  if (!curve_authorized.empty()) {
    auto keys = collector::ReadAuthorizedKeys(curve_authorized);
    if (!keys.ok()) return Usage(keys.status().message());
    opts.ingest.curve.authorized_keys = std::move(*keys);
  }
  opts.ingest.listen = listen;
  opts.ingest.control_listen = control_listen;
  if (zoom_steps < 0 || zoom_steps > 10000) return Usage("--zoom-steps must be between 0 and 10000");
  opts.zoom_steps = static_cast<uint32_t>(zoom_steps);
  if (sample_quiet == 1 || sample_quiet < 0 || sample_quiet > 1000000)
    return Usage("--sample-quiet must be 0 (off) or a number of steps from 2 to 1000000");
  opts.sample_quiet = static_cast<uint32_t>(sample_quiet);
  if (capture != "on" && capture != "off") return Usage("--capture must be on or off, not '" + capture + "'");
  opts.capture_birth = capture == "on";
  opts.ingest.data_dir = data_dir;
  if (log_compression != "zstd" && log_compression != "none")
    return Usage("--log-compression must be zstd or none, not '" + log_compression + "'");
  opts.ingest.compress_logs = log_compression == "zstd";
  uint64_t segment_bytes = 0, max_disk_bytes = 0;
  if (!ParseSize(segment_size, &segment_bytes) || (segment_bytes != 0 && segment_bytes < (64u << 10)))
    return Usage("--segment-size must be 0 (off) or a size of at least 64K, like 64M or 1G, not '" + segment_size + "'");
  if (!ParseSize(max_disk, &max_disk_bytes))
    return Usage("--max-disk must be 0 (no limit) or a size like 20G, 500M or 1T, not '" + max_disk + "'");
  if (retain_steps < 1 || retain_steps > 1'000'000'000)
    return Usage("--retain-steps must be a number of steps from 1 to 1000000000");
  if (thin_every < 1 || thin_every > 1'000'000'000)
    return Usage("--thin-every must be a number of steps from 1 (thin nothing) to 1000000000");
  if (max_disk_bytes > 0 && segment_bytes == 0)
    return Usage("--max-disk needs segments: --segment-size 0 turns retention off");
  opts.ingest.segment_bytes = thin_every > 1 || max_disk_bytes > 0 ? segment_bytes : 0;
  opts.retention.retain_steps = static_cast<uint64_t>(retain_steps);
  opts.retention.thin_every = static_cast<uint64_t>(thin_every);
  opts.retention.max_disk_bytes = max_disk_bytes;
  opts.ingest.fsync_interval_ms = fsync_ms;
  opts.ingest.max_message_bytes = static_cast<size_t>(max_bytes);
  opts.analysis = std::move(an_opt);
  opts.baseline_log = baseline_log;
  opts.alerting = std::move(*alert_opts);
  // A default endpoint that is taken (a second collector on this host) is a warning,
  // an explicit one an error.
  opts.view_listen = view_listen == "off" ? "" : view_listen;
  opts.view_required = flags.WasSet("view-listen");
  opts.metrics_listen = metrics_listen == "off" ? "" : metrics_listen;
  opts.metrics_required = flags.WasSet("metrics-listen");
  opts.status_interval_s = status_s;

  CollectPart failed = CollectPart::kNone;
  auto svc = CollectService::Create(std::move(opts), &failed);
  if (!svc.ok()) return CreateFailure(failed, svc.status());
  CollectService& service = **svc;
  s = service.Start();
  if (!s.ok()) {
    std::fprintf(stderr, "lockstep collect: %s\n", s.message().c_str());
    return kExitRuntime;
  }
  if (!ready_file.empty()) {
    s = WriteReadyFile(ready_file, service);
    if (!s.ok()) {
      std::fprintf(stderr, "lockstep collect: %s\n", s.message().c_str());
      return kExitUsage;  // the service's destructor stops it
    }
  }

  int sig = 0;
  s = service.Run([&](std::chrono::nanoseconds left) {
    timespec ts{static_cast<time_t>(left.count() / 1000000000), static_cast<long>(left.count() % 1000000000)};
    sig = sigtimedwait(&stop_signals, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM) return true;
    return sig < 0 && errno != EAGAIN && errno != EINTR;
  });
  if (!s.ok()) {  // the ingest thread died
    std::fprintf(stderr, "lockstep collect: %s\n", s.message().c_str());
    return kExitRuntime;
  }
  spdlog::info("{} received: flushing the run logs and stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
  s = service.Shutdown();
  if (!ready_file.empty()) std::remove(ready_file.c_str());
  if (!s.ok()) {
    spdlog::error("{}", s.message());
    return kExitRuntime;
  }
  return kExitOk;
}

}  // namespace lockstep::cli
