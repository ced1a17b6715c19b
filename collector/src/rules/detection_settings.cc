#include "rules/detection_settings.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>
#include <toml++/toml.h>

#include "rules/rule_settings.h"
#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_format.h"

namespace lockstep::collector {
namespace {

// TOML basic string: quotes, backslashes and control characters escaped.
std::string Quote(const std::string& s) {
  std::string o = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      case '\r': o += "\\r"; break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", ch);
          o += b;
        } else {
          o.push_back(static_cast<char>(ch));
        }
    }
  }
  return o + "\"";
}

}  // namespace

std::vector<std::pair<std::string, std::string>> RuleFlagValues(const RulesConfig& c) {
  std::vector<std::pair<std::string, std::string>> v;
  for (const auto& s : RuleSettings()) v.emplace_back(s.name, s.Format(c));
  return v;
}

Status ApplyRuleFlagValues(const std::vector<std::pair<std::string, std::string>>& values,
                           const std::string& origin, RulesConfig* c) {
  for (const auto& [k, v] : values) {
    const RuleSetting* s = FindRuleSetting(k);
    if (s == nullptr) return Status::InvalidArgument(origin + ": '" + k + "' is not a rule setting");
    LOCKSTEP_RETURN_IF_ERROR(s->Set(v, origin, c));
  }
  return Status::OK();
}

std::string SettingsPathForLog(const std::string& log_path) {
  std::string p = log_path;
  const std::string_view suf = runlog::kLogSuffix;
  if (p.size() > suf.size() && p.compare(p.size() - suf.size(), suf.size(), suf) == 0) p.resize(p.size() - suf.size());
  return p + std::string(kSettingsSuffix);
}

std::string FormatSettings(const DetectionSettings& s, const std::string& run) {
  std::ostringstream o;
  o << "# The detection settings lockstep collect used for run " << run << " (docs/runlog.md,\n"
    << "# \"Detection settings\"). `lockstep compare` reuses them for this log; its flags\n"
    << "# override them and --default-settings ignores them.\n";
  o << "lockstep_version = " << Quote(s.lockstep_version) << "\n";
  o << "name_map = " << Quote(s.name_map) << "\n";
  o << "\n[rules]\n";
  for (const auto& [k, v] : RuleFlagValues(s.rules)) o << k << " = " << v << "\n";
  return o.str();
}

Status WriteSettingsFile(const std::string& path, const DetectionSettings& s, const std::string& run) {
  const std::string text = FormatSettings(s, run);
  {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      if (ss.str() == text) return Status::OK();
    }
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f || !(f << text) || !f.flush()) {
      return Status::IOError("cannot write the settings file '" + path + "': " + std::strerror(errno));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return Status::IOError("cannot write the settings file '" + path + "': " + ec.message());
  }
  return Status::OK();
}

StatusOr<DetectionSettings> ReadSettingsFile(const std::string& path, std::vector<std::string>* notes) {
  toml::table tbl;
  try {
    tbl = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream m;
    m << "the settings file '" << path << "' is not valid TOML: " << e.description() << " (line "
      << e.source().begin.line << "); pass --default-settings to ignore it";
    return Status::InvalidArgument(m.str());
  } catch (const std::exception& e) {
    return Status::InvalidArgument("cannot read the settings file '" + path + "': " + e.what());
  }
  DetectionSettings s;
  if (auto v = tbl["lockstep_version"].value<std::string>()) s.lockstep_version = *v;
  if (auto v = tbl["name_map"].value<std::string>()) s.name_map = *v;
  const auto* rules = tbl["rules"].as_table();
  if (rules == nullptr) {
    return Status::InvalidArgument("the settings file '" + path +
                                   "' has no [rules] table; pass --default-settings to ignore it");
  }
  std::vector<std::pair<std::string, std::string>> values;
  for (const auto& [k, node] : *rules) {
    std::string key(k.str());
    if (FindRuleSetting(key) == nullptr) {
      if (notes) {
        notes->push_back("the settings file '" + path + "' sets '" + key +
                         "', which this lockstep does not know (written by a newer one?); ignored");
      }
      continue;
    }
    std::string text;
    if (node.is_floating_point()) {
      text = ShortestDoubleText(*node.value<double>());
    } else if (node.is_integer()) {
      text = std::to_string(*node.value<int64_t>());
    } else if (node.is_boolean()) {
      text = *node.value<bool>() ? "true" : "false";
    } else {
      return Status::InvalidArgument("the settings file '" + path + "': rule '" + key +
                                     "' is not a number or a boolean; pass --default-settings to ignore it");
    }
    values.emplace_back(key, text);
  }
  LOCKSTEP_RETURN_IF_ERROR(ApplyRuleFlagValues(values, "the settings file '" + path + "'", &s.rules));
  return s;
}

void SettingsRecorder::OnMessage(const wire::Envelope& env, int64_t /*recv_unix_ns*/) {
  if (!env.run_id()) return;
  const std::string_view id = env.run_id()->string_view();
  if (seen_.find(id) != seen_.end()) return;  // the usual case: no allocation per message
  auto it = seen_.emplace(id).first;
  const std::string path = SettingsPathForLog(runlog::LogPathFor(dir_, *it));
  Status st = WriteSettingsFile(path, settings_, *it);
  if (!st.ok()) spdlog::warn("{}; `lockstep compare` of run {} will use its own flags", st.message(), *it);
}

}  // namespace lockstep::collector
