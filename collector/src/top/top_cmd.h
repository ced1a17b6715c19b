// `lockstep top` as a subcommand: the words after its name in, the process exit code
// out (lockstep/common/exit_codes.h). Declared here, in the client's own room, so the
// client needs nothing from cli/ (docs/design.md "Layering rules"); cli/main.cc
// dispatches to it.
#ifndef LOCKSTEP_COLLECTOR_TOP_TOP_CMD_H_
#define LOCKSTEP_COLLECTOR_TOP_TOP_CMD_H_

namespace lockstep::cli {

int TopCommand(int argc, const char* const* argv);

}  // namespace lockstep::cli

#endif  // LOCKSTEP_COLLECTOR_TOP_TOP_CMD_H_
