#include "detect/detection_settings.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>
#include <toml++/toml.h>

#include "lockstep/common/flags.h"
#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_format.h"

namespace lockstep::collector {
namespace {

std::string Num(double x) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x);  // shortest form that reads back exactly
  std::string s(buf, r.ptr);
  // TOML floats need a '.' or an exponent (and spell infinity "inf").
  if (s == "inf" || s == "-inf" || s == "nan") return s;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

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
  // The names are AddRuleFlags's (rules_config.cc); detection_settings_test checks that
  // the two lists are the same.
  std::vector<std::pair<std::string, std::string>> v;
  auto d = [&](const char* n, double x) { v.emplace_back(n, Num(x)); };
  auto i = [&](const char* n, int64_t x) { v.emplace_back(n, std::to_string(x)); };
  auto b = [&](const char* n, bool x) { v.emplace_back(n, x ? "true" : "false"); };
  d("tol-fp64", c.rtol.fp64);
  d("tol-fp32", c.rtol.fp32);
  d("tol-fp16", c.rtol.fp16);
  d("tol-bf16", c.rtol.bf16);
  d("tol-fp8", c.rtol.fp8);
  d("atol", c.atol);
  d("tol-kl", c.kl_max);
  d("critical-factor", c.critical_factor);
  i("max-tensor-alerts", c.max_tensor_alerts_per_step);
  i("floor-steps", c.floor_steps);
  d("floor-k", c.floor_k);
  d("loss-tol-fp32", c.loss_rtol.fp32);
  d("loss-tol-fp16", c.loss_rtol.fp16);
  d("loss-tol-bf16", c.loss_rtol.bf16);
  i("trend-window", c.trend_window);
  d("scalar-tol", c.scalar_rtol);
  d("grad-norm-tol", c.grad_norm_rtol);
  d("trend-growth", c.trend_growth);
  b("overflow-fp32-limit", c.overflow_fp32_limit);
  b("underflow-fp32-limit", c.underflow_fp32_limit);
  d("underflow-frac", c.underflow_frac);
  d("spike-loss-ratio", c.spike_loss_ratio);
  d("spike-grad-ratio", c.spike_grad_ratio);
  d("stall-seconds", c.stall_s);
  return v;
}

Status ApplyRuleFlagValues(const std::vector<std::pair<std::string, std::string>>& values,
                           const std::string& origin, RulesConfig* c) {
  if (values.empty()) return Status::OK();
  cli::FlagSet fs("compare", "", "");
  AddRuleFlags(&fs, c);
  std::vector<std::string> args;
  for (const auto& [k, v] : values) args.push_back("--" + k + "=" + v);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  Status st = fs.Parse(static_cast<int>(argv.size()), argv.data());
  if (!st.ok()) return Status::InvalidArgument(origin + ": " + st.message());
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
  std::set<std::string> known;
  for (const auto& [k, v] : RuleFlagValues(RulesConfig{})) known.insert(k);
  std::vector<std::pair<std::string, std::string>> values;
  for (const auto& [k, node] : *rules) {
    std::string key(k.str());
    if (!known.count(key)) {
      if (notes) {
        notes->push_back("the settings file '" + path + "' sets '" + key +
                         "', which this lockstep does not know (written by a newer one?); ignored");
      }
      continue;
    }
    std::string text;
    if (node.is_floating_point()) {
      text = Num(*node.value<double>());
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
