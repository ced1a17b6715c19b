#include "cli/offline_pair.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "lockstep/common/exit_codes.h"
#include "lockstep/common/flags.h"
#include "detect/analyzer.h"
#include "rules/detection_settings.h"

namespace lockstep::cli {

std::vector<std::pair<std::string, std::string>> OfflineSettings::NonDefault() const {
  const auto defaults = collector::RuleFlagValues(collector::RulesConfig{});
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i >= defaults.size() || defaults[i] != values[i]) out.push_back(values[i]);
  }
  return out;
}

void AddDefaultSettingsFlag(FlagSet* fs, bool* default_settings) {
  fs->Bool("default-settings", default_settings,
           "ignore the detection settings recorded next to the logs: every rule at its default unless a flag "
           "sets it");
}

int ResolveOfflineSettings(const FlagSet& fs, const std::string& path_base, const std::string& path_cand,
                           bool default_settings, const std::string& name_map,
                           collector::AnalyzerOptions* opt, OfflineSettings* out, std::string* error) {
  collector::RulesConfig rules{};
  std::string recorded_map, recorded_map_origin;
  if (default_settings) {
    out->source = "the defaults (--default-settings: the recorded settings are ignored)";
  } else {
    std::vector<std::string> found;
    for (const auto& log : {path_cand, path_base}) {
      std::string f = collector::SettingsPathForLog(log);
      std::error_code ec;
      if (std::filesystem::is_regular_file(f, ec) && std::find(found.begin(), found.end(), f) == found.end()) {
        found.push_back(f);
      }
    }
    if (found.empty()) {
      out->source = "the defaults (no settings file next to the logs)";
    } else {
      auto rec = collector::ReadSettingsFile(found[0], &out->notes);
      if (!rec.ok()) {
        *error = rec.status().message();
        if (error->find("--default-settings") == std::string::npos) *error += "; pass --default-settings to ignore it";
        return kExitBadInput;
      }
      out->file = found[0];
      out->recorded_version = rec->lockstep_version;
      out->source = "recorded by lockstep " +
                    (rec->lockstep_version.empty() ? std::string("?") : rec->lockstep_version) + " collect in " +
                    found[0] + " (--default-settings ignores them)";
      rules = rec->rules;
      recorded_map = rec->name_map;
      recorded_map_origin = found[0];
      if (found.size() > 1) {
        std::vector<std::string> ignore;
        auto other = collector::ReadSettingsFile(found[1], &ignore);
        if (other.ok() && (collector::RuleFlagValues(other->rules) != collector::RuleFlagValues(rec->rules) ||
                           other->name_map != rec->name_map)) {
          out->notes.push_back("the baseline's settings (" + found[1] + ") differ; the candidate's are used");
        }
      }
      const auto defaults = collector::RuleFlagValues(collector::RulesConfig{});
      const auto recorded = collector::RuleFlagValues(rules);
      for (size_t i = 0; i < recorded.size(); ++i) {
        if (recorded[i] != defaults[i]) out->from_file.push_back(recorded[i].first);
      }
    }
  }
  // The flags given on the command line, over what was recorded.
  std::vector<std::pair<std::string, std::string>> given;
  for (const auto& kv : collector::RuleFlagValues(opt->rules)) {
    if (fs.WasSet(kv.first)) {
      given.push_back(kv);
      out->from_flags.push_back(kv.first);
    }
  }
  Status st = collector::ApplyRuleFlagValues(given, "the command line", &rules);
  if (!st.ok()) {
    *error = st.message();
    return kExitUsage;
  }
  opt->rules = rules;
  out->values = collector::RuleFlagValues(opt->rules);
  if (!name_map.empty()) {
    auto c = collector::NameCanonicalizer::FromFile(name_map);
    if (!c.ok()) {
      *error = c.status().message();
      return kExitUsage;
    }
    opt->canon = std::move(*c);
    out->name_map = std::to_string(opt->canon.rule_count()) + " rule(s) from " + name_map + " (flag)";
  } else if (!recorded_map.empty()) {
    auto c = collector::NameCanonicalizer::FromText(recorded_map, recorded_map_origin + " (name_map)");
    if (!c.ok()) {
      *error = c.status().message() + "; pass --default-settings to ignore it";
      return kExitBadInput;
    }
    opt->canon = std::move(*c);
    out->name_map = std::to_string(opt->canon.rule_count()) + " rule(s) recorded in " + recorded_map_origin;
  }
  return kExitOk;
}

}  // namespace lockstep::cli
