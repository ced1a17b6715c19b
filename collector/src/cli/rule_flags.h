// The rule flags of every command that runs the detectors — `collect`, `compare` and
// `report` — declared from the one table of rule settings (rules/rule_settings.h):
// --tol-fp32, --floor-steps, --stall-seconds, ... with the table's names, help lines and
// accepted ranges, and RulesConfig{}'s defaults. The settings files use the same table.
//
// Single-threaded: called while a command declares its flags.
#ifndef LOCKSTEP_CLI_RULE_FLAGS_H_
#define LOCKSTEP_CLI_RULE_FLAGS_H_

namespace lockstep::collector {
struct RulesConfig;
}

namespace lockstep::cli {

class FlagSet;

// Declares one flag per rule setting on `fs`, writing into `cfg` (whose values are the
// defaults shown by --help).
void AddRuleFlags(FlagSet* fs, collector::RulesConfig* cfg);

}  // namespace lockstep::cli

#endif  // LOCKSTEP_CLI_RULE_FLAGS_H_
