// What `compare` and `report` share when they judge two recorded run logs offline: the
// detection settings (recorded next to the logs, flags on top). The pipeline itself is
// service/offline_compare.h's. One place, so the two commands give one answer.
// Called from the command's thread only.
#ifndef LOCKSTEP_CLI_OFFLINE_PAIR_H_
#define LOCKSTEP_CLI_OFFLINE_PAIR_H_

#include <string>
#include <utility>
#include <vector>

#include "lockstep/common/status.h"

namespace lockstep::collector {
struct AnalyzerOptions;
}  // namespace lockstep::collector

namespace lockstep::cli {

class FlagSet;

// Where the detection settings of an offline comparison came from, for its header.
struct OfflineSettings {
  std::string source;                  // one phrase: where the values came from
  std::string file;                    // the settings file used ("" = none)
  std::string recorded_version;        // its lockstep_version
  std::vector<std::pair<std::string, std::string>> values;  // every rule flag, in use
  std::vector<std::string> from_file, from_flags;           // names set by each
  std::string name_map;                // "" none, else where the name map came from
  std::vector<std::string> notes;      // e.g. the baseline's settings differ

  // The rule flags whose value differs from the default, in flag order.
  std::vector<std::pair<std::string, std::string>> NonDefault() const;
};

// --default-settings, the same flag for compare and report: ignore the settings recorded
// next to the logs (ResolveOfflineSettings' `default_settings`).
void AddDefaultSettingsFlag(FlagSet* fs, bool* default_settings);

// Sets opt->rules and opt->canon for comparing `path_base` with `path_cand`: the
// settings `lockstep collect` recorded next to the candidate's log (else the
// baseline's) unless `default_settings`, then every rule flag set in `fs` on top
// (AddRuleFlags must have bound them to opt->rules), then `name_map` (a file) over a
// recorded name map. Returns 0, or the exit status (kExitUsage for a bad flag or name
// map file, kExitBadInput for a malformed recorded file) with one sentence in *error.
int ResolveOfflineSettings(const FlagSet& fs, const std::string& path_base, const std::string& path_cand,
                           bool default_settings, const std::string& name_map,
                           collector::AnalyzerOptions* opt, OfflineSettings* out, std::string* error);

}  // namespace lockstep::cli

#endif  // LOCKSTEP_CLI_OFFLINE_PAIR_H_
