// `lockstep top`: the live terminal view attached to a collector's view feed
// (docs/top.md). The work is in collector/src/top/top_ui.cc; this file is flags.
#include "top/top_cmd.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "lockstep/common/exit_codes.h"
#include "lockstep/common/flags.h"
#include "top/top_ui.h"

namespace lockstep::cli {

int TopCommand(int argc, const char* const* argv) {
  collector::view::TopOptions opt;
  bool once = false, no_color = false;
  double unreachable_s = 3, timeout_s = 5;
  FlagSet flags("top", "top [FLAGS]",
                "Live terminal view of a running collector: runs, loss of both runs, the tensors that drift "
                "most, alerts. Keys: q quit, ? help, Enter a tensor's history, s sort, / filter.");
  flags.String("connect", &opt.connect,
               "the collector's view feed (its --view-listen)", "ENDPOINT");
  flags.Bool("once", &once, "print one plain-text snapshot to stdout and exit (scripts, CI)");
  flags.Double("timeout-s", &timeout_s, "--once: how long to wait for a snapshot", "S");
  flags.Double("unreachable-after-s", &unreachable_s,
               "say the collector is not reachable after this long without a snapshot", "S");
  flags.Bool("no-color", &no_color, "monochrome, even on a colour terminal");
  int64_t width = 100;
  flags.Int("width", &width, "--once: line width in columns, 60 to 1000 (e.g. 80 for an 80x24 terminal)", "COLS");
  flags.Range("timeout-s", 0, 366 * 86400.0);
  flags.Range("unreachable-after-s", 0, 366 * 86400.0);
  Status s = flags.Parse(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "lockstep top: %s\n", OneLine(s.message()).c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::printf("%s\n", flags.Help().c_str());
    return kExitOk;
  }
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "lockstep top: unexpected argument '%s' (top takes only flags; see 'lockstep top --help')\n",
                 OneLine(flags.positional().front(), 80).c_str());
    return kExitUsage;
  }
  if (!(timeout_s > 0) || !(unreachable_s > 0)) {
    std::fprintf(stderr, "lockstep top: --timeout-s and --unreachable-after-s must be more than 0\n");
    return kExitUsage;
  }
  if (width < 60 || width > 1000) {
    std::fprintf(stderr, "lockstep top: --width must be from 60 to 1000 columns\n");
    return kExitUsage;
  }
  opt.once_width = static_cast<int>(width);
  opt.once_timeout_ms = static_cast<int64_t>(timeout_s * 1000);
  opt.unreachable_after_ms = static_cast<int64_t>(unreachable_s * 1000);
  opt.monochrome = no_color || std::getenv("NO_COLOR") != nullptr;
  // The view returns 0 ok, 1 no snapshot / no terminal, 2 a bad endpoint: mapped onto
  // the convention of lockstep/common/exit_codes.h.
  const int rc = once ? collector::view::RunTopOnce(opt) : collector::view::RunTop(opt);
  return rc == 0 ? kExitOk : rc == 2 ? kExitUsage : kExitRuntime;
}

}  // namespace lockstep::cli
