// The exit-status convention of every `lockstep` subcommand: one meaning per code, the
// same kind of failure gives the same code whatever the subcommand. README.md ("Exit
// status") and every `--help` (kExitCodesHelp, appended by FlagSet::Help) describe it.
//
//   0  ok
//   1  finding: the check ran and found what it looks for (compare: a critical
//      divergence, NaN or overflow)
//   2  usage or configuration error: a bad flag, value, TOML key, config file or alert
//      sink given by the user; nothing was started (fix the command line or the config)
//   3  input data error: a run log that is missing, cannot be read, is corrupt or is
//      truncated
//   4  runtime failure: something that was set up right failed while running (a port
//      that cannot be bound, a disk that fills, an alert that could not be delivered)
//   5  compare: too few steps compared (under 90 % of the steps expected)
//   6  compare: the two runs do not look like the same model (they share under half
//      their tensor names)
//
// A process killed by a signal (exit >= 128) is a bug, never part of the convention.
#ifndef LOCKSTEP_COMMON_EXIT_CODES_H_
#define LOCKSTEP_COMMON_EXIT_CODES_H_

namespace lockstep::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFinding = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitBadInput = 3;
inline constexpr int kExitRuntime = 4;
inline constexpr int kExitTooFewSteps = 5;
inline constexpr int kExitNotSameModel = 6;

// The convention as --help prints it (one source for every subcommand's help).
inline constexpr const char* kExitCodesHelp =
    "exit status:\n"
    "  0  ok\n"
    "  1  finding (compare: a critical divergence, NaN or overflow)\n"
    "  2  usage or configuration error (a bad flag, value, TOML key, config file or alert sink)\n"
    "  3  input data error (a run log that is missing, unreadable, corrupt or truncated)\n"
    "  4  runtime failure (e.g. a port that cannot be bound, an alert not delivered)\n"
    "  5  compare: too few steps compared (under 90 % of the steps expected)\n"
    "  6  compare: the runs do not look like the same model (under half the tensor names shared)\n";

}  // namespace lockstep::cli

#endif  // LOCKSTEP_COMMON_EXIT_CODES_H_
