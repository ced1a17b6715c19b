#include "rules/rule_settings.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace lockstep::collector {
namespace {

// The field `member` of a RulesConfig, e.g. FIELD(rtol.fp32).
#define LOCKSTEP_RULE_FIELD(member) [](RulesConfig& c) -> RuleField { return &c.member; }

const RuleSetting kRuleSettings[] = {
    {"tol-fp64", "tensor_drift relative tolerance when the pair's lowest precision is fp64",
     LOCKSTEP_RULE_FIELD(rtol.fp64)},
    {"tol-fp32", "tensor_drift relative tolerance for fp32 pairs", LOCKSTEP_RULE_FIELD(rtol.fp32)},
    {"tol-fp16", "tensor_drift relative tolerance for fp16 pairs", LOCKSTEP_RULE_FIELD(rtol.fp16)},
    {"tol-bf16", "tensor_drift relative tolerance for bf16 pairs", LOCKSTEP_RULE_FIELD(rtol.bf16)},
    {"tol-fp8", "tensor_drift relative tolerance for fp8 pairs", LOCKSTEP_RULE_FIELD(rtol.fp8)},
    {"atol", "absolute tolerance floor of every tensor comparison", LOCKSTEP_RULE_FIELD(atol)},
    {"tol-kl", "judge histogram KL divergence above this (0 = report only)", LOCKSTEP_RULE_FIELD(kl_max)},
    {"critical-factor", "a drift this many times its threshold is critical",
     LOCKSTEP_RULE_FIELD(critical_factor), 1, 1e12},
    {"max-tensor-alerts", "tensor_drift alerts per pair and step (earliest in execution order first)",
     LOCKSTEP_RULE_FIELD(max_tensor_alerts_per_step)},
    {"floor-steps", "steps over which each tensor's normal divergence (noise floor) is learned",
     LOCKSTEP_RULE_FIELD(floor_steps), 0, 1e6},
    {"floor-k", "a tensor drifts when its score exceeds max(1, floor-k x its noise floor)",
     LOCKSTEP_RULE_FIELD(floor_k)},
    {"birth-gain",
     "an op adds error of its own when its output's relative error exceeds this x its inputs' plus rounding",
     LOCKSTEP_RULE_FIELD(birth_gain), 1, 1e6},
    {"birth-ulps",
     "rounding an op may add, in units of its dtype's rounding (plus 2 sqrt(width)); 0 = no birth point",
     LOCKSTEP_RULE_FIELD(birth_ulps), 0, 1e9},
    {"loss-tol-fp32", "loss_drift relative tolerance for fp32 pairs", LOCKSTEP_RULE_FIELD(loss_rtol.fp32)},
    {"loss-tol-fp16", "loss_drift relative tolerance for fp16 pairs", LOCKSTEP_RULE_FIELD(loss_rtol.fp16)},
    {"loss-tol-bf16", "loss_drift relative tolerance for bf16 pairs", LOCKSTEP_RULE_FIELD(loss_rtol.bf16)},
    // Each tensor keeps this many scores.
    {"trend-window", "steps over which trend looks for a growing divergence", LOCKSTEP_RULE_FIELD(trend_window),
     0, 1e4},
    {"scalar-tol", "relative tolerance of the scalars rule for lr, loss scale and samples",
     LOCKSTEP_RULE_FIELD(scalar_rtol)},
    {"grad-norm-tol", "relative tolerance of the scalars rule for the global grad norm",
     LOCKSTEP_RULE_FIELD(grad_norm_rtol)},
    {"trend-growth", "growth factor of the drift score over the window that makes a trend",
     LOCKSTEP_RULE_FIELD(trend_growth)},
    {"overflow-fp32-limit", "warn when fp32 tensors hold values past fp16's range",
     LOCKSTEP_RULE_FIELD(overflow_fp32_limit)},
    {"underflow-fp32-limit", "also judge fp32 tensors' subnormal counts (against fp16's range)",
     LOCKSTEP_RULE_FIELD(underflow_fp32_limit)},
    {"underflow-frac", "fraction of subnormal values in a low-precision tensor that is an underflow",
     LOCKSTEP_RULE_FIELD(underflow_frac), 0, 1},
    {"spike-loss-ratio", "loss above ratio x its EWMA (or below EWMA / ratio) is a spike",
     LOCKSTEP_RULE_FIELD(spike_loss_ratio), 1, 1e12},
    {"spike-grad-ratio", "grad norm above ratio x its EWMA (or below EWMA / ratio) is a spike",
     LOCKSTEP_RULE_FIELD(spike_grad_ratio), 1, 1e12},
    // Held in nanoseconds.
    {"stall-seconds", "a run with no message or no new step for this long has stalled",
     LOCKSTEP_RULE_FIELD(stall_s), 0, 366 * 86400.0},
};

#undef LOCKSTEP_RULE_FIELD

std::string RangeText(double x) {
  std::ostringstream o;
  o << x;
  return o.str();
}

}  // namespace

std::span<const RuleSetting> RuleSettings() { return kRuleSettings; }

const RuleSetting* FindRuleSetting(std::string_view name) {
  for (const auto& s : kRuleSettings)
    if (name == s.name) return &s;
  return nullptr;
}

std::string ShortestDoubleText(double x) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x);  // shortest form that reads back exactly
  std::string s(buf, r.ptr);
  // TOML floats need a '.' or an exponent (and spell infinity "inf").
  if (s == "inf" || s == "-inf" || s == "nan") return s;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string RuleSetting::Format(const RulesConfig& c) const {
  // Only read through the field pointer.
  const RuleField f = field(const_cast<RulesConfig&>(c));
  if (const auto* d = std::get_if<double*>(&f)) return ShortestDoubleText(**d);
  if (const auto* i = std::get_if<int64_t*>(&f)) return std::to_string(**i);
  return *std::get<bool*>(f) ? "true" : "false";
}

Status RuleSetting::Set(const std::string& text, const std::string& origin, RulesConfig* c) const {
  auto bad = [&](const char* what) {
    return Status::InvalidArgument(origin + ": --" + name + " expects " + what + ", got '" + text + "'");
  };
  auto range = [&](double x) -> Status {
    if (x >= lo && x <= hi) return Status::OK();
    std::string want = hi >= kRuleNoMax ? (lo == 0 ? "must not be negative" : "must be at least " + RangeText(lo))
                                        : "must be from " + RangeText(lo) + " to " + RangeText(hi);
    return Status::InvalidArgument(origin + ": --" + name + " " + want + ", got '" + text + "'");
  };
  const RuleField f = field(*c);
  errno = 0;
  char* end = nullptr;
  if (auto* d = std::get_if<double*>(&f)) {
    double x = std::strtod(text.c_str(), &end);
    if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(x)) return bad("a number");
    LOCKSTEP_RETURN_IF_ERROR(range(x));
    **d = x;
  } else if (auto* i = std::get_if<int64_t*>(&f)) {
    long long x = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || errno != 0 || *end != '\0') return bad("an integer");
    LOCKSTEP_RETURN_IF_ERROR(range(static_cast<double>(x)));
    **i = x;
  } else if (text == "true" || text == "1" || text == "yes" || text == "on") {
    *std::get<bool*>(f) = true;
  } else if (text == "false" || text == "0" || text == "no" || text == "off") {
    *std::get<bool*>(f) = false;
  } else {
    return bad("true or false");
  }
  return Status::OK();
}

}  // namespace lockstep::collector
