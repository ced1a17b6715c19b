// CollectOptions: everything a CollectService (the `lockstep collect` daemon) is built
// from, as plain values. Flags are parsed, files read and values checked by the caller
// (cli/collect_cmd.cc); nothing here parses or reads anything.
#ifndef LOCKSTEP_COLLECTOR_SERVICE_COLLECT_OPTIONS_H_
#define LOCKSTEP_COLLECTOR_SERVICE_COLLECT_OPTIONS_H_

#include <cstdint>
#include <string>

#include "detect/analyzer.h"
#include "lockstep/alerting/options.h"
#include "lockstep/collector/collector.h"
#include "lockstep/common/clock.h"
#include "runlog/retention.h"

namespace lockstep::collector {

struct CollectOptions {
  // Ingest: endpoints, data dir, fsync period, message size cap, CURVE. Leave
  // `ingest.on_log_health` empty: the service sets it (a failing disk becomes a
  // "collector_disk" alert through the one alert fan-out).
  CollectorOptions ingest;

  // Alignment and detection. `analysis.data_dir` is set to `ingest.data_dir` (a run far
  // ahead of its partner is read back from its log).
  AnalyzerOptions analysis;
  // The name-map file's text as given (recorded in each <run>.settings.toml, so
  // `lockstep compare` gives the live answer); "" when there is none.
  std::string name_map_text;
  // A recorded run log used as the baseline of live candidates; "" = none.
  std::string baseline_log;
  int64_t analyzer_tick_ms = 10;  // LiveAnalyzer's timer (idle step close, stall)

  // Where alerts go (docs/alerting.md): webhooks, Alertmanager, the jsonl file, the log.
  alerting::AlertingOptions alerting;

  // The view feed `lockstep top` subscribes to; "" serves none. When it cannot be bound
  // and `view_required` (the user named the endpoint) Create fails; otherwise (the
  // default endpoint taken by a second collector on this host) it warns and goes on.
  std::string view_listen = "tcp://127.0.0.1:6201";
  bool view_required = false;
  // HOST:PORT of /metrics and the live report (port 0 picks one); "" serves none.
  // Same rule as the view feed for `metrics_required`.
  std::string metrics_listen = "127.0.0.1:9464";
  bool metrics_required = false;

  // Steps both runs record zoomed (every call inside a container born in its own code)
  // when a first divergence asks for it; 0 = never ask.
  uint32_t zoom_steps = 2;
  // When the first divergence names an op, both runs capture it at the same upcoming
  // step (Monitor.capture) and a "capture" info alert lists the files.
  bool capture_birth = true;
  // While a pair's runs agree, both record tensors every `sample_quiet` steps; every
  // step while one of its incidents is open (service/quiet_sampling.h). 0 = never ask.
  uint32_t sample_quiet = 0;

  // Retention of long runs' logs (runlog/retention.h, docs/runlog.md "Segments and
  // retention"): on when `ingest.segment_bytes` > 0. `retention.data_dir` and
  // `retention.on_alert` are set by the service.
  RetentionOptions retention;

  int64_t status_interval_s = 10;  // a status line this often while Run()s; 0 = never
  std::string version = "dev";     // shown in log lines, settings files and the report

  // Where the service reads time (alert and view timestamps, the analyzer's ticks, status
  // line rates); not owned, outlives the service; null = the real clock (clock.h).
  const Clock* clock = nullptr;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_SERVICE_COLLECT_OPTIONS_H_
