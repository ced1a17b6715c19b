// `lockstep alert-test`: sends one test alert through every configured sink and
// says, per sink, whether it was delivered and if not why. Exit (lockstep/common/exit_codes.h) 0
// when all were, 2 on a usage mistake or a sink that cannot be set up (as collect),
// 4 when a sink was set up but the alert did not arrive. Takes the same alerting flags (and
// --config file) as `lockstep collect`, so a user checks a setup in one command.
#include <chrono>
#include <cstdio>
#include <string>

#include "cli/alerting_flags.h"
#include "cli/commands.h"
#include "lockstep/common/flags.h"
#include "lockstep/alerting/dispatcher.h"
#include "lockstep/common/clock.h"

namespace lockstep::cli {

int AlertTestCommand(int argc, const char* const* argv) {
  FlagSet flags("alert-test", "alert-test [FLAGS]",
                "Send one test alert (severity as given, rule 'alert_test') through every "
                "configured sink and report per sink whether it arrived. Uses the same alerting "
                "flags and config file as 'lockstep collect'.");
  AlertingFlags af;
  af.log = false;  // the test reports on stdout; the log sink would only repeat it
  std::string severity = "critical", experiment = "lockstep-alert-test";
  RegisterAlertingFlags(&flags, &af);
  flags.String("severity", &severity, "severity of the test alert: info|warning|critical", "SEVERITY");
  flags.String("experiment", &experiment, "experiment name put on the test alert", "NAME");
  Status st = flags.Parse(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "lockstep alert-test: %s\n", OneLine(st.message()).c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return kExitOk;
  }
  auto sev = alerting::ParseSeverity(severity);
  if (!sev.ok()) {
    std::fprintf(stderr, "lockstep alert-test: --severity: %s\n", sev.status().message().c_str());
    return kExitUsage;
  }
  auto opts = BuildAlertingOptions(af, "");
  if (!opts.ok()) {
    std::fprintf(stderr, "lockstep alert-test: %s\n", OneLine(opts.status().message()).c_str());
    return kExitUsage;
  }
  if (opts->sinks.empty()) {
    std::fprintf(stderr,
                 "lockstep alert-test: no alert sink is configured: give --webhook URL, "
                 "--alertmanager URL, --alert-sink SPEC or --alerts-file PATH (or a --config file)\n");
    return kExitUsage;
  }

  alerting::Alert a;
  a.first_seen_unix_ns = UnixNowNs();
  a.id = "alert-test-" + std::to_string(a.first_seen_unix_ns);
  a.rule = "alert_test";
  a.severity = *sev;
  a.experiment = experiment;
  a.runs = {"test-baseline", "test-candidate"};
  a.tensor = "model.layers.0.mlp";
  a.kind = "act";
  a.metric = "rel_err_l2";
  a.baseline_value = 1.0;
  a.candidate_value = 1.5;
  a.error = 0.5;
  a.threshold = 0.01;
  a.message = "lockstep test alert: if you can read this, alerts from lockstep reach you";

  auto results = alerting::SendTestAlert(*opts, a);
  if (!results.ok()) {
    std::fprintf(stderr, "lockstep alert-test: %s\n", OneLine(results.status().message()).c_str());
    return kExitUsage;
  }
  int failed = 0, setup_failed = 0;
  for (const auto& r : *results) {
    setup_failed += r.setup_failed ? 1 : 0;
    std::printf("%-8s %-16s %s: %s\n", r.delivered ? "OK" : "FAILED", r.name.c_str(), r.target.c_str(),
                r.detail.c_str());
    failed += r.delivered ? 0 : 1;
  }
  std::printf("%zu of %zu sink(s) delivered the test alert\n", results->size() - failed, results->size());
  if (setup_failed > 0) {
    for (const auto& r : *results) {
      if (!r.setup_failed) continue;
      std::fprintf(stderr, "lockstep alert-test: sink %s cannot be set up: %s\n", r.name.c_str(),
                   OneLine(r.detail).c_str());
      break;  // one line: the first mistake (stdout lists every sink)
    }
    return kExitUsage;
  }
  return failed == 0 ? kExitOk : kExitRuntime;
}

}  // namespace lockstep::cli
