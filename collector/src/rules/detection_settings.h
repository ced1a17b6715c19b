// The detection settings behind an answer: every rule threshold and tolerance
// (RulesConfig, by its flag names), the name map's rules and the lockstep version.
//
// `lockstep collect` writes them next to each run's log as `<data-dir>/<run>.settings.toml`
// (SettingsRecorder, a MessageSink); `lockstep compare` reads them back
// (ReadSettingsFile) and uses them unless its own flags override them, so the offline
// answer is the live one (docs/runlog.md "Detection settings"). A separate file, not a
// record in the log: the log format stays as it is for every reader.
//
// Threads: the functions are pure or touch only the file they name. SettingsRecorder
// is called on the collector's ingest thread (and during a restart's replay, on the
// thread that replays), never on two at once.
#ifndef LOCKSTEP_COLLECTOR_RULES_DETECTION_SETTINGS_H_
#define LOCKSTEP_COLLECTOR_RULES_DETECTION_SETTINGS_H_

#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rules/rules_config.h"
#include "lockstep/collector/message_sink.h"
#include "lockstep/common/status.h"

namespace lockstep::collector {

inline constexpr std::string_view kSettingsSuffix = ".settings.toml";

struct DetectionSettings {
  RulesConfig rules;
  std::string name_map;        // the name map's text, verbatim ("" = none)
  std::string lockstep_version;
};

// Every rule setting (rule_settings.h: the flags and the [rules] keys), as (name, value)
// in the table's order; each value parses back to the same number (shortest round-trip form).
std::vector<std::pair<std::string, std::string>> RuleFlagValues(const RulesConfig& c);

// Applies `--name=value` for each pair to `c`, checked as the flags are (RuleSetting::Set);
// an unknown name or a bad value gives one sentence naming it and `origin`.
Status ApplyRuleFlagValues(const std::vector<std::pair<std::string, std::string>>& values,
                           const std::string& origin, RulesConfig* c);

// `<dir>/<run>.lslog` -> `<dir>/<run>.settings.toml` (any other name: the name + suffix).
std::string SettingsPathForLog(const std::string& log_path);

// The file's text: a comment saying what it is, then `lockstep_version`, `name_map`
// and a [rules] table of RuleFlagValues. Deterministic (no time stamp), so an
// unchanged file is not rewritten.
std::string FormatSettings(const DetectionSettings& s, const std::string& run);

// Writes FormatSettings atomically (temp file, rename); leaves an identical file alone.
Status WriteSettingsFile(const std::string& path, const DetectionSettings& s, const std::string& run);

// Reads a settings file. Rule keys this version does not know (a newer writer) are
// skipped with a sentence in `notes`; a malformed file or value is an error naming it.
StatusOr<DetectionSettings> ReadSettingsFile(const std::string& path, std::vector<std::string>* notes);

// Writes `<data_dir>/<run>.settings.toml` the first time this process sees each run
// (live or replayed), so the file always holds the settings of the last collector
// that analyzed the run. A failed write is logged once per run and never stops ingest.
class SettingsRecorder : public MessageSink {
 public:
  SettingsRecorder(std::string data_dir, DetectionSettings settings)
      : dir_(std::move(data_dir)), settings_(std::move(settings)) {}
  void OnMessage(const wire::Envelope& env, int64_t recv_unix_ns) override;

 private:
  std::string dir_;
  DetectionSettings settings_;
  std::set<std::string, std::less<>> seen_;  // runs written; looked up by string_view
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RULES_DETECTION_SETTINGS_H_
