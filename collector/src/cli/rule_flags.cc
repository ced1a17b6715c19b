#include "cli/rule_flags.h"

#include <variant>

#include "rules/rule_settings.h"
#include "lockstep/common/flags.h"

namespace lockstep::cli {

void AddRuleFlags(FlagSet* fs, collector::RulesConfig* cfg) {
  for (const auto& s : collector::RuleSettings()) {
    const collector::RuleField f = s.field(*cfg);
    if (auto* d = std::get_if<double*>(&f)) {
      fs->Double(s.name, *d, s.help);
      fs->Range(s.name, s.lo, s.hi);
    } else if (auto* i = std::get_if<int64_t*>(&f)) {
      fs->Int(s.name, *i, s.help);
      fs->Range(s.name, s.lo, s.hi);
    } else {
      fs->Bool(s.name, std::get<bool*>(f), s.help);
    }
  }
}

}  // namespace lockstep::cli
