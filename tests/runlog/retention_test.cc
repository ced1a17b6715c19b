// Segments (a run's log closed into numbered files, read as one) and retention (the
// window, the incident neighbourhoods and the thinning of closed segments):
// collector/src/runlog/segments.h, log_reader.h, log_writer.h, retention.h.
#include "runlog/retention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "file_size_limit.h"
#include "lockstep/collector/collector.h"
#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_format.h"
#include "runlog/log_reader.h"
#include "runlog/log_writer.h"
#include "runlog/segments.h"
#include "test_dir.h"
#include "test_messages.h"

namespace lockstep::collector {
namespace {

namespace fs = std::filesystem;
using testing::At;
using testing::Bytes;

// A run of `steps` steps: a Hello, then per step 8 tensors' statistics, the scalars and
// the StepEnd, written with segments of `segment_bytes` (plain records: their sizes are
// predictable).
struct RunWriter {
  std::unique_ptr<LogWriter> w;
  std::string run;
  uint64_t seq = 0;
  void Put(const Bytes& b) { ASSERT_TRUE(w->Append(b.data(), b.size(), 1000 + seq).ok()); }
  void Steps(uint64_t from, uint64_t to) {
    for (uint64_t s = from; s < to; ++s) {
      Put(testing::Stats(At(run, 0, seq++), s, 8));
      Put(testing::Scalars(At(run, 0, seq++), s, 1.0 + s));
      Put(testing::StepEnd(At(run, 0, seq++), s, 8));
      ASSERT_TRUE(w->Flush().ok());  // a flush per step, as a collector at one step a burst
    }
  }
};

RunWriter OpenRun(const std::string& dir, const std::string& run, uint64_t segment_bytes,
                  wire::Role role = wire::Role::Candidate) {
  RunWriter r;
  r.run = run;
  auto w = LogWriter::Open(runlog::LogPathFor(dir, run), true, 64 << 10, /*compress=*/false);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  r.w = std::move(*w);
  r.w->SetSegmentBytes(segment_bytes);
  r.Put(testing::Hello(At(run, 0, r.seq++), "exp", role));
  return r;
}

// Steps [0, steps) of run "run-a" in 16 KiB segments; returns the log's path.
std::string WriteRun(const std::string& dir, uint64_t steps) {
  RunWriter r = OpenRun(dir, "run-a", 16 << 10);
  r.Steps(0, steps);
  return runlog::LogPathFor(dir, "run-a");
}

// The rule the thinning tests use: a 200-step window, every 10th step kept.
RetentionOptions ThinningOptions(const std::string& dir) {
  RetentionOptions o;
  o.data_dir = dir;
  o.retain_steps = 200;
  o.thin_every = 10;
  return o;
}

// What a reader of the whole log sees: per step, whether its statistics and its scalars
// are there.
struct Seen {
  std::set<uint64_t> stats, scalars;
  uint64_t messages = 0;
  std::vector<uint64_t> seqs;
  std::vector<LogReader::ThinNote> notes;
};

Seen ReadLog(const std::string& path) {
  Seen s;
  auto r = LogReader::Open(path);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return s;
  LogReader::Record rec;
  LogReader::Result res;
  while ((res = (*r)->Next(&rec)) == LogReader::Result::kRecord) {
    auto env = LogReader::Envelope(rec);
    EXPECT_TRUE(env.ok());
    if (!env.ok()) continue;
    ++s.messages;
    s.seqs.push_back((*env)->seq());
    if ((*env)->body_type() == wire::Body::StepStats) {
      const auto* ss = (*env)->body_as_StepStats();
      if (ss->stats() != nullptr && ss->stats()->size() > 0) s.stats.insert(ss->step());
    }
    if ((*env)->body_type() == wire::Body::StepScalars)
      s.scalars.insert((*env)->body_as_StepScalars()->step());
  }
  EXPECT_EQ(res, LogReader::Result::kEnd) << (*r)->problem();
  s.notes = (*r)->thinned();
  return s;
}

TEST(Segments, ALogClosedIntoSegmentsReadsAsOneLogInOrder) {
  testing::TempDir dir;
  {
    RunWriter r = OpenRun(dir.path(), "run-a", 8 << 10);
    r.Steps(0, 100);
  }
  const std::string head = runlog::LogPathFor(dir.path(), "run-a");
  const auto segs = runlog::ListSegments(head);
  ASSERT_GE(segs.size(), 5u);  // 100 steps of ~1 KB in 8 KB segments
  EXPECT_EQ(segs.front().path, head + ".000001");
  EXPECT_EQ(runlog::ListRunLogs(dir.path()), std::vector<std::string>{"run-a"});
  Seen s = ReadLog(head);
  EXPECT_EQ(s.messages, 301u);
  for (size_t i = 0; i < s.seqs.size(); ++i)
    ASSERT_EQ(s.seqs[i], i);  // every message once, in order
  // The open file alone holds only the last ones.
  auto only = LogReader::OpenFile(head);
  ASSERT_TRUE(only.ok());
  LogReader::Record rec;
  uint64_t n = 0;
  while ((*only)->Next(&rec) == LogReader::Result::kRecord) ++n;
  EXPECT_LT(n, 301u / segs.size());
}

TEST(Segments, AReaderAtTheEndFollowsTheRotationsThatCameAfterIt) {
  testing::TempDir dir;
  RunWriter r = OpenRun(dir.path(), "run-a", 8 << 10);
  r.Steps(0, 10);
  auto reader = LogReader::Open(runlog::LogPathFor(dir.path(), "run-a"));
  ASSERT_TRUE(reader.ok());
  LogReader::Record rec;
  std::vector<uint64_t> seqs;
  auto drain = [&] {
    while ((*reader)->Next(&rec) == LogReader::Result::kRecord) {
      auto env = LogReader::Envelope(rec);
      ASSERT_TRUE(env.ok());
      seqs.push_back((*env)->seq());
    }
  };
  drain();
  EXPECT_EQ(seqs.size(), 31u);
  // Several rotations while the reader waits at the end of the open file.
  r.Steps(10, 60);
  drain();
  r.Steps(60, 70);
  drain();
  ASSERT_EQ(seqs.size(), 211u);
  for (size_t i = 0; i < seqs.size(); ++i) ASSERT_EQ(seqs[i], i);
}

TEST(Segments, ALogWhoseOpenFileIsMissingIsItsSegments) {
  // A collector killed between the rename and the new open file.
  testing::TempDir dir;
  const std::string head = runlog::LogPathFor(dir.path(), "run-a");
  {
    RunWriter r = OpenRun(dir.path(), "run-a", 8 << 10);
    r.Steps(0, 40);
  }
  const uint64_t in_head = [&] {
    auto only = LogReader::OpenFile(head);
    LogReader::Record rec;
    uint64_t n = 0;
    while ((*only)->Next(&rec) == LogReader::Result::kRecord) ++n;
    return n;
  }();
  fs::remove(head);
  EXPECT_EQ(runlog::ListRunLogs(dir.path()), std::vector<std::string>{"run-a"});
  Seen s = ReadLog(head);
  EXPECT_EQ(s.messages, 121u - in_head);
}

TEST(Segments, ACollectorKilledInARotationRebuildsTheRunFromItsSegments) {
  testing::TempDir dir;
  const std::string head = runlog::LogPathFor(dir.path(), "run-a");
  {
    RunWriter r = OpenRun(dir.path(), "run-a", 8 << 10);
    r.Steps(0, 40);
  }
  // The rotation's rename done, the next open file not made yet.
  const auto segs = runlog::ListSegments(head);
  ASSERT_FALSE(segs.empty());
  fs::rename(head, runlog::SegmentPathFor(head, segs.back().number + 1));
  ASSERT_EQ(ReadLog(head).messages, 121u);
  CollectorOptions o;
  o.listen = {"tcp://127.0.0.1:*"};
  o.data_dir = dir.path();
  auto c = Collector::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->counters().rebuilt_messages, 121u);
  EXPECT_TRUE(fs::exists(head)) << "a new open file";
  const auto ranks = (*c)->registry().Snapshot();
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0].messages, 121u);
  EXPECT_EQ(ranks[0].gaps, 0u);
  EXPECT_EQ(ReadLog(head).messages, 121u);
}

// The rule: outside the window, every 10th step and the incident's neighbourhood keep
// their statistics; every step keeps its scalars; the window is untouched.
TEST(Retention, ThinsClosedSegmentsOutsideTheWindowKeepingEveryKthStepAndIncidents) {
  testing::TempDir dir;
  const std::string head = WriteRun(dir.path(), 1000);
  RetentionOptions o = ThinningOptions(dir.path());
  Retention ret(o);
  ret.KeepSteps("exp", 400, 450);    // an incident of this run's experiment
  ret.KeepSteps("other", 600, 650);  // another experiment's: not this run's
  const uint64_t before = [&] {
    uint64_t b = 0;
    for (const auto& sg : runlog::ListSegments(head)) b += fs::file_size(sg.path);
    return b;
  }();
  ASSERT_TRUE(ret.CompactOnce().ok());
  Seen s = ReadLog(head);
  for (uint64_t step = 0; step < 1000; ++step) ASSERT_TRUE(s.scalars.count(step)) << step;
  // Every message is still there (a thinned step's statistics message hollowed, not
  // removed): the sequence numbers have no gap.
  ASSERT_EQ(s.messages, 3001u);
  for (size_t i = 0; i < s.seqs.size(); ++i) ASSERT_EQ(s.seqs[i], i);
  // The newest closed segment's last step is the top; segments wholly 200 steps behind
  // it are thinned.
  uint64_t top = 0;
  for (uint64_t step : s.stats) top = std::max(top, step);
  EXPECT_EQ(top, 999u);
  uint64_t thinned_through = 0;
  for (const auto& n : s.notes) thinned_through = std::max(thinned_through, n.last_step);
  ASSERT_GT(thinned_through, 600u);
  ASSERT_LE(thinned_through, 999u - 200u);
  for (uint64_t step = 0; step < 1000; ++step) {
    const bool kept = step % 10 == 0 || (step >= 400 && step <= 450) || step > thinned_through;
    if (step + 1 < thinned_through) ASSERT_EQ(s.stats.count(step) == 1, kept) << "step " << step;
  }
  EXPECT_TRUE(s.stats.count(999 - 200 + 1));  // the window whole
  EXPECT_FALSE(s.stats.count(601));           // the other experiment's incident is not kept here
  const std::string said = LogReader::DescribeThinning(s.notes);
  EXPECT_NE(said.find("steps 0-"), std::string::npos) << said;
  EXPECT_NE(said.find("every 10th step"), std::string::npos) << said;
  // The segment wholly inside the incident's neighbourhood is not rewritten: two ranges
  // around it.
  EXPECT_EQ(std::count(said.begin(), said.end(), ';'), 1) << said;
  for (const auto& n : s.notes)
    EXPECT_FALSE(n.first_step >= 407 && n.last_step <= 450) << n.first_step;
  auto c = ret.counters();
  EXPECT_GT(c.segments_thinned, 0u);
  // 8 tensors a step in plain records: a hollowed message is a fair part of a full one.
  EXPECT_LT(c.bytes_after * 2, c.bytes_before) << "9 of 10 steps' statistics dropped";
  EXPECT_LT(c.bytes_after, before);
  // A second pass finds nothing left to do.
  ASSERT_TRUE(ret.CompactOnce().ok());
  EXPECT_EQ(ret.counters().segments_thinned, c.segments_thinned);
}

// The bytes of the data dir's run logs, as retention counts them.
uint64_t LogBytes(const std::string& dir) {
  uint64_t b = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(runlog::kLogSuffix) != std::string::npos)
      b += fs::file_size(e.path());
  return b;
}

// The counters /metrics shows (docs/metrics.md "Retention") against what the files say.
TEST(Retention, CountersMatchWhatThePassDidOnDisk) {
  testing::TempDir dir;
  const std::string head = WriteRun(dir.path(), 1000);
  RetentionOptions o = ThinningOptions(dir.path());
  Retention ret(o);
  ret.KeepSteps("exp", 400, 450);
  ret.KeepSteps("exp", 440, 500);    // overlaps: one range 400-500
  ret.KeepSteps("exp", 501, 510);    // adjacent: 400-510
  ret.KeepSteps("exp", 420, 480);    // inside: nothing new
  ret.KeepSteps("other", 10, 19);
  const uint64_t before = LogBytes(dir.path());
  ASSERT_TRUE(ret.CompactOnce().ok());
  const Seen s = ReadLog(head);
  const RetentionCounters c = ret.counters();
  EXPECT_EQ(c.passes, 1u);
  ASSERT_GT(c.segments_thinned, 0u);
  EXPECT_EQ(c.segments_thinned, s.notes.size());
  uint64_t hollowed = 0;
  for (const auto& n : s.notes) hollowed += n.dropped_messages;
  EXPECT_EQ(c.messages_dropped, hollowed);
  EXPECT_EQ(c.messages_dropped, 1000u - s.stats.size()) << "one StepStats message a step";
  const uint64_t after = LogBytes(dir.path());
  EXPECT_EQ(c.log_bytes, after);
  EXPECT_EQ(c.bytes_reclaimed, before - after);  // only thinned segments changed
  EXPECT_EQ(c.bytes_reclaimed, c.bytes_before - c.bytes_after);
  EXPECT_FALSE(c.over_max_disk);
  EXPECT_EQ(c.failures, 0u);
  EXPECT_GT(c.pass_seconds, 0.0);
  EXPECT_GE(c.pass_seconds, c.seconds);
  using Steps = std::vector<std::pair<std::string, uint64_t>>;
  EXPECT_EQ(ret.IncidentSteps(), (Steps{{"exp", 111}, {"other", 10}}));
  // A second pass with nothing to do: counted, the totals unchanged.
  ASSERT_TRUE(ret.CompactOnce().ok());
  EXPECT_EQ(ret.counters().passes, 2u);
  EXPECT_EQ(ret.counters().segments_thinned, c.segments_thinned);
  EXPECT_EQ(ret.counters().log_bytes, after);

  // A restarted collector reads the ranges back, and a replayed alert inside them adds
  // no line to retention.keep.
  const std::string keep = dir.path() + "/retention.keep";
  const auto lines = [&] {
    std::ifstream f(keep);
    return std::count(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>(), '\n');
  };
  const auto n = lines();
  EXPECT_EQ(n, 4);  // the range inside the others was never written
  o.max_disk_bytes = 1000;  // far too little: over once everything closed is thinned
  Retention again(o);
  EXPECT_EQ(again.IncidentSteps(), (Steps{{"exp", 111}, {"other", 10}}));
  again.KeepSteps("exp", 405, 505);
  EXPECT_EQ(lines(), n);
  ASSERT_TRUE(again.CompactOnce().ok());
  EXPECT_TRUE(again.counters().over_max_disk);
  EXPECT_EQ(again.counters().log_bytes, LogBytes(dir.path()));
}

TEST(Retention, NoStepIsThinnedBeforeItsPairsComparedIt) {
  testing::TempDir dir;
  const std::string head = WriteRun(dir.path(), 1000);
  RetentionOptions o = ThinningOptions(dir.path());
  o.pairs = [](const std::string& experiment) {
    if (experiment != "exp") return std::vector<PairProgress>{};
    return std::vector<PairProgress>{{"base", "run-a", 300}};  // the pair is far behind this run
  };
  Retention ret(o);
  ASSERT_TRUE(ret.CompactOnce().ok());
  Seen s = ReadLog(head);
  for (const auto& n : s.notes) EXPECT_LE(n.last_step, 100u);
  for (uint64_t step = 101; step < 1000; ++step) ASSERT_TRUE(s.stats.count(step)) << step;
}

// The last step of the log's thinned part (its notes'); 0 when nothing is thinned.
uint64_t ThinnedThrough(const std::string& head) {
  uint64_t last = 0;
  for (const auto& n : ReadLog(head).notes) last = std::max(last, n.last_step);
  return last;
}

// Pairs whose compared steps a test sets between passes.
struct FakePairs {
  std::vector<PairProgress> pairs;
  std::function<std::vector<PairProgress>(const std::string&)> Fn() {
    return [this](const std::string& experiment) {
      return experiment == "exp" ? pairs : std::vector<PairProgress>{};
    };
  }
};

// A candidate dies at step 300 while its baseline writes on: once the baseline has
// written more than 2 x retain_steps (400) steps past the pair's last compared step, the
// pair no longer holds the window; both runs are then thinned up to 200 steps behind the
// baseline's newest step, alike. When it compares again, it holds the window again.
TEST(Retention, APairThatStopsComparingNoLongerHoldsItsRunsWindow) {
  testing::TempDir dir;
  RunWriter base = OpenRun(dir.path(), "base", 16 << 10, wire::Role::Baseline);
  RunWriter cand = OpenRun(dir.path(), "cand", 16 << 10);
  base.Steps(0, 300);
  cand.Steps(0, 300);
  const std::string base_log = runlog::LogPathFor(dir.path(), "base");
  const std::string cand_log = runlog::LogPathFor(dir.path(), "cand");
  FakePairs fake;
  fake.pairs = {{"base", "cand", 299}};
  RetentionOptions o = ThinningOptions(dir.path());
  o.pairs = fake.Fn();
  Retention ret(o);
  ASSERT_TRUE(ret.CompactOnce().ok());
  const uint64_t first_lead = runlog::ListSegments(base_log).size();
  EXPECT_LE(ThinnedThrough(base_log), 99u);
  EXPECT_GT(ThinnedThrough(base_log), 0u);
  // 250 more steps: under the bound, the dead pair still holds the window at 299.
  base.Steps(300, 550);
  ASSERT_TRUE(ret.CompactOnce().ok());
  EXPECT_LE(ThinnedThrough(base_log), 99u);
  EXPECT_EQ(ret.counters().stalled_pairs, 0u);
  for (uint64_t step = 100; step < 550; ++step) ASSERT_TRUE(ReadLog(base_log).stats.count(step)) << step;
  // On to 1000: past the bound. The window follows the baseline's newest closed step.
  base.Steps(550, 1000);
  ASSERT_TRUE(ret.CompactOnce().ok());
  EXPECT_EQ(ret.counters().stalled_pairs, 1u);
  ASSERT_GT(runlog::ListSegments(base_log).size(), first_lead);
  uint64_t newest_closed = 0;
  {
    // The newest step in the baseline's closed segments: its open file holds the rest.
    const auto segs = runlog::ListSegments(base_log);
    auto r = LogReader::OpenFile(segs.back().path);
    ASSERT_TRUE(r.ok());
    LogReader::Record rec;
    while ((*r)->Next(&rec) == LogReader::Result::kRecord) {
      auto env = LogReader::Envelope(rec);
      if (env.ok() && (*env)->body_type() == wire::Body::StepEnd)
        newest_closed = std::max(newest_closed, static_cast<uint64_t>((*env)->body_as_StepEnd()->step()));
    }
  }
  const uint64_t through = ThinnedThrough(base_log);
  EXPECT_LE(through, newest_closed - 200);
  EXPECT_GT(through, newest_closed - 200 - 80) << "within a segment of the bound";  // ~60 steps a segment
  const Seen b = ReadLog(base_log);
  for (uint64_t step = 0; step < through; ++step)
    ASSERT_EQ(b.stats.count(step) == 1, step % 10 == 0) << step;
  for (uint64_t step = newest_closed - 200 + 1; step < 1000; ++step) ASSERT_TRUE(b.stats.count(step)) << step;
  // The dead candidate's closed segments are thinned alike (all of them: behind the top).
  const Seen c = ReadLog(cand_log);
  ASSERT_FALSE(c.notes.empty());
  for (uint64_t step = 0; step < ThinnedThrough(cand_log); ++step)
    ASSERT_EQ(c.stats.count(step) == 1, step % 10 == 0) << step;
  // The pair compares again, from step 600: the window holds at 600 again; the baseline
  // writes on and nothing newer is thinned.
  fake.pairs = {{"base", "cand", 600}};
  base.Steps(1000, 1400);
  ASSERT_TRUE(ret.CompactOnce().ok());
  EXPECT_EQ(ret.counters().stalled_pairs, 0u);
  EXPECT_EQ(ThinnedThrough(base_log), through);
  for (uint64_t step = through + 1; step < 1400; ++step) ASSERT_TRUE(ReadLog(base_log).stats.count(step)) << step;
}

// A slow candidate compares a few steps each pass while its baseline runs far ahead:
// each step it compares resets the bound, so the window holds at its compared step
// however far the baseline gets (what it will compare stays whole).
TEST(Retention, ASlowPairThatStillComparesHoldsItsWindow) {
  testing::TempDir dir;
  RunWriter base = OpenRun(dir.path(), "base", 16 << 10, wire::Role::Baseline);
  FakePairs fake;
  fake.pairs = {{"base", "cand", 250}};
  RetentionOptions o = ThinningOptions(dir.path());
  o.pairs = fake.Fn();
  Retention ret(o);
  base.Steps(0, 300);
  for (uint64_t to = 400; to <= 1500; to += 100) {
    base.Steps(to - 100, to);
    fake.pairs[0].compared += 5;  // 300 steps at the end
    ASSERT_TRUE(ret.CompactOnce().ok());
    ASSERT_EQ(ret.counters().stalled_pairs, 0u) << to;
  }
  const std::string base_log = runlog::LogPathFor(dir.path(), "base");
  EXPECT_LE(ThinnedThrough(base_log), 310u - 200u);
  const Seen b = ReadLog(base_log);
  for (uint64_t step = 111; step < 1500; ++step) ASSERT_TRUE(b.stats.count(step)) << step;
}

// Of two candidates of a baseline, one stops and one still compares: the one that
// compares holds the window of every run of the experiment; the stopped one no longer
// holds it back.
TEST(Retention, AStoppedPairIsLeftOutWhileAnotherStillCompares) {
  testing::TempDir dir;
  RunWriter base = OpenRun(dir.path(), "base", 16 << 10, wire::Role::Baseline);
  RunWriter dead = OpenRun(dir.path(), "dead", 16 << 10);
  base.Steps(0, 300);
  dead.Steps(0, 300);
  FakePairs fake;
  fake.pairs = {{"base", "dead", 299}, {"base", "live", 150}};
  RetentionOptions o = ThinningOptions(dir.path());
  o.pairs = fake.Fn();
  Retention ret(o);
  ASSERT_TRUE(ret.CompactOnce().ok());
  EXPECT_EQ(ThinnedThrough(runlog::LogPathFor(dir.path(), "base")), 0u) << "held at 150 by the live pair";
  base.Steps(300, 1000);
  fake.pairs[1].compared = 700;
  ASSERT_TRUE(ret.CompactOnce().ok());
  EXPECT_EQ(ret.counters().stalled_pairs, 1u);
  const std::string base_log = runlog::LogPathFor(dir.path(), "base");
  const uint64_t through = ThinnedThrough(base_log);
  EXPECT_LE(through, 500u);
  EXPECT_GT(through, 299u) << "past the stopped pair's step";
  for (uint64_t step = 501; step < 1000; ++step) ASSERT_TRUE(ReadLog(base_log).stats.count(step)) << step;
  // The stopped candidate is thinned as far as the experiment's top (all it has closed).
  EXPECT_GT(ThinnedThrough(runlog::LogPathFor(dir.path(), "dead")), 0u);
}

TEST(Retention, ABaselineWithoutAPairIsNotThinnedByTheWindow) {
  testing::TempDir dir;
  {
    RunWriter r = OpenRun(dir.path(), "base", 16 << 10, wire::Role::Baseline);
    r.Steps(0, 1000);
  }
  RetentionOptions o = ThinningOptions(dir.path());
  Retention ret(o);
  ASSERT_TRUE(ret.CompactOnce().ok());
  EXPECT_EQ(ret.counters().segments_thinned, 0u);
  EXPECT_EQ(ReadLog(runlog::LogPathFor(dir.path(), "base")).stats.size(), 1000u);
}

TEST(Retention, OverMaxDiskThinsOldestFirstThenAlertsOnce) {
  testing::TempDir dir;
  const std::string head = runlog::LogPathFor(dir.path(), "base");
  {
    RunWriter r = OpenRun(dir.path(), "base", 16 << 10, wire::Role::Baseline);
    r.Steps(0, 300);
  }
  std::vector<std::string> alerts;
  RetentionOptions o;
  o.data_dir = dir.path();
  o.thin_every = 10;
  o.on_alert = [&](const std::string& metric, const std::string& message) {
    alerts.push_back(metric + ": " + message);
  };
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) total += fs::file_size(e.path());
  // Room for about two thirds: the oldest segments go first, and it then fits.
  o.max_disk_bytes = total * 2 / 3;
  {
    Retention ret(o);
    ASSERT_TRUE(ret.CompactOnce().ok());
    EXPECT_TRUE(alerts.empty());
    Seen s = ReadLog(head);
    ASSERT_FALSE(s.notes.empty());
    EXPECT_EQ(s.notes.front().first_step, 0u) << "the oldest segment first";
    EXPECT_LT(s.notes.back().last_step, 290u) << "not all of it: it fits before";
  }
  // Far too little room: everything closed is thinned, then one alert.
  o.max_disk_bytes = 1000;
  Retention ret(o);
  ASSERT_TRUE(ret.CompactOnce().ok());
  ASSERT_TRUE(ret.CompactOnce().ok());
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].rfind("max_disk: ", 0), 0u) << alerts[0];
  EXPECT_NE(alerts[0].find("every closed segment is thinned already"), std::string::npos)
      << alerts[0];
}

TEST(Retention, AFullDiskLeavesTheSegmentWholeAndIsAnAlert) {
  testing::TempDir dir;
  const std::string head = WriteRun(dir.path(), 600);
  const Seen before = ReadLog(head);
  std::vector<std::string> alerts;
  RetentionOptions o = ThinningOptions(dir.path());
  o.on_alert = [&](const std::string& metric, const std::string&) { alerts.push_back(metric); };
  Retention ret(o);
  {
    testing::FileSizeLimit full(1000);  // no ".thin" file can be written whole
    EXPECT_FALSE(ret.CompactOnce().ok());
  }
  ASSERT_FALSE(alerts.empty());
  EXPECT_EQ(alerts[0], "compaction_failed");
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_NE(e.path().extension(), ".thin") << "a partial file left: " << e.path();
  const Seen after = ReadLog(head);
  EXPECT_EQ(after.stats, before.stats);
  EXPECT_EQ(after.messages, before.messages);
  // Room again: the next pass thins.
  ASSERT_TRUE(ret.CompactOnce().ok());
  EXPECT_GT(ret.counters().segments_thinned, 0u);
}

TEST(Retention, ALeftoverOfAKilledCompactionIsRemovedAndTheSegmentReadsWhole) {
  testing::TempDir dir;
  const std::string head = WriteRun(dir.path(), 100);
  const std::string thin = runlog::SegmentPathFor(head, 1) + ".thin";
  {
    std::ofstream f(thin, std::ios::binary);
    f << "half a segment";
  }
  const Seen before = ReadLog(head);
  RetentionOptions o;
  o.data_dir = dir.path();
  o.retain_steps = 1000;  // nothing out of the window
  Retention ret(o);
  ASSERT_TRUE(ret.CompactOnce().ok());
  EXPECT_FALSE(fs::exists(thin));
  EXPECT_EQ(ReadLog(head).messages, before.messages);
}

}  // namespace
}  // namespace lockstep::collector
