// The Aligner on its own, through its narrow interface (align/aligner.h): what an
// AlignedSink is handed, in what order, and how often — no detector involved.
#include "align/aligner.h"

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sstream>

#include "../detect/stream_builder.h"

namespace lockstep::collector {
namespace {

using lockstep::testing::AsEnvelope;
using lockstep::testing::FakeStat;
using lockstep::testing::FakeTensor;
using lockstep::testing::StreamBuilder;

struct Recorder : AlignedSink {
  std::vector<std::tuple<std::string, uint32_t, uint64_t>> run_steps;  // run, rank, step
  std::vector<std::tuple<size_t, uint32_t, uint64_t, uint64_t>> pair_steps;  // pair, rank, b step, c step
  std::vector<size_t> starts, ends;
  int goodbyes = 0;

  void OnRunActivity(const AlignedRun&, int64_t, bool goodbye) override { goodbyes += goodbye; }
  void OnRunTick(const AlignedRun&, int64_t) override {}
  void OnRunResume(const AlignedRun&, int64_t) override {}
  void OnRunRewind(const AlignedRun&, const Rewind&) override {}
  void OnRunStep(const AlignedRun& run, const StepData& s) override { run_steps.emplace_back(run.id, s.rank, s.step); }
  void OnPairStart(const AlignedPair& p) override { starts.push_back(p.index); }
  void OnPairStep(const AlignedPair& p, uint32_t rank, const StepData& b, const StepData& c) override {
    EXPECT_EQ(b.rank, rank);
    EXPECT_EQ(c.rank, rank);
    EXPECT_EQ(p.baseline->id, "base");
    pair_steps.emplace_back(p.index, rank, b.step, c.step);
  }
  void OnPairEnd(const AlignedPair& p) override { ends.push_back(p.index); }
};

std::vector<uint8_t> StepMsg(StreamBuilder& sb, uint64_t step) {
  auto s = FakeStat::Vec(0, {1.0, 2.0, 3.0, static_cast<double>(step)});
  return sb.Stats(step, {s});
}

// Two ranks; the candidate's rank 1 runs 5 steps ahead of everything else. Every
// (rank, step) is handed over once, per rank in step order, each closed step once.
TEST(Aligner, HandsEachMatchedRankStepOverOncePerRankInStepOrder) {
  NameTable names;
  Recorder rec;
  AlignerOptions opt;
  opt.idle_close_ns = 0;
  Aligner al(opt, &names, &rec);
  constexpr uint64_t kSteps = 12;
  std::vector<StreamBuilder> b, c;
  for (uint32_t r = 0; r < 2; ++r) {
    b.emplace_back("base", "exp", wire::Role::Baseline, r);
    c.emplace_back("cand", "exp", wire::Role::Candidate, r);
  }
  auto feed = [&](const std::vector<uint8_t>& m) { al.OnMessage(AsEnvelope(m), 1); };
  const std::vector<FakeTensor> model = {FakeTensor{"layer", wire::TensorKind::Act, wire::DType::F32, 0}};
  for (uint32_t r = 0; r < 2; ++r) {
    feed(b[r].Hello());
    feed(b[r].Directory(model));
    feed(c[r].Hello());
    feed(c[r].Directory(model));
  }
  for (uint64_t s = 0; s < 5; ++s) feed(StepMsg(c[1], s));
  for (uint64_t s = 0; s < kSteps; ++s) {
    feed(StepMsg(b[0], s));
    feed(StepMsg(b[1], s));
    feed(StepMsg(c[0], s));
    if (s + 5 < kSteps) feed(StepMsg(c[1], s + 5));
  }
  for (uint32_t r = 0; r < 2; ++r) {
    feed(b[r].Goodbye(kSteps - 1));
    feed(c[r].Goodbye(kSteps - 1));
  }
  al.Finish();

  EXPECT_EQ(rec.starts, std::vector<size_t>{0});
  EXPECT_EQ(rec.ends, std::vector<size_t>{0});
  EXPECT_EQ(rec.goodbyes, 4);
  std::map<uint32_t, int64_t> last;
  std::set<std::pair<uint32_t, uint64_t>> seen;
  for (const auto& [pair, rank, bs, cs] : rec.pair_steps) {
    EXPECT_EQ(bs, cs);
    EXPECT_GT(static_cast<int64_t>(cs), last.count(rank) ? last[rank] : -1) << "rank " << rank;
    last[rank] = static_cast<int64_t>(cs);
    EXPECT_TRUE(seen.emplace(rank, cs).second);
  }
  EXPECT_EQ(rec.pair_steps.size(), 2 * kSteps);
  EXPECT_EQ(rec.run_steps.size(), 4 * kSteps);  // each closed step of each (run, rank) once
  const auto pairs = al.pairs();
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_EQ(pairs[0]->steps_matched, 2 * kSteps);
  EXPECT_EQ(pairs[0]->ranks, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(pairs[0]->only_baseline + pairs[0]->only_candidate + pairs[0]->evicted, 0u);
  EXPECT_EQ(al.counters().buffered_steps, 0u);
}

// A solo run's steps go to the per-run side only; it is never paired.
TEST(Aligner, SoloRunIsNeverPaired) {
  NameTable names;
  Recorder rec;
  AlignerOptions opt;
  opt.idle_close_ns = 0;
  Aligner al(opt, &names, &rec);
  StreamBuilder s("solo", "exp", wire::Role::Solo);
  al.OnMessage(AsEnvelope(s.Hello()), 1);
  al.OnMessage(AsEnvelope(s.Directory({FakeTensor{"layer", wire::TensorKind::Act, wire::DType::F32, 0}})), 1);
  for (uint64_t i = 0; i < 3; ++i) al.OnMessage(AsEnvelope(StepMsg(s, i)), 1);
  al.Finish();
  EXPECT_EQ(rec.run_steps.size(), 3u);
  EXPECT_TRUE(rec.starts.empty());
  EXPECT_TRUE(rec.pair_steps.empty());
  EXPECT_EQ(al.counters().buffered_steps, 0u);
}

// The aligner's warnings, captured (restores the default logger when done).
struct CapturedLog {
  std::ostringstream text;
  std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  CapturedLog() {
    auto l = std::make_shared<spdlog::logger>("captured", std::make_shared<spdlog::sinks::ostream_sink_mt>(text));
    l->set_level(spdlog::level::warn);
    l->set_pattern("%l %v");
    spdlog::set_default_logger(l);
  }
  ~CapturedLog() { spdlog::set_default_logger(previous); }
};

// Issue 30 item 6a: a candidate heard before its baseline (every `compare` named the
// candidate first) is not "not paired" once the baseline comes; one that never gets a
// baseline is, once, at the end.
TEST(Aligner, OnlyACandidateThatEndsUnpairedIsWarnedAbout) {
  CapturedLog log;
  {
    NameTable names;
    Recorder rec;
    AlignerOptions opt;
    opt.idle_close_ns = 0;
    Aligner al(opt, &names, &rec);
    StreamBuilder b("base", "exp", wire::Role::Baseline), c("cand", "exp", wire::Role::Candidate);
    auto feed = [&](const std::vector<uint8_t>& m) { al.OnMessage(AsEnvelope(m), 1); };
    feed(c.Hello());
    feed(c.Goodbye(0));  // ended before its baseline started: still paired when it comes
    feed(b.Hello());
    feed(b.Goodbye(0));
    al.Finish();
    EXPECT_EQ(rec.starts.size(), 1u);
  }
  EXPECT_EQ(log.text.str(), "");
  {
    NameTable names;
    Recorder rec;
    Aligner al(AlignerOptions{}, &names, &rec);
    StreamBuilder c("lonely", "exp", wire::Role::Candidate);
    al.OnMessage(AsEnvelope(c.Hello()), 1);
    al.Finish();
    al.Finish();
  }
  EXPECT_EQ(log.text.str(),
            "warning candidate lonely of experiment 'exp' is not paired: no baseline of that experiment came, and it "
            "was not compared (none of any experiment)\n");
}

}  // namespace
}  // namespace lockstep::collector
