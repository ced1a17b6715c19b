// fuzz_session: a sequence of frames (fuzz_common.h's SplitFrames format) through the
// collector's whole ingest path without the socket, as Collector::Impl::Handle and the
// `collect` command wire it: CheckEnvelope; the run log first (one LogWriter per run in
// a scratch data dir, flushed after every frame as when the socket runs dry); the
// registry; the `inspect` rendering; the analyzer (aligner, detectors, pairing, the
// memory bound with read-back from the logs) with a fake clock and periodic Tick()s;
// the alerts as JSON. Then two invariants:
//   - each run's log reads back cleanly, byte for byte the accepted messages in order;
//   - a registry rebuilt from the logs (Collector::Impl::Rebuild) equals the live one.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "detect/alert_json.h"
#include "detect/analyzer.h"
#include "fuzz_common.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/envelope_check.h"
#include "lockstep/collector/registry.h"
#include "lockstep/common/wire.h"
#include "lockstep/schema/lockstep_generated.h"
#include "cli/inspect_format.h"
#include "runlog/log_format.h"
#include "runlog/log_reader.h"
#include "runlog/log_writer.h"

namespace lockstep::fuzz {
namespace {

namespace fs = std::filesystem;
using collector::LogReader;
using collector::LogWriter;
using collector::Reject;

constexpr size_t kMaxFrames = 64;
constexpr int64_t kStartNs = 1700000000000000000;

fs::path* g_data_dir = nullptr;

// A scratch data dir for this process, in memory when /dev/shm exists.
void MakeDataDir() {
  std::string tmpl = (fs::exists("/dev/shm") ? std::string("/dev/shm") : fs::temp_directory_path().string()) +
                     "/lockstep-fuzz-session-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  g_data_dir = new fs::path(tmpl);
  std::atexit([] { fs::remove_all(*g_data_dir); });
}

std::string Summaries(const collector::Registry& reg) {
  std::string out;
  for (auto r : reg.Snapshot()) {
    // Refusals are counted live but never logged: a rank known only from them, and
    // the count itself, are not expected back from the logs.
    if (r.messages == 0) continue;
    r.bad_messages = 0;
    collector::RankSummaryJson(r, &out);
    out.push_back('\n');
  }
  return out;
}

void Session(const uint8_t* data, size_t size) {
  std::error_code ec;
  std::vector<fs::path> old;
  for (const auto& e : fs::directory_iterator(*g_data_dir, ec)) old.push_back(e.path());
  for (const auto& p : old) fs::remove(p, ec);

  const auto frames = SplitFrames(data, size, kMaxFrames);
  collector::Registry registry;
  collector::InspectFormatter fmt;
  std::map<std::string, std::unique_ptr<LogWriter>> writers;
  std::map<std::string, std::vector<const std::vector<uint8_t>*>> accepted;

  int64_t now = kStartNs;
  FakeClock clock(now);  // the analyzer's: follows `now`
  collector::AnalyzerOptions opt;
  opt.max_buffered_steps = 2;  // small, so a run ahead of its partner is read back soon
  opt.data_dir = g_data_dir->string();
  opt.idle_close_ns = 2'000'000'000;
  uint64_t alerts = 0;
  std::string out;
  collector::Analyzer analyzer(
      opt,
      [&](alerting::Alert a) {
        ++alerts;
        out = collector::AlertToJson(a);
      },
      &clock);

  for (size_t i = 0; i < frames.size(); ++i) {
    const auto& f = frames[i];
    // Mostly a burst; every 8th frame after a pause long enough to close silent ranks.
    now += (i % 8 == 7) ? 3'000'000'000 : 1'000'000;
    clock.SetUnixNs(now);
    collector::EnvelopeCheck c = collector::CheckEnvelope(f.data(), f.size(), kMaxMessageBytes);
    if (c.reject != Reject::kNone) {
      if (c.env != nullptr && c.env->run_id() != nullptr) {
        std::string_view run(c.env->run_id()->c_str(), c.env->run_id()->size());
        if (IsValidRunId(run)) registry.OnBad(run, c.env->rank());
      }
      continue;
    }
    const wire::Envelope& env = *c.env;
    std::string run(env.run_id()->c_str(), env.run_id()->size());
    auto& w = writers[run];
    if (!w) {
      auto opened = LogWriter::Open(collector::runlog::LogPathFor(opt.data_dir, run), true);
      if (!opened.ok()) Fail("cannot open a log in the scratch dir: " + opened.status().message());
      w = std::move(*opened);
    }
    Status s = w->Append(f.data(), static_cast<uint32_t>(f.size()), now);
    if (s.ok()) s = w->Flush();
    if (!s.ok()) Fail("cannot append to a log in the scratch dir: " + s.message());
    accepted[run].push_back(&f);

    registry.OnMessage(env, now, f.size());
    out.clear();
    fmt.Record(env, now, 0, static_cast<uint32_t>(f.size()), &out);
    analyzer.OnMessage(env, now);
    if (i % 4 == 3) analyzer.Tick(now);
  }
  analyzer.Finish();
  for (const auto& p : analyzer.Reports()) {
    if (p.diverged) out = collector::AlertToJson(p.first_divergence);
  }
  (void)analyzer.counters();
  writers.clear();  // closes (and syncs) the logs

  collector::Registry rebuilt;
  for (const auto& [run, msgs] : accepted) {
    const std::string path = collector::runlog::LogPathFor(opt.data_dir, run);
    auto reader = LogReader::Open(path);
    if (!reader.ok()) Fail("cannot reopen a log: " + reader.status().message());
    LogReader::Record rec;
    size_t n = 0;
    LogReader::Result res;
    while ((res = (*reader)->Next(&rec)) == LogReader::Result::kRecord) {
      if (n >= msgs.size() || rec.size != msgs[n]->size() ||
          std::memcmp(rec.data, msgs[n]->data(), rec.size) != 0)
        Fail("run log of '" + run + "' differs from the accepted messages at record " +
             std::to_string(n));
      ++n;
    }
    if (res != LogReader::Result::kEnd || n != msgs.size())
      Fail("run log of '" + run + "' is not clean after " + std::to_string(n) + " of " +
           std::to_string(msgs.size()) + " records: " + (*reader)->problem());
    auto rec_status = LogWriter::Recover(path, [&](const LogReader::Record& r) {
      collector::EnvelopeCheck c = collector::CheckEnvelope(r.data, r.size, collector::runlog::kMaxRecordBytes);
      if (c.reject != Reject::kNone) Fail("a logged message fails the envelope check on replay");
      rebuilt.OnMessage(*c.env, r.recv_unix_ns, r.size);
    });
    if (!rec_status.ok() || rec_status->cut_bytes != 0) Fail("recovery of a clean log cut it");
  }
  if (Summaries(rebuilt) != Summaries(registry))
    Fail("the registry rebuilt from the logs differs from the live one:\nlive:\n" +
         Summaries(registry) + "rebuilt:\n" + Summaries(rebuilt));
}

}  // namespace
}  // namespace lockstep::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  lockstep::fuzz::Quiet();
  lockstep::fuzz::MakeDataDir();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lockstep::fuzz::Session(data, size);
  return 0;
}
