// Issue 20 on the aligner and the detectors' state: per-rank rule state (the noise
// floor learned per rank in step order, so a live collector and `lockstep compare` on
// the same logs give the same alerts), ranks in the report, and a candidate that joins
// late (compared from the baseline's log). Messages go through the real LogWriter
// before the analyzer sees them, as in the collector; the offline side reads those
// logs back as `lockstep compare` does (AddBaselineLog + the candidate's log replayed).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "detect/analyzer.h"
#include "rules/pair_rules.h"
#include "lockstep/common/clock.h"
#include "runlog/log_format.h"
#include "runlog/log_reader.h"
#include "runlog/log_writer.h"
#include "service/offline_compare.h"
#include "stream_builder.h"

namespace lockstep::collector {
namespace {

const FakeClock kClock;  // unix 1.7e18 ns

using lockstep::testing::AsEnvelope;
using lockstep::testing::FakeStat;
using lockstep::testing::FakeTensor;
using lockstep::testing::StreamBuilder;

constexpr int kTensors = 3;
constexpr uint32_t kRanks = 4;

std::string TestDir() {
  std::string d = ::testing::TempDir() + "/align_ranks_test_" +
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

// Tensor `t` of `rank` at `step`, scaled by (1 + eps): every statistic moves by eps,
// so the drift score is about eps / 1e-3 (the fp32 tolerance).
std::vector<uint8_t> StepMsg(StreamBuilder& sb, uint32_t rank, uint64_t step,
                             const std::function<double(uint32_t, int, uint64_t)>& eps) {
  std::vector<FakeStat> stats;
  for (int t = 0; t < kTensors; ++t) {
    std::vector<double> v(48);
    const double e = eps ? eps(rank, t, step) : 0.0;
    for (size_t j = 0; j < v.size(); ++j) {
      v[j] = (std::sin(0.37 * t + 0.11 * step + 0.05 * j + 0.7 * rank) + 0.2 * t + 0.5) * (1 + e);
    }
    auto s = FakeStat::Vec(t, v);
    s.order = t;
    stats.push_back(s);
  }
  return sb.Stats(step, stats);
}

// The collector in miniature: each message is appended to <dir>/<run>.lslog and
// flushed, then the analyzer gets it.
struct Collector {
  std::string dir;
  std::vector<alerting::Alert> alerts;
  std::unique_ptr<Analyzer> an;
  std::map<std::string, std::unique_ptr<LogWriter>> logs;

  Collector(std::string d, bool read_back) : dir(std::move(d)) {
    AnalyzerOptions opt;
    if (read_back) opt.data_dir = dir;
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
    ASSERT_TRUE(w->Flush().ok());
    an->OnMessage(AsEnvelope(m), 1);
  }
  void Finish() {
    for (auto& [run, w] : logs) ASSERT_TRUE(w->Sync().ok());
    an->Finish();
  }
  size_t Count(const std::string& rule) const {
    size_t n = 0;
    for (const auto& a : alerts) n += a.rule == rule;
    return n;
  }
};

// What identifies an alert across a live and an offline run (ids and times differ,
// and compare names the experiment "compare").
using AlertKey = std::tuple<std::string, int, uint64_t, uint32_t, std::string, std::string>;
std::vector<AlertKey> Keys(const std::vector<alerting::Alert>& alerts) {
  std::vector<AlertKey> k;
  for (const auto& a : alerts) {
    k.emplace_back(a.rule, static_cast<int>(a.severity), a.step, a.rank, a.tensor, a.kind);
  }
  std::sort(k.begin(), k.end());
  return k;
}
std::string Dump(const std::vector<alerting::Alert>& alerts) {
  std::string s;
  for (const auto& a : alerts) s += a.rule + " step " + std::to_string(a.step) + " rank " + std::to_string(a.rank) + ": " + a.message + "\n";
  return s;
}

// `lockstep compare` on the two logs (service/offline_compare.h, compare's and
// report's pipeline): the baseline read at the candidate's pace, the candidate's log
// replayed in its recorded order.
OfflineComparison CompareOffline(const std::string& dir) {
  OfflineCompareSpec spec;
  spec.baseline_path = runlog::LogPathFor(dir, "base");
  spec.candidate_path = runlog::LogPathFor(dir, "cand");
  OfflineComparison cmp;
  std::string error;
  EXPECT_EQ(CompareRunLogs(std::move(spec), &cmp, &error), OfflineProblem::kNone) << error;
  return cmp;
}
std::vector<alerting::Alert> CompareLogs(const std::string& dir) { return CompareOffline(dir).alerts; }

constexpr uint64_t kSteps = 24;
constexpr uint64_t kBump = 15;       // rank 3 at 1.5x the tolerance for one step: within its own floor
constexpr uint64_t kDriftFrom = 18;  // rank 2, layers.1: a real drift

// Per-rank noise: rank r's normal divergence is about 0.06 x 2^r of the tolerance
// (rank 3: up to ~0.7, so its floor sets its threshold near 2); rank 3 scores 1.5 at
// kBump (under its own threshold, over rank 0's); rank 2's layers.1 drifts.
double Eps(uint32_t rank, int t, uint64_t step) {
  double e = 1e-3 * 0.06 * (1 << rank) * (1.0 + 0.5 * std::sin(1.3 * step + t + rank));
  if (rank == 3 && step == kBump) e = 1.5e-3;
  if (rank == 2 && t == 1 && step >= kDriftFrom) e = 0.02;
  return e;
}

// Live: the candidate's ranks step by step; the baseline's rank 0 with them, its ranks
// 1-3 only after the candidate has finished, so rank 0 is compared 24 steps before any
// other rank. `compare` replays the same logs step-major.
TEST(AlignRanks, LiveAndCompareGiveTheSameAlertsOnFourRanks) {
  const std::string dir = TestDir();
  Collector col(dir, false);
  std::vector<StreamBuilder> b, c;
  for (uint32_t r = 0; r < kRanks; ++r) {
    b.emplace_back("base", "exp", wire::Role::Baseline, r);
    c.emplace_back("cand", "exp", wire::Role::Candidate, r);
  }
  for (uint32_t r = 0; r < kRanks; ++r) {
    col.Feed("base", b[r].Hello());
    col.Feed("base", b[r].Directory(Model()));
    col.Feed("cand", c[r].Hello());
    col.Feed("cand", c[r].Directory(Model()));
  }
  for (uint64_t s = 0; s < kSteps; ++s) {
    for (uint32_t r = 0; r < kRanks; ++r) col.Feed("cand", StepMsg(c[r], r, s, Eps));
    col.Feed("base", StepMsg(b[0], 0, s, nullptr));
  }
  for (uint32_t r = 0; r < kRanks; ++r) col.Feed("cand", c[r].Goodbye(kSteps - 1));
  col.Feed("base", b[0].Goodbye(kSteps - 1));
  for (uint32_t r = 1; r < kRanks; ++r) {
    for (uint64_t s = 0; s < kSteps; ++s) col.Feed("base", StepMsg(b[r], r, s, nullptr));
    col.Feed("base", b[r].Goodbye(kSteps - 1));
  }
  col.Finish();

  const auto offline = CompareLogs(dir);
  EXPECT_EQ(Keys(col.alerts), Keys(offline)) << "live:\n" << Dump(col.alerts) << "compare:\n" << Dump(offline);

  // What both say: rank 2's layers.1 from kDriftFrom, first; nothing on rank 3.
  ASSERT_EQ(col.Count("first_divergence"), 1u) << Dump(col.alerts);
  for (const auto& a : col.alerts) {
    EXPECT_EQ(a.rank, 2u) << Dump(col.alerts);
    EXPECT_EQ(a.tensor, "layers.1");
    EXPECT_EQ(a.step, kDriftFrom);
  }
  auto r = col.an->Reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].ranks, kRanks);
  EXPECT_EQ(r[0].steps_compared, kSteps * kRanks);
  ASSERT_EQ(r[0].tensors.size(), static_cast<size_t>(kTensors));
  EXPECT_EQ(r[0].tensors[1].rank, 2u);
  EXPECT_EQ(r[0].tensors[1].first_drift_step, static_cast<int64_t>(kDriftFrom));
  EXPECT_EQ(r[0].tensors[1].steps, kSteps * kRanks);
}

// A difference exactly constant on every rank (larger on higher ranks) is no trend:
// each rank's scores stay flat, whatever order the ranks interleave in.
TEST(AlignRanks, ConstantDifferencePerRankIsNoTrend) {
  const std::string dir = TestDir();
  Collector col(dir, false);
  std::vector<StreamBuilder> b, c;
  for (uint32_t r = 0; r < kRanks; ++r) {
    b.emplace_back("base", "exp", wire::Role::Baseline, r);
    c.emplace_back("cand", "exp", wire::Role::Candidate, r);
    col.Feed("base", b[r].Hello());
    col.Feed("base", b[r].Directory(Model()));
    col.Feed("cand", c[r].Hello());
    col.Feed("cand", c[r].Directory(Model()));
  }
  const double eps[kRanks] = {0.05e-3, 0.1e-3, 0.2e-3, 0.8e-3};
  auto constant = [&](uint32_t rank, int, uint64_t) { return eps[rank]; };
  for (uint64_t s = 0; s < kSteps; ++s) {
    for (uint32_t r = 0; r < kRanks; ++r) {
      col.Feed("base", StepMsg(b[r], r, s, nullptr));
      col.Feed("cand", StepMsg(c[r], r, s, constant));
    }
  }
  for (uint32_t r = 0; r < kRanks; ++r) {
    col.Feed("base", b[r].Goodbye(kSteps - 1));
    col.Feed("cand", c[r].Goodbye(kSteps - 1));
  }
  col.Finish();
  EXPECT_EQ(col.Count("trend"), 0u) << Dump(col.alerts);
  EXPECT_TRUE(col.alerts.empty()) << Dump(col.alerts);
  auto r = col.an->Reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].ranks, kRanks);
  for (const auto& t : r[0].tensors) {
    EXPECT_EQ(t.rank, 3u) << t.name;  // the largest difference
    EXPECT_EQ(t.status, "ok") << t.name;
  }
}

// Issue 20 item 2: two live processes claim candidate rank 0 (an older agent under
// mp.spawn with the Monitor made before init_process_group: every process says rank 0).
// Their messages interleave; the second one's data (drifting here) is set apart, not
// merged into rank 0's stream, and one `duplicate_rank` finding names both; the same
// from the logs.
TEST(AlignRanks, TwoLiveSessionsOnOneRankAreAFindingAndKeptApart) {
  const std::string dir = TestDir();
  Collector col(dir, false);
  StreamBuilder b("base", "exp", wire::Role::Baseline, 0), c1("cand", "exp", wire::Role::Candidate, 0),
      c2("cand", "exp", wire::Role::Candidate, 0);
  b.session = 7;
  c1.session = 0x101;
  c2.session = 0x202;
  auto drift = [](uint32_t, int, uint64_t) { return 0.05; };
  col.Feed("base", b.Hello());
  col.Feed("base", b.Directory(Model()));
  col.Feed("cand", c1.Hello());
  col.Feed("cand", c2.Hello());
  col.Feed("cand", c1.Directory(Model()));
  col.Feed("cand", c2.Directory(Model()));
  for (uint64_t s = 0; s < 8; ++s) {
    col.Feed("base", StepMsg(b, 0, s, nullptr));
    col.Feed("cand", StepMsg(c1, 0, s, nullptr));
    col.Feed("cand", StepMsg(c2, 0, s, drift));
  }
  col.Feed("base", b.Goodbye(7));
  col.Feed("cand", c1.Goodbye(7));
  col.Feed("cand", c2.Goodbye(7));
  col.Finish();
  ASSERT_EQ(col.Count("duplicate_rank"), 1u) << Dump(col.alerts);
  EXPECT_EQ(col.alerts.size(), 1u) << Dump(col.alerts);  // no drift: c2's rows were not compared
  const auto& a = col.alerts[0];
  EXPECT_EQ(a.rank, 0u);
  EXPECT_NE(a.message.find("run cand rank 0 is claimed by two live processes"), std::string::npos) << a.message;
  EXPECT_NE(a.message.find("session 0000000000000101"), std::string::npos) << a.message;
  EXPECT_NE(a.message.find("session 0000000000000202"), std::string::npos) << a.message;
  EXPECT_NE(a.message.find("init_process_group"), std::string::npos) << a.message;
  auto r = col.an->Reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].steps_compared, 8u);
  EXPECT_FALSE(r[0].diverged);

  const auto offline = CompareLogs(dir);
  EXPECT_EQ(Keys(col.alerts), Keys(offline)) << "live:\n" << Dump(col.alerts) << "compare:\n" << Dump(offline);
}

// A restart (the old session said Goodbye, or never spoke again) is no duplicate.
TEST(AlignRanks, ASessionReplacedAndSilentIsNoDuplicate) {
  Collector col(TestDir(), false);
  StreamBuilder b("base", "exp", wire::Role::Baseline, 0), c1("cand", "exp", wire::Role::Candidate, 0),
      c2("cand", "exp", wire::Role::Candidate, 0);
  c1.session = 1;
  c2.session = 2;
  col.Feed("base", b.Hello());
  col.Feed("base", b.Directory(Model()));
  col.Feed("cand", c1.Hello());
  col.Feed("cand", c1.Directory(Model()));
  for (uint64_t s = 0; s < 4; ++s) {
    col.Feed("base", StepMsg(b, 0, s, nullptr));
    col.Feed("cand", StepMsg(c1, 0, s, nullptr));
  }
  col.Feed("cand", c2.Hello());  // c1 crashed: no Goodbye; c2 resumes at step 4
  col.Feed("cand", c2.Directory(Model()));
  for (uint64_t s = 4; s < 8; ++s) {
    col.Feed("base", StepMsg(b, 0, s, nullptr));
    col.Feed("cand", StepMsg(c2, 0, s, nullptr));
  }
  col.Feed("base", b.Goodbye(7));
  col.Feed("cand", c1.Goodbye(3));  // a late farewell of the old session: no clash either
  col.Feed("cand", c2.Goodbye(7));
  col.Finish();
  EXPECT_TRUE(col.alerts.empty()) << Dump(col.alerts);
  auto r = col.an->Reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].steps_compared, 8u);
}

// Issue 20 item 2 (first_divergence across ranks): ranks part at the same step; the
// live collector gets them highest rank first (rank 3's comparison arrives before
// rank 0's), `compare` in the logs' order. One first_divergence, held until every
// rank was compared at that step, naming the ranks, the same in both.
void SameStepOnRanks(const std::vector<uint32_t>& parting, const std::string& where) {
  const std::string dir = TestDir();
  Collector col(dir, false);
  std::vector<StreamBuilder> b, c;
  for (uint32_t r = 0; r < kRanks; ++r) {
    b.emplace_back("base", "exp", wire::Role::Baseline, r);
    c.emplace_back("cand", "exp", wire::Role::Candidate, r);
  }
  for (uint32_t r = 0; r < kRanks; ++r) {
    col.Feed("base", b[r].Hello());
    col.Feed("base", b[r].Directory(Model()));
    col.Feed("cand", c[r].Hello());
    col.Feed("cand", c[r].Directory(Model()));
  }
  constexpr uint64_t kAt = 10;
  auto eps = [&](uint32_t rank, int t, uint64_t step) {
    const bool parts = std::find(parting.begin(), parting.end(), rank) != parting.end();
    // The ranks not parting at kAt part two steps later, in another tensor.
    if (step >= kAt && parts) return 0.02;
    if (step >= kAt + 2 && t == 2) return 0.02;
    return 0.0;
  };
  for (uint64_t s = 0; s < 16; ++s) {
    for (uint32_t r = kRanks; r-- > 0;) {
      col.Feed("cand", StepMsg(c[r], r, s, eps));
      col.Feed("base", StepMsg(b[r], r, s, nullptr));
    }
  }
  for (uint32_t r = 0; r < kRanks; ++r) {
    col.Feed("base", b[r].Goodbye(15));
    col.Feed("cand", c[r].Goodbye(15));
  }
  col.Finish();
  const auto offline = CompareLogs(dir);
  EXPECT_EQ(Keys(col.alerts), Keys(offline)) << "live:\n" << Dump(col.alerts) << "compare:\n" << Dump(offline);
  ASSERT_EQ(col.Count("first_divergence"), 1u) << Dump(col.alerts);
  for (const auto& alerts : {col.alerts, offline}) {
    for (const auto& a : alerts) {
      if (a.rule != "first_divergence") continue;
      EXPECT_EQ(a.step, kAt);
      EXPECT_EQ(a.rank, parting.front());  // the lowest of the ranks that part
      EXPECT_EQ(a.tensor, "layers.0");
      EXPECT_NE(a.message.find("at step 10 on " + where + ":"), std::string::npos) << a.message;
    }
  }
}

TEST(AlignRanks, AllRanksPartingAtOneStepAreOneFirstDivergence) { SameStepOnRanks({0, 1, 2, 3}, "all 4 ranks"); }
TEST(AlignRanks, TwoOfFourRanksPartingAtOneStepAreNamed) { SameStepOnRanks({0, 2}, "ranks 0, 2 of 4"); }

// Issue 29: the rank a first divergence names must not follow arrival order. Rank 3
// connects first and sends every step before ranks 2, 1, 0 connect; all four part at
// the same step. With the Hellos' world_size (4) the decision waits for all four ranks
// and names the lowest, live and in `compare`; an agent that says world_size 1 (or
// nothing) keeps the old rule: the ranks seen so far.
void RankThreeFirst(uint32_t world_size, uint32_t expected_rank) {
  const std::string dir = TestDir();
  Collector col(dir, false);
  auto eps = [](uint32_t, int t, uint64_t step) { return step >= 2 && t == 1 ? 0.02 : 0.0; };
  for (uint32_t r = kRanks; r-- > 0;) {
    StreamBuilder b("base", "exp", wire::Role::Baseline, r), c("cand", "exp", wire::Role::Candidate, r);
    col.Feed("base", b.Hello(world_size));
    col.Feed("base", b.Directory(Model()));
    col.Feed("cand", c.Hello(world_size));
    col.Feed("cand", c.Directory(Model()));
    for (uint64_t s = 0; s < 6; ++s) {
      col.Feed("cand", StepMsg(c, r, s, eps));
      col.Feed("base", StepMsg(b, r, s, nullptr));
    }
    col.Feed("base", b.Goodbye(5));
    col.Feed("cand", c.Goodbye(5));
  }
  col.Finish();
  const OfflineComparison cmp = CompareOffline(dir);
  const auto& offline = cmp.alerts;
  EXPECT_EQ(Keys(col.alerts), Keys(offline)) << "live:\n" << Dump(col.alerts) << "compare:\n" << Dump(offline);
  ASSERT_EQ(col.Count("first_divergence"), 1u) << Dump(col.alerts);
  for (const auto& alerts : {col.alerts, offline}) {
    for (const auto& a : alerts) {
      if (a.rule != "first_divergence") continue;
      EXPECT_EQ(a.step, 2u);
      EXPECT_EQ(a.rank, expected_rank) << a.message;
      EXPECT_EQ(a.tensor, "layers.1");
    }
  }
  // The verdict: compare's and report's (one pipeline) against the live page's, which
  // judges the live Analyzer's report with what it knows of the logs (their run ids).
  auto reports = col.an->Reports();
  ASSERT_EQ(reports.size(), 1u);
  LogScan base, cand;
  base.run_id = reports.front().baseline;
  cand.run_id = reports.front().candidate;
  bool critical = false;
  for (const auto& a : col.alerts) critical |= a.severity == alerting::Severity::kCritical;
  const GateVerdict live = JudgeCompare(reports.front(), base, cand, col.alerts, critical);
  ASSERT_FALSE(live.lines.empty());
  ASSERT_FALSE(cmp.verdict.lines.empty());
  EXPECT_EQ(live.lines.front(), cmp.verdict.lines.front());
  if (world_size == kRanks) {
    EXPECT_NE(cmp.verdict.lines.front().find("on all 4 ranks"), std::string::npos) << cmp.verdict.lines.front();
  }
}

TEST(AlignRanks, TheFirstDivergenceNamesTheLowestRankWhateverArrivesFirst) { RankThreeFirst(kRanks, 0); }
TEST(AlignRanks, WithoutAWorldSizeTheRanksSeenSoFarDecide) { RankThreeFirst(1, kRanks - 1); }

// A rank that goes silent (no Goodbye) before the onset step holds first_divergence at
// most FirstDivergenceDetector::kWaitNs of the analyzer's clock, then it names the
// ranks that parted.
TEST(AlignRanks, ASilentRankHoldsTheFirstDivergenceOnlyBriefly) {
  int64_t now = 1'700'000'000'000'000'000;
  std::vector<alerting::Alert> alerts;
  AnalyzerOptions opt;
  opt.idle_close_ns = 0;
  FakeClock clock(now);
  Analyzer an(std::move(opt), [&](alerting::Alert a) { alerts.push_back(std::move(a)); }, &clock);
  std::vector<StreamBuilder> b, c;
  for (uint32_t r = 0; r < kRanks; ++r) {
    b.emplace_back("base", "exp", wire::Role::Baseline, r);
    c.emplace_back("cand", "exp", wire::Role::Candidate, r);
  }
  auto feed = [&](const std::vector<uint8_t>& m) { an.OnMessage(AsEnvelope(m), now); };
  for (uint32_t r = 0; r < kRanks; ++r) {
    feed(b[r].Hello());
    feed(b[r].Directory(Model()));
    feed(c[r].Hello());
    feed(c[r].Directory(Model()));
  }
  auto eps = [](uint32_t, int, uint64_t s) { return s >= 5 ? 0.02 : 0.0; };
  for (uint64_t s = 0; s < 9; ++s) {
    for (uint32_t r = 0; r < kRanks; ++r) {
      if (r == 3 && s > 3) continue;  // rank 3 falls silent after step 3
      feed(StepMsg(c[r], r, s, eps));
      feed(StepMsg(b[r], r, s, nullptr));
    }
  }
  auto firsts = [&] {
    size_t n = 0;
    for (const auto& a : alerts) n += a.rule == "first_divergence";
    return n;
  };
  EXPECT_EQ(firsts(), 0u) << Dump(alerts);  // rank 3 has not been compared at step 5
  now += FirstDivergenceDetector::kWaitNs / 2;
  clock.SetUnixNs(now);
  an.Tick(now);
  EXPECT_EQ(firsts(), 0u) << Dump(alerts);
  now += FirstDivergenceDetector::kWaitNs / 2;
  clock.SetUnixNs(now);
  an.Tick(now);
  ASSERT_EQ(firsts(), 1u) << Dump(alerts);
  const auto& a = *std::find_if(alerts.begin(), alerts.end(), [](const auto& x) { return x.rule == "first_divergence"; });
  EXPECT_EQ(a.step, 5u);
  EXPECT_EQ(a.rank, 0u);
  EXPECT_NE(a.message.find("at step 5 on ranks 0, 1, 2 of 4:"), std::string::npos) << a.message;
  an.Finish();
  EXPECT_EQ(firsts(), 1u);
}

// Issue 20 item 3: candidate c2 connects after c1 has passed the baseline's first
// steps (so the baseline's memory let them go); c2 is compared from the baseline's log.
void LateJoiner(Collector& col) {
  StreamBuilder b("base", "exp", wire::Role::Baseline), c1("c1", "exp", wire::Role::Candidate),
      c2("c2", "exp", wire::Role::Candidate);
  auto drift = [](uint32_t, int t, uint64_t s) { return t == 2 && s >= 3 ? 0.05 : 0.0; };
  col.Feed("base", b.Hello());
  col.Feed("base", b.Directory(Model()));
  col.Feed("c1", c1.Hello());
  col.Feed("c1", c1.Directory(Model()));
  for (uint64_t s = 0; s < 10; ++s) {
    col.Feed("base", StepMsg(b, 0, s, nullptr));
    col.Feed("c1", StepMsg(c1, 0, s, nullptr));
  }
  col.Feed("c2", c2.Hello());
  col.Feed("c2", c2.Directory(Model()));
  for (uint64_t s = 0; s < 10; ++s) col.Feed("c2", StepMsg(c2, 0, s, drift));
  for (uint64_t s = 10; s < 12; ++s) {
    col.Feed("base", StepMsg(b, 0, s, nullptr));
    col.Feed("c1", StepMsg(c1, 0, s, nullptr));
    col.Feed("c2", StepMsg(c2, 0, s, drift));
  }
  col.Feed("base", b.Goodbye(11));
  col.Feed("c1", c1.Goodbye(11));
  col.Feed("c2", c2.Goodbye(11));
  col.Finish();
}

TEST(AlignLateJoin, LateCandidateIsComparedFromTheBaselinesLog) {
  Collector col(TestDir(), true);
  LateJoiner(col);
  const auto cnt = col.an->counters();
  EXPECT_EQ(cnt.late_joins_read_back, 1u);
  EXPECT_EQ(cnt.late_joins_uncompared, 0u);
  EXPECT_EQ(cnt.buffered_steps, 0u);
  auto r = col.an->Reports();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].candidate, "c1");
  EXPECT_EQ(r[0].steps_compared, 12u);
  EXPECT_FALSE(r[0].diverged);
  EXPECT_EQ(r[1].candidate, "c2");
  EXPECT_EQ(r[1].steps_compared, 12u);
  EXPECT_EQ(r[1].steps_only_candidate, 0u);
  EXPECT_EQ(r[1].steps_only_baseline, 0u);
  ASSERT_TRUE(r[1].diverged) << Dump(col.alerts);
  EXPECT_EQ(r[1].first_divergence.step, 3u);
  EXPECT_EQ(r[1].first_divergence.tensor, "layers.2");
  EXPECT_EQ(r[1].first_divergence.runs, (std::vector<std::string>{"base", "c2"}));
}

TEST(AlignLateJoin, WithoutALogTheLateCandidateIsCountedAndWarnedNotSilent) {
  Collector col(TestDir(), false);
  LateJoiner(col);
  const auto cnt = col.an->counters();
  EXPECT_EQ(cnt.late_joins_read_back, 0u);
  EXPECT_EQ(cnt.late_joins_uncompared, 1u);
  auto r = col.an->Reports();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].steps_compared, 12u);
  // The steps the baseline had let go are candidate-only, counted.
  EXPECT_EQ(r[1].steps_compared + r[1].steps_only_candidate, 12u);
  EXPECT_GE(r[1].steps_only_candidate, 9u);
}

// The same with a recorded baseline (`lockstep collect --baseline PATH`): c1 has read
// it past its first steps when c2 connects; c2 gets its own reader of the file.
TEST(AlignLateJoin, LateCandidateOfARecordedBaselineReadsTheFileItself) {
  const std::string dir = TestDir();
  {
    Collector rec(dir, false);  // records the baseline's log
    StreamBuilder b("base", "exp", wire::Role::Baseline);
    rec.Feed("base", b.Hello());
    rec.Feed("base", b.Directory(Model()));
    for (uint64_t s = 0; s < 12; ++s) rec.Feed("base", StepMsg(b, 0, s, nullptr));
    rec.Feed("base", b.Goodbye(11));
    for (auto& [run, w] : rec.logs) ASSERT_TRUE(w->Sync().ok());
  }
  std::vector<alerting::Alert> alerts;
  AnalyzerOptions opt;
  opt.idle_close_ns = 0;
  Analyzer an(std::move(opt), [&](alerting::Alert a) { alerts.push_back(std::move(a)); },
              &kClock);
  ASSERT_TRUE(an.AddBaselineLog(runlog::LogPathFor(dir, "base")).ok());
  StreamBuilder c1("c1", "exp", wire::Role::Candidate), c2("c2", "exp", wire::Role::Candidate);
  auto feed = [&](const std::vector<uint8_t>& m) { an.OnMessage(AsEnvelope(m), 1); };
  auto drift = [](uint32_t, int t, uint64_t s) { return t == 0 && s >= 5 ? 0.05 : 0.0; };
  feed(c1.Hello());
  feed(c1.Directory(Model()));
  for (uint64_t s = 0; s < 8; ++s) feed(StepMsg(c1, 0, s, nullptr));
  feed(c2.Hello());
  feed(c2.Directory(Model()));
  for (uint64_t s = 0; s < 12; ++s) feed(StepMsg(c2, 0, s, drift));
  for (uint64_t s = 8; s < 12; ++s) feed(StepMsg(c1, 0, s, nullptr));
  feed(c1.Goodbye(11));
  feed(c2.Goodbye(11));
  an.Finish();
  EXPECT_EQ(an.counters().late_joins_read_back, 1u);
  EXPECT_EQ(an.counters().buffered_steps, 0u);
  auto r = an.Reports();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].steps_compared, 12u);
  EXPECT_FALSE(r[0].diverged) << Dump(alerts);
  EXPECT_EQ(r[1].steps_compared, 12u);
  EXPECT_EQ(r[1].steps_only_candidate, 0u);
  ASSERT_TRUE(r[1].diverged) << Dump(alerts);
  EXPECT_EQ(r[1].first_divergence.step, 5u);
  EXPECT_EQ(r[1].first_divergence.tensor, "layers.0");
}

}  // namespace
}  // namespace lockstep::collector
