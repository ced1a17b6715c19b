// The one table of rule settings: every RulesConfig threshold a user may set, with its
// name (the flag `--NAME` of collect, compare and report, and the key in a settings
// file's [rules] table), its --help line, the values it accepts and where it lives in a
// RulesConfig. Its default is RulesConfig{}'s (docs/rules.md). The CLI declares its
// flags from this table (cli/rule_flags.h); the settings files are written and read
// through it (detection_settings.h), so both take the same names, ranges and errors.
//
// Threads: the table is immutable; the functions are pure.
#ifndef LOCKSTEP_COLLECTOR_RULES_RULE_SETTINGS_H_
#define LOCKSTEP_COLLECTOR_RULES_RULE_SETTINGS_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "rules/rules_config.h"
#include "lockstep/common/status.h"

namespace lockstep::collector {

// A field of a RulesConfig: the kind says how its value is written and parsed.
using RuleField = std::variant<double*, int64_t*, bool*>;

// No upper bound (the flag parser's default range is 0 to this, finite).
inline constexpr double kRuleNoMax = 1e300;

struct RuleSetting {
  const char* name;                  // "tol-fp32": --tol-fp32, `tol-fp32 = ...`
  const char* help;                  // the flag's help line
  RuleField (*field)(RulesConfig&);  // the setting's field in a config
  double lo = 0, hi = kRuleNoMax;    // numbers: the accepted values, inclusive

  // The field as text that parses back to the same value: numbers in their shortest
  // round-trip form (TOML floats keep a '.' or an exponent), booleans true/false.
  std::string Format(const RulesConfig& c) const;
  // Parses `text` as the flag parser does (numbers finite and in [lo, hi]; booleans
  // true/false/1/0/yes/no/on/off) into `c`. A bad value: one sentence starting with
  // `origin`, naming --NAME, what it expects and the text given; `c` untouched.
  Status Set(const std::string& text, const std::string& origin, RulesConfig* c) const;
};

// Every rule setting, in --help order.
std::span<const RuleSetting> RuleSettings();
// The setting named `name`; null when there is none.
const RuleSetting* FindRuleSetting(std::string_view name);

// `x` in its shortest form that reads back exactly, as a TOML float ("2.0", "1e-06").
std::string ShortestDoubleText(double x);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RULES_RULE_SETTINGS_H_
