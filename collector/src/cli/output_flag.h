// The commands that write one file (`report`, `import msprobe`) take `-o FILE` as the
// short form of their `--output FILE`: FlagSet knows long flags only, so the short form
// is rewritten before it parses.
#ifndef LOCKSTEP_CLI_OUTPUT_FLAG_H_
#define LOCKSTEP_CLI_OUTPUT_FLAG_H_

#include "lockstep/common/status.h"

namespace lockstep::cli {

class FlagSet;

// fs->Parse(argc, argv) with each "-o" read as "--output".
Status ParseWithShortOutput(FlagSet* fs, int argc, const char* const* argv);

}  // namespace lockstep::cli

#endif  // LOCKSTEP_CLI_OUTPUT_FLAG_H_
