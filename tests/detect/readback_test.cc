// A live run far ahead of its partner is read back from its own run log (issue 4,
// docs/rules.md "Memory bound"): the messages go through the real LogWriter before the
// analyzer sees them, as in the collector.
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "detect/analyzer.h"
#include "lockstep/common/clock.h"
#include "runlog/log_format.h"
#include "runlog/log_writer.h"
#include "stream_builder.h"

namespace lockstep::collector {
namespace {

const FakeClock kClock;  // unix 1.7e18 ns

using lockstep::testing::AsEnvelope;
using lockstep::testing::FakeScalars;
using lockstep::testing::FakeStat;
using lockstep::testing::FakeTensor;
using lockstep::testing::StreamBuilder;

constexpr int kTensors = 4;
constexpr size_t kWindow = 8;

std::string TestDir() {
  std::string d = ::testing::TempDir() + "/readback_test_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::string cmd = "rm -rf '" + d + "' && mkdir -p '" + d + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return d;
}

std::vector<FakeTensor> Model() {
  std::vector<FakeTensor> v;
  for (int i = 0; i < kTensors; ++i) {
    v.push_back(FakeTensor{"layers." + std::to_string(i), wire::TensorKind::Act, wire::DType::F32,
                           static_cast<uint32_t>(i)});
  }
  return v;
}

// The collector in miniature: each message is appended to <dir>/<run>.lslog, the log
// is flushed every `flush_every` messages (the collector flushes when its socket runs
// dry, so the analyzer may see a message before the file has it), then the analyzer
// gets it. Tracks the most steps the analyzer ever held.
struct Collector {
  std::string dir;
  size_t flush_every = 1;
  std::vector<alerting::Alert> alerts;
  std::unique_ptr<Analyzer> an;
  std::map<std::string, std::unique_ptr<LogWriter>> logs;
  std::map<std::string, size_t> pending;
  uint64_t max_buffered = 0;

  Collector(std::string d, size_t window, size_t flush) : dir(std::move(d)), flush_every(flush) {
    AnalyzerOptions opt;
    opt.max_buffered_steps = window;
    opt.data_dir = dir;
    opt.idle_close_ns = 0;
    an = std::make_unique<Analyzer>(std::move(opt), [this](alerting::Alert a) { alerts.push_back(std::move(a)); },
                                    &kClock);
  }
  void Feed(const std::string& run, const std::vector<uint8_t>& m) {
    auto& w = logs[run];
    if (!w) {
      auto opened = LogWriter::Open(runlog::LogPathFor(dir, run), false);
      ASSERT_TRUE(opened.ok()) << opened.status().ToString();
      w = std::move(*opened);
    }
    ASSERT_TRUE(w->Append(m.data(), static_cast<uint32_t>(m.size()), 1).ok());
    if (++pending[run] % flush_every == 0) ASSERT_TRUE(w->Flush().ok());
    an->OnMessage(AsEnvelope(m), 1);
    max_buffered = std::max(max_buffered, an->counters().buffered_steps);
  }
  void Finish() {
    for (auto& [run, w] : logs) ASSERT_TRUE(w->Sync().ok());  // as the collector's shutdown
    an->Finish();
  }
  size_t Count(const std::string& rule) const {
    size_t n = 0;
    for (const auto& a : alerts) n += a.rule == rule;
    return n;
  }
  const alerting::Alert* First(const std::string& rule) const {
    for (const auto& a : alerts) {
      if (a.rule == rule) return &a;
    }
    return nullptr;
  }
};

// One step of one run: statistics then scalars. `shift` moves tensor 2 (a drift);
// `nan` puts a NaN into tensor 3.
void Step(Collector& col, StreamBuilder& sb, const std::string& run, uint64_t step, double shift, bool nan) {
  std::vector<FakeStat> stats;
  for (int i = 0; i < kTensors; ++i) {
    std::vector<double> v(48);
    for (size_t j = 0; j < v.size(); ++j) v[j] = std::sin(0.37 * i + 0.11 * step + 0.05 * j) + 0.1 * i;
    if (i == 2) for (double& x : v) x += shift;
    if (i == 3 && nan) v[5] = NAN;
    auto s = FakeStat::Vec(i, v);
    s.order = i;
    stats.push_back(s);
  }
  col.Feed(run, sb.Stats(step, stats));
  FakeScalars sc;
  sc.loss = 2.0 - 0.001 * step;
  col.Feed(run, sb.Scalars(step, sc));
}

constexpr uint64_t kSteps = 600;
constexpr uint64_t kAhead = 500;
constexpr uint64_t kDriftFrom = 420;
constexpr uint64_t kNanAt = 450;

// The candidate runs 500 steps before the baseline starts, then keeps 500 ahead.
void CandidateFarAhead(Collector& col) {
  StreamBuilder b("base", "exp", wire::Role::Baseline), c("cand", "exp", wire::Role::Candidate);
  col.Feed("cand", c.Hello());
  col.Feed("cand", c.Directory(Model()));
  auto cand_step = [&](uint64_t s) { Step(col, c, "cand", s, s >= kDriftFrom ? 0.5 : 0.0, s == kNanAt); };
  for (uint64_t s = 0; s < kAhead; ++s) cand_step(s);
  col.Feed("base", b.Hello());
  col.Feed("base", b.Directory(Model()));
  for (uint64_t s = 0; s < kSteps; ++s) {
    Step(col, b, "base", s, 0.0, false);
    if (s + kAhead < kSteps) cand_step(s + kAhead);
    if (s + kAhead == kSteps) col.Feed("cand", c.Goodbye(kSteps - 1));
  }
  col.Feed("base", b.Goodbye(kSteps - 1));
  col.Finish();
}

void ExpectEverythingCompared(const Collector& col) {
  auto cnt = col.an->counters();
  EXPECT_EQ(cnt.steps_evicted, 0u);
  EXPECT_EQ(cnt.runs_read_back, 1u);
  EXPECT_LE(col.max_buffered, kWindow);
  EXPECT_LE(cnt.peak_buffered_steps, kWindow);
  EXPECT_EQ(cnt.buffered_steps, 0u);
  EXPECT_EQ(cnt.steps_closed, 2 * kSteps);  // each live step once; the read-back copy is not a new step
  auto r = col.an->Reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].steps_compared, kSteps);
  EXPECT_EQ(r[0].steps_evicted, 0u);
  EXPECT_EQ(r[0].steps_only_baseline, 0u);
  EXPECT_EQ(r[0].steps_only_candidate, 0u);
  ASSERT_TRUE(r[0].diverged);
  EXPECT_EQ(r[0].first_divergence.step, kDriftFrom);
  EXPECT_EQ(r[0].first_divergence.tensor, "layers.2");
  ASSERT_EQ(col.Count("first_divergence"), 1u);
  // The per-run rule saw step 450 once (live), not again from the log.
  size_t run_nonfinite = 0;
  for (const auto& a : col.alerts) {
    if (a.rule == "nonfinite" && a.runs == std::vector<std::string>{"cand"}) {
      ++run_nonfinite;
      EXPECT_EQ(a.step, kNanAt);
    }
  }
  EXPECT_EQ(run_nonfinite, 1u);
}

TEST(ReadBack, CandidateFarAheadIsComparedStepByStepFromItsLog) {
  Collector col(TestDir(), kWindow, 1);
  CandidateFarAhead(col);
  ExpectEverythingCompared(col);
}

TEST(ReadBack, LogNotYetFlushedIsRetriedNotTakenAsTheEnd) {
  Collector col(TestDir(), kWindow, 7);  // the file lags the analyzer by up to 6 messages
  CandidateFarAhead(col);
  ExpectEverythingCompared(col);
}

TEST(ReadBack, BaselineFarAheadIsReadBackAtTheCandidatesPace) {
  Collector col(TestDir(), kWindow, 1);
  StreamBuilder b("base", "exp", wire::Role::Baseline), c("cand", "exp", wire::Role::Candidate);
  col.Feed("base", b.Hello());
  col.Feed("base", b.Directory(Model()));
  col.Feed("cand", c.Hello());
  col.Feed("cand", c.Directory(Model()));
  for (uint64_t s = 0; s < 200; ++s) Step(col, b, "base", s, 0.0, false);
  col.Feed("base", b.Goodbye(199));
  for (uint64_t s = 0; s < 150; ++s) Step(col, c, "cand", s, s >= 120 ? 0.5 : 0.0, false);
  col.Feed("cand", c.Goodbye(149));
  col.Finish();
  auto cnt = col.an->counters();
  EXPECT_EQ(cnt.steps_evicted, 0u);
  EXPECT_EQ(cnt.runs_read_back, 1u);
  EXPECT_LE(col.max_buffered, kWindow);
  EXPECT_EQ(cnt.buffered_steps, 0u);
  auto r = col.an->Reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].steps_compared, 150u);
  EXPECT_EQ(r[0].steps_only_baseline, 50u);
  ASSERT_TRUE(r[0].diverged);
  EXPECT_EQ(r[0].first_divergence.step, 120u);
}

TEST(ReadBack, WithoutALogTheOldestStepsAreEvictedAndCounted) {
  Collector col(TestDir(), kWindow, 1);
  StreamBuilder c("cand", "exp", wire::Role::Candidate);
  col.Feed("cand", c.Hello());
  col.Feed("cand", c.Directory(Model()));
  col.logs.clear();
  ASSERT_EQ(std::system(("rm -f '" + runlog::LogPathFor(col.dir, "cand") + "'").c_str()), 0);
  // From here the analyzer alone: the run has no log to read back.
  for (uint64_t s = 0; s < 40; ++s) {
    std::vector<FakeStat> stats{FakeStat::Vec(0, std::vector<double>(8, 1.0 + s))};
    col.an->OnMessage(AsEnvelope(c.Stats(s, stats)), 1);
  }
  auto cnt = col.an->counters();
  EXPECT_EQ(cnt.runs_read_back, 0u);
  EXPECT_EQ(cnt.steps_evicted, 39u - kWindow);  // step 39 is still open
  EXPECT_LE(cnt.buffered_steps, kWindow);
}

}  // namespace
}  // namespace lockstep::collector
