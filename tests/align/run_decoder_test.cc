// RunDecoder's step-closing rules (run_decoder.h), fed the message order the real agent
// produces at Monitor.step(): the step's records (some shipped earlier by batch size or
// linger), its StepScalars, then the batch that was still pending, as the next message.
#include "align/run_decoder.h"

#include <gtest/gtest.h>

#include <vector>

#include "../detect/stream_builder.h"

namespace lockstep::collector {
namespace {

using lockstep::testing::AsEnvelope;
using lockstep::testing::FakeScalars;
using lockstep::testing::FakeStat;
using lockstep::testing::FakeTensor;
using lockstep::testing::StreamBuilder;

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kIdle = 2000 * kMs;

struct Fixture {
  NameCanonicalizer canon;
  NameTable names;
  std::vector<std::pair<uint64_t, size_t>> closed;  // (step, rows)
  RunDecoder dec{"r", &canon, &names, kIdle,
                 [this](uint32_t, StepPtr s) { closed.emplace_back(s->step, s->rows.size()); }};
  StreamBuilder sb{"r", "exp", wire::Role::Candidate};
  int64_t now = 1000 * kMs;

  Fixture() {
    Feed(sb.Hello());
    Feed(sb.Directory({{"a"}, {"b"}, {"c"}}));
  }
  void Feed(const std::vector<uint8_t>& m) { dec.Consume(AsEnvelope(m), now); }
  void Stats(uint64_t step, std::vector<uint32_t> ids) {
    std::vector<FakeStat> v;
    for (uint32_t id : ids) {
      auto s = FakeStat::Vec(id, {1.0, 2.0});
      s.order = id;
      v.push_back(s);
    }
    Feed(sb.Stats(step, v));
  }
  void Scalars(uint64_t step) { Feed(sb.Scalars(step, FakeScalars{})); }
  bool IsClosed(uint64_t step) const {
    for (auto& c : closed) {
      if (c.first == step) return true;
    }
    return false;
  }
};

TEST(RunDecoder, BatchAfterScalarsClosesTheStepAtOnce) {
  Fixture f;
  f.Stats(0, {0});     // shipped by linger
  f.Scalars(0);
  EXPECT_FALSE(f.IsClosed(0));  // the pending batch is still to come
  f.Stats(0, {1, 2});  // the batch EndStep shipped
  ASSERT_TRUE(f.IsClosed(0));
  EXPECT_EQ(f.closed[0].second, 3u);  // complete: nothing is late
  EXPECT_EQ(f.dec.counters().late_records, 0u);
  EXPECT_EQ(f.dec.counters().closed_after_scalars, 1u);
}

TEST(RunDecoder, AllRecordsPendingAtScalarsStillCloseWithTheirBatch) {
  Fixture f;
  f.Scalars(0);  // the whole step was in the pending batch
  f.Stats(0, {0, 1, 2});
  ASSERT_TRUE(f.IsClosed(0));
  EXPECT_EQ(f.closed[0].second, 3u);
}

TEST(RunDecoder, SilenceAfterScalarsClosesWithinTheSettleTime) {
  Fixture f;
  f.Stats(0, {0, 1, 2});  // everything shipped before the scalars: nothing follows
  f.Scalars(0);
  f.dec.Tick(f.now + RunDecoder::kDefaultSettleNs - 1);
  EXPECT_FALSE(f.IsClosed(0));
  f.dec.Tick(f.now + RunDecoder::kDefaultSettleNs);
  ASSERT_TRUE(f.IsClosed(0));  // not after 2 s of silence
  EXPECT_EQ(f.dec.counters().closed_by_settle, 1u);
}

TEST(RunDecoder, WithoutScalarsOnlyTheIdleTimeoutClosesAPausedStep) {
  Fixture f;
  f.Stats(0, {0, 1, 2});
  f.dec.Tick(f.now + 10 * RunDecoder::kDefaultSettleNs);
  EXPECT_FALSE(f.IsClosed(0));  // no scalars: step() has not been called yet
  f.dec.Tick(f.now + kIdle);
  EXPECT_TRUE(f.IsClosed(0));
}

TEST(RunDecoder, ScalarsLastAgentIsLearnedAndClosedAtTheScalars) {
  Fixture f;
  // An agent that ships every record before the scalars: steps 0 and 1 close when the
  // next step starts, which is the evidence; from step 2 on the scalars close the step.
  for (uint64_t s = 0; s < 4; ++s) {
    f.Stats(s, {0, 1, 2});
    f.Scalars(s);
    EXPECT_EQ(f.IsClosed(s), s >= 2) << s;
  }
  EXPECT_EQ(f.dec.counters().late_records, 0u);
}

TEST(RunDecoder, StatsAfterScalarsNeverLearnScalarsLast) {
  Fixture f;
  f.Scalars(0);
  f.Stats(0, {0, 1, 2});
  for (uint64_t s = 1; s < 5; ++s) {
    f.Stats(s, {0});
    f.Scalars(s);
    EXPECT_FALSE(f.IsClosed(s)) << s;  // the pending batch may still follow
    f.Stats(s, {1, 2});
    EXPECT_TRUE(f.IsClosed(s)) << s;
  }
  EXPECT_EQ(f.dec.counters().late_records, 0u);
}

TEST(RunDecoder, SecondBatchAfterScalarsSwitchesRuleThreeOff) {
  Fixture f;
  f.Scalars(0);
  f.Stats(0, {0});
  f.Stats(0, {1, 2});  // an agent that sends more than one batch after its scalars
  EXPECT_EQ(f.dec.counters().late_records, 2u);
  f.Scalars(1);
  f.Stats(1, {0});
  EXPECT_FALSE(f.IsClosed(1));  // now only the next step (or silence) closes it
  f.Stats(1, {1, 2});
  f.Stats(2, {0});
  ASSERT_TRUE(f.IsClosed(1));
  EXPECT_EQ(f.closed.back().second, 3u);
}

TEST(RunDecoder, LateBatchAfterASettleCloseDoublesTheSettleTime) {
  Fixture f;
  f.Stats(0, {0});
  f.Scalars(0);
  f.dec.Tick(f.now + RunDecoder::kDefaultSettleNs);
  ASSERT_TRUE(f.IsClosed(0));
  f.Stats(0, {1, 2});  // the batch came after all: late
  EXPECT_EQ(f.dec.counters().late_records, 2u);
  f.Stats(1, {0});
  f.Scalars(1);
  f.dec.Tick(f.now + RunDecoder::kDefaultSettleNs);
  EXPECT_FALSE(f.IsClosed(1));  // it waits twice as long now
  f.dec.Tick(f.now + 2 * RunDecoder::kDefaultSettleNs);
  EXPECT_TRUE(f.IsClosed(1));
}

TEST(RunDecoder, OfflineReplayNeverClosesOnTimers) {
  NameCanonicalizer canon;
  NameTable names;
  int closed = 0;
  RunDecoder dec("r", &canon, &names, 0, [&](uint32_t, StepPtr) { ++closed; });
  StreamBuilder sb("r", "exp", wire::Role::Candidate);
  dec.Consume(AsEnvelope(sb.Hello()), 0);
  dec.Consume(AsEnvelope(sb.Directory({{"a"}})), 0);
  auto st = FakeStat::Vec(0, {1.0});
  dec.Consume(AsEnvelope(sb.Stats(0, {st})), 0);
  dec.Consume(AsEnvelope(sb.Scalars(0, FakeScalars{})), 0);
  dec.Tick(INT64_MAX / 2);
  EXPECT_EQ(closed, 0);
  dec.CloseAll();
  EXPECT_EQ(closed, 1);
}

}  // namespace
}  // namespace lockstep::collector
