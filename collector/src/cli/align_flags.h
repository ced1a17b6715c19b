// The alignment flags every command that pairs two runs takes — `collect` (live),
// `compare` and `report` (offline) — declared once so that each has one name, help,
// default and accepted range, and a bad value gets the same one-line error everywhere:
//
//   --name-map FILE           'REGEX => REPLACEMENT' rules mapping tensor names
//   --max-buffered-steps N    steps a run may wait in memory for its partner, 1 to 1e6
//                             (default AnalyzerOptions::max_buffered_steps); 0 is refused
//
// Single-threaded: called while a command declares its flags.
#ifndef LOCKSTEP_CLI_ALIGN_FLAGS_H_
#define LOCKSTEP_CLI_ALIGN_FLAGS_H_

#include <cstdint>
#include <string>

namespace lockstep::cli {

class FlagSet;

// Binds the flags to the caller's variables; sets *max_buffered_steps to its default.
void AddAlignFlags(FlagSet* fs, std::string* name_map, int64_t* max_buffered_steps);

}  // namespace lockstep::cli

#endif  // LOCKSTEP_CLI_ALIGN_FLAGS_H_
