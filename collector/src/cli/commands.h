// The `lockstep` subcommands. Each takes the words after its name and returns the
// process exit code, one of lockstep/common/exit_codes.h.
#ifndef LOCKSTEP_CLI_COMMANDS_H_
#define LOCKSTEP_CLI_COMMANDS_H_

#include "lockstep/common/exit_codes.h"
#include "top/top_cmd.h"  // TopCommand: the client declares its own (its room is below cli/)

namespace lockstep::cli {

int CollectCommand(int argc, const char* const* argv);  // collect_cmd.cc
int InspectCommand(int argc, const char* const* argv);  // inspect_cmd.cc
int CompareCommand(int argc, const char* const* argv);  // compare_cmd.cc
int AlertTestCommand(int argc, const char* const* argv);  // alert_test_cmd.cc
int KeygenCommand(int argc, const char* const* argv);  // keygen_cmd.cc
int ReportCommand(int argc, const char* const* argv);  // report_cmd.cc
int ImportCommand(int argc, const char* const* argv);  // import_cmd.cc
int ZoomCommand(int argc, const char* const* argv);  // zoom_cmd.cc

}  // namespace lockstep::cli

#endif  // LOCKSTEP_CLI_COMMANDS_H_
