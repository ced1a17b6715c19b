// `lockstep keygen NAME`: makes a ZeroMQ CURVE key pair for a collector or an agent and
// writes NAME.key (both keys, mode 0600) and NAME.pub (the public key) — the files
// `lockstep collect --curve-key/--curve-authorized-keys` and the Python agent's
// LOCKSTEP_CURVE_KEY / LOCKSTEP_CURVE_SERVER_KEY read (docs/security.md).
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "lockstep/common/flags.h"
#include "ingest/curve_keys.h"

namespace lockstep::cli {

int KeygenCommand(int argc, const char* const* argv) {
  bool force = false;
  FlagSet flags("keygen", "keygen [--force] NAME",
                "Makes a CURVE key pair and writes NAME.key (secret, mode 0600) and NAME.pub. "
                "Make one for the collector (lockstep collect --curve-key NAME.key; its NAME.pub goes to "
                "every agent) and one per agent or job (its .key stays with the job, its .pub goes into "
                "the collector's --curve-authorized-keys file). See docs/security.md.");
  flags.Bool("force", &force, "overwrite NAME.key and NAME.pub if they exist");
  Status s = flags.Parse(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "lockstep keygen: %s\n", OneLine(s.message()).c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::printf("%s\n", flags.Help().c_str());
    return kExitOk;
  }
  if (flags.positional().size() != 1) {
    std::fprintf(stderr, "lockstep keygen: give one NAME, e.g. 'lockstep keygen collector' writes "
                         "collector.key and collector.pub\n");
    return kExitUsage;
  }
  auto pair = collector::MakeCurveKeyPair();
  if (!pair.ok()) {
    std::fprintf(stderr, "lockstep keygen: %s\n", pair.status().message().c_str());
    return kExitRuntime;
  }
  auto written = collector::WriteCurveKeyFiles(flags.positional().front(), *pair, force);
  if (!written.ok()) {
    std::fprintf(stderr, "lockstep keygen: %s\n", written.status().message().c_str());
    return written.status().IsInvalidArgument() ? kExitUsage : kExitRuntime;
  }
  std::printf("wrote %s (secret, mode 0600) and %s\npublic key: %s\n", (*written)[0].c_str(),
              (*written)[1].c_str(), pair->public_key.c_str());
  return kExitOk;
}

}  // namespace lockstep::cli
