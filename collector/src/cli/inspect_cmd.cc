// `lockstep inspect FILE...`: prints run logs as JSON lines (docs/runlog.md lists the
// fields): one object per record, or with --summary one per (run, rank) with the
// registry's figures. A torn tail is reported on stderr after the records before it;
// the exit code is 0 for a clean file or a torn tail (a crash or a live writer), 1 for
// a corrupt record or an unreadable file, 2 for a usage error.
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "lockstep/common/flags.h"
#include "lockstep/common/envelope_check.h"
#include "lockstep/collector/registry.h"
#include "cli/inspect_format.h"
#include "runlog/log_format.h"
#include "runlog/log_reader.h"

namespace lockstep::cli {

using collector::LogReader;

int InspectCommand(int argc, const char* const* argv) {
  bool summary = false;
  FlagSet flags("inspect", "inspect [--summary] FILE...",
                "Prints a run log (<data-dir>/<run>.lslog) as JSON lines: one object per record, "
                "or with --summary one object per (run, rank) with message, record, gap and drop "
                "counts.");
  flags.Bool("summary", &summary, "print one summary object per (run, rank) instead of records");
  Status s = flags.Parse(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "lockstep inspect: %s\n", OneLine(s.message()).c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::printf("%s\n", flags.Help().c_str());
    return kExitOk;
  }
  if (flags.positional().empty()) {
    std::fprintf(stderr, "lockstep inspect: give the run log to print, e.g. 'lockstep inspect "
                         "lockstep-data/RUN.lslog'\n");
    return kExitUsage;
  }

  int rc = kExitOk;
  collector::Registry registry;
  std::string line;
  for (const std::string& path : flags.positional()) {
    auto reader = LogReader::Open(path);
    if (!reader.ok()) {
      std::fprintf(stderr, "lockstep inspect: %s\n", reader.status().message().c_str());
      rc = kExitBadInput;
      continue;
    }
    collector::InspectFormatter fmt;
    LogReader::Record rec;
    LogReader::Result res;
    while ((res = (*reader)->Next(&rec)) == LogReader::Result::kRecord) {
      auto env = LogReader::Envelope(rec, collector::runlog::kMaxRecordBytes);
      if (!env.ok()) {
        std::fprintf(stderr, "lockstep inspect: %s: %s (skipped)\n", path.c_str(),
                     env.status().message().c_str());
        rc = kExitBadInput;
        continue;
      }
      if (summary) {
        registry.OnMessage(**env, rec.recv_unix_ns, rec.size);
        continue;
      }
      line.clear();
      fmt.Record(**env, rec.recv_unix_ns, rec.offset, rec.size, &line);
      line.push_back('\n');
      std::fwrite(line.data(), 1, line.size(), stdout);
    }
    if (res == LogReader::Result::kTruncated) {
      std::fprintf(stderr, "lockstep inspect: %s; the %llu records before it were read\n",
                   (*reader)->problem().c_str(),
                   static_cast<unsigned long long>((*reader)->records()));
    } else if (res == LogReader::Result::kCorrupt) {
      std::fprintf(stderr,
                   "lockstep inspect: %s; the %llu records before it were read, nothing after it "
                   "is trusted\n",
                   (*reader)->problem().c_str(),
                   static_cast<unsigned long long>((*reader)->records()));
      rc = kExitBadInput;
    }
  }
  if (summary) {
    for (const auto& r : registry.Snapshot()) {
      line.clear();
      collector::RankSummaryJson(r, &line);
      line.push_back('\n');
      std::fwrite(line.data(), 1, line.size(), stdout);
    }
  }
  std::fflush(stdout);
  return rc;
}

}  // namespace lockstep::cli
