#include "cli/align_flags.h"

#include "detect/analyzer.h"
#include "lockstep/common/flags.h"

namespace lockstep::cli {

void AddAlignFlags(FlagSet* fs, std::string* name_map, int64_t* max_buffered_steps) {
  *max_buffered_steps = static_cast<int64_t>(collector::AnalyzerOptions{}.max_buffered_steps);
  fs->String("name-map", name_map, "file of 'REGEX => REPLACEMENT' rules mapping tensor names", "FILE");
  fs->Int("max-buffered-steps", max_buffered_steps, "steps a run may wait in memory for its partner");
  fs->Range("max-buffered-steps", 1, 1e6);
}

}  // namespace lockstep::cli
