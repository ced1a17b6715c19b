// `lockstep`: one binary, one subcommand per job (docs/design.md "Parts").
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, const char* const*);
  const char* summary;
};

// Listed in the order a user meets them.
constexpr Command kCommands[] = {
    {"collect", lockstep::cli::CollectCommand,
     "run the collector: ingest agents' statistics, record run logs, align, detect, alert"},
    {"top", lockstep::cli::TopCommand, "live terminal view of a running collector (runs, loss, drifting tensors, alerts)"},
    {"compare", lockstep::cli::CompareCommand,
     "align two recorded runs offline and print the first divergence and a per-tensor table"},
    {"report", lockstep::cli::ReportCommand,
     "write the comparison of two recorded runs as one self-contained HTML page"},
    {"zoom", lockstep::cli::ZoomCommand,
     "ask a running collector to have both runs record each call inside one module"},
    {"inspect", lockstep::cli::InspectCommand, "print a recorded run log as JSON lines"},
    {"import", lockstep::cli::ImportCommand,
     "turn another tool's dump (msprobe) into a run log that every command reads"},
    {"alert-test", lockstep::cli::AlertTestCommand,
     "send one test alert through the configured sinks and say per sink if it arrived"},
    {"keygen", lockstep::cli::KeygenCommand,
     "make a CURVE key pair (NAME.key, NAME.pub) for an authenticated, encrypted collector"},
};

void PrintUsage(FILE* out) {
  std::fprintf(out,
               "lockstep — watch two training runs (e.g. GPU and NPU) and say when and where "
               "they part ways.\n\nusage: lockstep COMMAND [FLAGS]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(out, "  %-12s %s\n", c.name, c.summary);
  std::fprintf(out, "\n'lockstep COMMAND --help' lists a command's flags.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage(stderr);
    return lockstep::cli::kExitUsage;
  }
  std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    PrintUsage(stdout);
    return lockstep::cli::kExitOk;
  }
  if (cmd == "--version" || cmd == "version") {
    std::printf("lockstep %s\n", LOCKSTEP_VERSION);
    return lockstep::cli::kExitOk;
  }
  for (const auto& c : kCommands) {
    if (cmd == c.name) return c.run(argc - 2, argv + 2);
  }
  std::fprintf(stderr, "lockstep: unknown command '%s' (run 'lockstep --help' for the list)\n",
               cmd.c_str());
  return lockstep::cli::kExitUsage;
}
