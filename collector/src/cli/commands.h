// The `lockstep` subcommands. Each takes the words after its name and returns the
// process exit code (0 ok, 1 runtime failure or finding, 2 usage error).
#ifndef LOCKSTEP_CLI_COMMANDS_H_
#define LOCKSTEP_CLI_COMMANDS_H_

namespace lockstep::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

int CollectCommand(int argc, const char* const* argv);  // collect_cmd.cc
int InspectCommand(int argc, const char* const* argv);  // inspect_cmd.cc
int CompareCommand(int argc, const char* const* argv);  // compare_cmd.cc
int AlertTestCommand(int argc, const char* const* argv);  // alert_test_cmd.cc
int TopCommand(int argc, const char* const* argv);  // top_cmd.cc
int KeygenCommand(int argc, const char* const* argv);  // keygen_cmd.cc

}  // namespace lockstep::cli

#endif  // LOCKSTEP_CLI_COMMANDS_H_
