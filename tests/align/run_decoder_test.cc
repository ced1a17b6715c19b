// RunDecoder's step-closing rules (run_decoder.h), fed the message orders agents
// produce at Monitor.step(): the step's records (some shipped earlier by batch size or
// linger) then its StepScalars; older agents sent the last batch after the scalars.
// Agents of schema minor 3 end each step with a StepEnd, which alone closes it (the
// StepEnd tests); the rules above are for agents and logs without it.
#include "align/run_decoder.h"

#include <gtest/gtest.h>

#include <vector>

#include "../detect/stream_builder.h"
#include "lockstep/common/wire.h"

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

// Found by fuzzing: one tiny directory entry with id 4,000,000 used to size the rank's
// directory at 4M entries (64 MiB). Ids are dense, so a sparse one is skipped and its
// rows count as unknown; the directory still grows chunk by chunk.
TEST(RunDecoder, ASparseTensorIdCannotInflateTheDirectory) {
  Fixture f;
  f.Feed(f.sb.Directory({{"far"}}, 4'000'000));
  EXPECT_EQ(f.dec.Meta(0, 4'000'000), nullptr);
  f.Feed(f.sb.Directory({{"d"}, {"e"}}, 3));  // the next chunk, in order
  ASSERT_NE(f.dec.Meta(0, 4), nullptr);
  std::vector<FakeStat> v = {FakeStat::Vec(4'000'000, {1.0})};
  f.Feed(f.sb.Stats(0, v));
  EXPECT_EQ(f.dec.counters().unknown_ids, 1u);
}

// The agent says on the wire that a record repeats the one before it (a container whose
// output is its last child's): the producer's name gets the repeat's name as an alias,
// found by order and statistics, through a chain of repeats.
TEST(RunDecoder, ARepeatRecordMakesItsNameAnAliasOfTheProducer) {
  Fixture f;
  f.Feed(f.sb.Directory({{"mlp.fc2"}, {"mlp"}, {"block"}}, 3));
  auto a = FakeStat::Vec(0, {1.0, 2.0});  // "a", order 0
  auto fc2 = FakeStat::Vec(3, {3.0, 4.0});
  fc2.order = 1;
  auto mlp = FakeStat::Vec(4, {3.0, 4.0});
  mlp.order = 2;
  mlp.flags = static_cast<uint8_t>(wire::StatFlags::kRepeat);
  auto block = FakeStat::Vec(5, {3.0, 4.0});
  block.order = 3;
  block.flags = static_cast<uint8_t>(wire::StatFlags::kRepeat);
  auto b = FakeStat::Vec(1, {3.0, 4.0});  // same values, not a repeat: no alias
  b.order = 4;
  f.Feed(f.sb.Stats(0, {a, fc2, mlp, block, b}));
  f.Scalars(0);
  ASSERT_TRUE(f.IsClosed(0));
  EXPECT_EQ(f.names.Label(f.names.Intern("mlp.fc2"), 0), "mlp.fc2 (= mlp, block)");
  EXPECT_EQ(f.names.Label(f.names.Intern("a"), 0), "a");
  EXPECT_EQ(f.names.Label(f.names.Intern("b"), 0), "b");
  EXPECT_EQ(f.names.Label(f.names.Intern("mlp"), 0), "mlp");
  EXPECT_EQ(f.names.Label(f.names.Intern("mlp.fc2"), 1), "mlp.fc2");  // per kind: not the gradient's
}

TEST(RunDecoder, ScalarsAfterTheStatisticsCloseTheStepAtOnce) {
  Fixture f;
  f.Stats(0, {0});     // shipped by batch linger during the step
  f.Stats(0, {1, 2});  // the batch the sender held, shipped before the scalars
  EXPECT_FALSE(f.IsClosed(0));
  f.Scalars(0);
  ASSERT_TRUE(f.IsClosed(0));  // not at the next step, not after 2 s of silence
  EXPECT_EQ(f.closed[0].second, 3u);
  EXPECT_EQ(f.dec.counters().closed_at_scalars, 1u);
  EXPECT_EQ(f.dec.counters().late_records, 0u);
}

TEST(RunDecoder, AgentThatSendsStatisticsAfterItsScalarsIsLearned) {
  Fixture f;
  // An older agent: the pending batch went out after the scalars. The first step is
  // closed at its scalars and its last batch is late; from then on the rank waits.
  f.Stats(0, {0});
  f.Scalars(0);
  f.Stats(0, {1, 2});
  EXPECT_EQ(f.dec.counters().late_records, 2u);
  for (uint64_t s = 1; s < 4; ++s) {
    f.Stats(s, {0});
    f.Scalars(s);
    EXPECT_FALSE(f.IsClosed(s)) << s;
    f.Stats(s, {1, 2});
    ASSERT_TRUE(f.IsClosed(s)) << s;  // closed by the batch that followed the scalars
    EXPECT_EQ(f.closed.back().second, 3u) << s;
  }
  EXPECT_EQ(f.dec.counters().late_records, 2u);
  EXPECT_EQ(f.dec.counters().closed_after_scalars, 3u);
}

TEST(RunDecoder, AllRecordsAfterTheScalarsCloseWithTheirBatch) {
  Fixture f;
  f.Scalars(0);
  EXPECT_FALSE(f.IsClosed(0));
  f.Stats(0, {0, 1, 2});
  ASSERT_TRUE(f.IsClosed(0));
  EXPECT_EQ(f.closed[0].second, 3u);
}

TEST(RunDecoder, StepWithoutRecordsClosesWithinTheSettleTime) {
  Fixture f;
  f.Scalars(0);  // a sampled-out step (every=N): scalars only
  f.dec.Tick(f.now + RunDecoder::kDefaultSettleNs - 1);
  EXPECT_FALSE(f.IsClosed(0));
  f.dec.Tick(f.now + RunDecoder::kDefaultSettleNs);
  ASSERT_TRUE(f.IsClosed(0));
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
  f.Scalars(0);
  f.dec.Tick(f.now + RunDecoder::kDefaultSettleNs);
  ASSERT_TRUE(f.IsClosed(0));
  f.Stats(0, {0, 1, 2});  // the records came after all: late
  EXPECT_EQ(f.dec.counters().late_records, 3u);
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
  dec.Consume(AsEnvelope(sb.Scalars(0, FakeScalars{})), 0);  // waits (rule 3b)
  auto st = FakeStat::Vec(0, {1.0});
  dec.Consume(AsEnvelope(sb.Stats(1, {st})), 0);  // waits for step 1's scalars
  dec.Tick(INT64_MAX / 2);
  EXPECT_EQ(closed, 1);  // step 0, closed by step 1's data (rule 1), not by a timer
  dec.CloseAll();
  EXPECT_EQ(closed, 2);
}

// The wire order of a job with CPU and GPU tensors (Python agent): the CPU tensors'
// records go out as they are computed, the GPU ones' one step late with the step's
// scalars (and, from minor 3, its StepEnd). So step 1's CPU records arrive before step
// 0's GPU record.
TEST(RunDecoder, WithoutStepEndAMixedCpuGpuJobHasItsFirstStepClosedEarly) {
  // Today's inference (older agents, old logs): step 1's records close step 0 before
  // its GPU record comes; that record is late, and the rank learns to wait a step.
  Fixture f;
  for (uint64_t s = 0; s < 3; ++s) {
    f.Stats(s, {0, 1});
    if (s == 0) continue;
    f.Stats(s - 1, {2});
    f.Scalars(s - 1);
  }
  ASSERT_EQ(f.closed.size(), 1u);
  EXPECT_EQ(f.closed[0], (std::pair<uint64_t, size_t>{0, 2}));
  EXPECT_EQ(f.dec.counters().late_records, 1u);
  EXPECT_EQ(f.dec.counters().closed_at_step_end, 0u);
  f.Stats(3, {0, 1});  // step 1 now waits for step 3 (lag 1): complete, but a step later
  ASSERT_EQ(f.closed.size(), 2u);
  EXPECT_EQ(f.closed[1], (std::pair<uint64_t, size_t>{1, 3}));
}

TEST(RunDecoder, StepEndClosesAMixedCpuGpuStepExactlyWhenItArrives) {
  Fixture f;
  f.sb.minor = lockstep::kStepEndMinor;
  f.Feed(f.sb.Hello());
  std::vector<size_t> rows;
  for (uint64_t s = 0; s < 3; ++s) {
    f.Stats(s, {0, 1});
    if (s == 0) continue;
    f.Stats(s - 1, {2});
    f.Scalars(s - 1);
    EXPECT_FALSE(f.IsClosed(s - 1)) << s - 1;  // scalars and records: still open
    f.dec.Tick(f.now + kIdle / 2);              // no timer closes it either
    EXPECT_FALSE(f.IsClosed(s - 1)) << s - 1;
    f.Feed(f.sb.StepEnd(s - 1, 3));
    ASSERT_TRUE(f.IsClosed(s - 1)) << s - 1;
    EXPECT_EQ(f.closed.back(), (std::pair<uint64_t, size_t>{s - 1, 3})) << s - 1;
    EXPECT_FALSE(f.IsClosed(s));  // the next step's CPU records wait for its own end
  }
  EXPECT_EQ(f.dec.counters().late_records, 0u);
  EXPECT_EQ(f.dec.counters().closed_at_step_end, 2u);
  EXPECT_EQ(f.dec.counters().records_missing, 0u);
}

TEST(RunDecoder, StepEndClosesAStepWithoutRecordsAtOnceAndCountsLostRows) {
  Fixture f;
  f.sb.minor = lockstep::kStepEndMinor;
  f.Feed(f.sb.Hello());
  f.Scalars(0);  // sampled out (every=N): scalars only
  EXPECT_FALSE(f.IsClosed(0));
  f.Feed(f.sb.StepEnd(0, 0));
  ASSERT_TRUE(f.IsClosed(0));  // no settle time
  f.Stats(1, {0, 1});
  f.Feed(f.sb.StepEnd(1, 3, {3}));  // one record never arrived
  ASSERT_TRUE(f.IsClosed(1));
  EXPECT_EQ(f.closed.back().second, 2u);
  EXPECT_EQ(f.dec.counters().records_missing, 1u);
  EXPECT_EQ(f.dec.counters().closed_by_settle, 0u);
  f.Feed(f.sb.StepEnd(2, 3));  // every message of step 2 lost: no step is made up
  EXPECT_FALSE(f.IsClosed(2));
  EXPECT_EQ(f.dec.counters().records_missing, 4u);
}

TEST(RunDecoder, WithStepEndAnAgentThatNeverEndsItsStepsIsBounded) {
  Fixture f;
  f.sb.minor = lockstep::kStepEndMinor;
  f.Feed(f.sb.Hello());
  for (uint64_t s = 0; s < RunDecoder::kMaxOpenSteps; ++s) f.Stats(s, {0});
  EXPECT_TRUE(f.closed.empty());
  f.Stats(RunDecoder::kMaxOpenSteps, {0});
  ASSERT_EQ(f.closed.size(), 1u);
  EXPECT_EQ(f.closed[0].first, 0u);
}

struct Restarted {
  Fixture f;
  std::vector<Rewind> rewinds;
  Restarted() {
    f.dec.set_on_rewind([this](const Rewind& r) { rewinds.push_back(r); });
    f.sb.minor = lockstep::kStepEndMinor;
    f.sb.session = 11;
    f.Feed(f.sb.Hello());
  }
  void Step(uint64_t s) {
    f.Stats(s, {0, 1, 2});
    f.Scalars(s);
    f.Feed(f.sb.StepEnd(s, 3));
  }
};

TEST(RunDecoder, ARestartWithoutStartStepIsToldOnceAndItsRepeatedStepsAreCounted) {
  Restarted r;
  for (uint64_t s = 0; s < 3; ++s) r.Step(s);
  r.f.Feed(r.f.sb.Goodbye(2));
  ASSERT_EQ(r.f.closed.size(), 3u);
  // The job runs again under the same run id, numbering from 0.
  r.f.sb.session = 12;
  r.f.Feed(r.f.sb.Hello());
  r.f.Feed(r.f.sb.Directory({{"a"}, {"b"}, {"c"}}));
  for (uint64_t s = 0; s < 4; ++s) r.Step(s);
  ASSERT_EQ(r.rewinds.size(), 1u);
  EXPECT_EQ(r.rewinds[0].rank, 0u);
  EXPECT_EQ(r.rewinds[0].from_step, 2u);
  EXPECT_EQ(r.rewinds[0].to_step, 0u);
  EXPECT_EQ(r.f.dec.counters().restarts, 1u);
  EXPECT_EQ(r.f.dec.counters().rewound_records, 9u);  // steps 0-2 again: not compared
  EXPECT_EQ(r.f.dec.counters().late_records, 0u);
  ASSERT_EQ(r.f.closed.size(), 4u);  // step 3 is new: it is decoded as usual
  EXPECT_EQ(r.f.closed.back(), (std::pair<uint64_t, size_t>{3, 3}));
}

TEST(RunDecoder, AResumeWithStartStepOrAReconnectionIsNoRestart) {
  Restarted r;
  for (uint64_t s = 0; s < 3; ++s) r.Step(s);
  r.f.Feed(r.f.sb.Hello());  // the same session again: a reconnection
  r.Step(3);
  r.f.sb.session = 12;       // a new session resuming at step 4 (start_step=4)
  r.f.Feed(r.f.sb.Hello());
  r.Step(4);
  EXPECT_TRUE(r.rewinds.empty());
  EXPECT_EQ(r.f.dec.counters().restarts, 0u);
  EXPECT_EQ(r.f.closed.size(), 5u);
}

// Two live sessions on one rank: the one heard again after a later session's Hello
// keeps the rank; the later one is set apart (its messages counted, not decoded).
TEST(RunDecoder, TwoLiveSessionsOnOneRankKeepTheFirstAndSetTheOtherApart) {
  Restarted r;
  StreamBuilder other{"r", "exp", wire::Role::Candidate};
  other.minor = lockstep::kStepEndMinor;
  other.session = 12;
  r.Step(0);
  r.f.Feed(other.Hello());  // a second process claiming rank 0
  r.Step(1);                // the first one speaks again: both are live
  ASSERT_EQ(r.rewinds.size(), 1u);
  EXPECT_EQ(r.rewinds[0].what, Rewind::What::kDuplicate);
  EXPECT_EQ(r.rewinds[0].rank, 0u);
  EXPECT_NE(r.rewinds[0].kept.find("session 000000000000000b"), std::string::npos) << r.rewinds[0].kept;
  EXPECT_NE(r.rewinds[0].apart.find("session 000000000000000c"), std::string::npos) << r.rewinds[0].apart;
  std::vector<lockstep::testing::FakeStat> v;
  v.push_back(lockstep::testing::FakeStat::Vec(0, {5.0}));
  r.f.dec.Consume(AsEnvelope(other.Stats(2, v)), r.f.now);
  r.f.dec.Consume(AsEnvelope(other.StepEnd(2, 1)), r.f.now);
  r.Step(2);
  EXPECT_EQ(r.f.dec.counters().apart_sessions, 1u);
  EXPECT_EQ(r.f.dec.counters().apart_messages, 2u);
  EXPECT_EQ(r.f.dec.counters().restarts, 0u);
  ASSERT_EQ(r.f.closed.size(), 3u);
  EXPECT_EQ(r.f.closed.back(), (std::pair<uint64_t, size_t>{2, 3}));  // the first session's rows only
  EXPECT_EQ(r.rewinds.size(), 1u);  // told once
}

}  // namespace
}  // namespace lockstep::collector
