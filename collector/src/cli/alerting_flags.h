// Alerting flags: binds every alerting option to a `lockstep` flag (and so to the
// TOML config, whose keys are the flag names), and turns the values into
// alerting::AlertingOptions. Used by `lockstep collect` and `lockstep alert-test`.
//
//   AlertingFlags af;                       // before FlagSet::Parse
//   RegisterAlertingFlags(&flags, &af);
//   ... flags.Parse(argc, argv) ...
//   auto opts = BuildAlertingOptions(af, data_dir + "/alert-spool");
//   if (!opts.ok()) { print opts.status().message(); return kExitUsage; }
//
// Values "env:NAME" (URLs, secrets, tokens) are read from the environment, so
// secrets need not sit in a config file or the process list. Single-threaded, at
// start-up. docs/alerting.md lists every flag.
#ifndef LOCKSTEP_CLI_ALERTING_FLAGS_H_
#define LOCKSTEP_CLI_ALERTING_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/common/flags.h"
#include "lockstep/alerting/options.h"
#include "lockstep/common/status.h"

namespace lockstep::cli {

struct AlertingFlags {
  std::vector<std::string> webhooks;         // --webhook URL (repeat)
  std::vector<std::string> webhook_formats;  // --webhook-format F: one for all, or one per --webhook
  std::string webhook_secret;                // --webhook-secret (feishu/dingtalk signing)
  std::string webhook_token;                 // --webhook-token (Bearer, generic webhooks)
  std::string feishu_msg_type = "interactive";
  std::vector<std::string> alertmanagers;    // --alertmanager URL (repeat)
  std::string generator_url;                 // --alert-generator-url
  std::vector<std::string> sinks;            // --alert-sink "kind=..,url=..,..." (repeat)
  std::string alerts_file;                   // --alerts-file PATH
  bool log = true;                           // --alert-log / --no-alert-log
  std::string min_severity = "info";
  std::string ca_file;
  std::string spool_dir;                     // "" = the caller's default
  int64_t spool_max_mb = 64;
  double cooldown_s = 300;
  double rate_per_min = 60;
  int64_t burst = 20;
  int64_t retries = 3;
  int64_t backoff_ms = 500;
  double backoff_max_s = 60;
  double timeout_s = 10;
  double connect_timeout_s = 3;
  bool incidents = true;                     // --incidents / --no-incidents
  double incident_digest_interval_s = 300;   // --incident-digest-interval-s
  double incident_resolve_s = 600;           // --incident-resolve-s
};

void RegisterAlertingFlags(FlagSet* flags, AlertingFlags* values);

// `default_spool_dir` is used when --alert-spool-dir is not given ("" = in memory).
// A mistake (bad URL, unknown format, unset env var) is one sentence.
StatusOr<alerting::AlertingOptions> BuildAlertingOptions(const AlertingFlags& values,
                                                         const std::string& default_spool_dir);

}  // namespace lockstep::cli

#endif  // LOCKSTEP_CLI_ALERTING_FLAGS_H_
