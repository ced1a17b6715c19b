#include "lockstep/collector/registry.h"

#include <gtest/gtest.h>

#include "lockstep/common/envelope_check.h"
#include "lockstep/collector/collector.h"
#include "runlog/log_format.h"
#include "runlog/log_writer.h"
#include "test_dir.h"
#include "test_messages.h"

namespace lockstep::collector {
namespace {

using testing::At;
using testing::Bytes;

void Feed(Registry& reg, const Bytes& b, int64_t recv = 1) {
  EnvelopeCheck c = CheckEnvelope(b.data(), b.size(), kMaxMessageBytes);
  ASSERT_EQ(c.reject, Reject::kNone);
  reg.OnMessage(*c.env, recv, b.size());
}

RankInfo Get(const Registry& reg, const std::string& run, uint32_t rank) {
  RankInfo r;
  EXPECT_TRUE(reg.Get(run, rank, &r)) << run << "/" << rank;
  return r;
}

TEST(Registry, CountsInOrderStreamWithoutGaps) {
  Registry reg;
  Feed(reg, testing::Hello(At("r", 0, 0), "exp1", wire::Role::Candidate));
  Feed(reg, testing::Stats(At("r", 0, 1), 0, 10));
  Feed(reg, testing::Scalars(At("r", 0, 2), 0, 1.5));
  Feed(reg, testing::Stats(At("r", 0, 3), 1, 7));
  RankInfo r = Get(reg, "r", 0);
  EXPECT_EQ(r.messages, 4u);
  EXPECT_EQ(r.records, 18u);
  EXPECT_EQ(r.stat_records, 17u);
  EXPECT_EQ(r.scalar_records, 1u);
  EXPECT_EQ(r.gaps, 0u);
  EXPECT_EQ(r.duplicates, 0u);
  EXPECT_EQ(r.first_seq, 0u);
  EXPECT_EQ(r.last_seq, 3u);
  EXPECT_EQ(r.last_step, 1u);
  EXPECT_EQ(r.experiment, "exp1");
  EXPECT_EQ(r.role, "candidate");
  EXPECT_EQ(r.sessions, 1u);
}

TEST(Registry, CountsGapsExactlyAndLateArrivalsFillThem) {
  Registry reg;
  for (uint64_t s : {0, 1, 2, 6, 7, 20}) Feed(reg, testing::Heartbeat(At("r", 1, s), 0, 0));
  RankInfo r = Get(reg, "r", 1);
  EXPECT_EQ(r.gaps, 3u + 12u);  // 3..5 and 8..19
  EXPECT_EQ(r.duplicates, 0u);
  // 4 and 8 arrive late (fill), 7 and 20 again (duplicates).
  for (uint64_t s : {4, 8, 7, 20}) Feed(reg, testing::Heartbeat(At("r", 1, s), 0, 0));
  r = Get(reg, "r", 1);
  EXPECT_EQ(r.gaps, 13u);
  EXPECT_EQ(r.duplicates, 2u);
  // Filling the rest of 3..5 and the middle of 9..19, then its ends.
  for (uint64_t s : {3, 5, 14, 9, 19}) Feed(reg, testing::Heartbeat(At("r", 1, s), 0, 0));
  r = Get(reg, "r", 1);
  EXPECT_EQ(r.gaps, 8u);  // 10..13, 15..18
  EXPECT_EQ(r.duplicates, 2u);
  Feed(reg, testing::Heartbeat(At("r", 1, 14), 0, 0));
  EXPECT_EQ(Get(reg, "r", 1).duplicates, 3u);
}

TEST(Registry, FirstMessageAfterZeroCountsTheMissingStart) {
  Registry reg;
  Feed(reg, testing::Stats(At("r", 0, 5), 0, 1));
  RankInfo r = Get(reg, "r", 0);
  EXPECT_EQ(r.gaps, 5u);
  EXPECT_EQ(r.first_seq, 5u);
}

TEST(Registry, RanksAndRunsAreSeparate) {
  Registry reg;
  Feed(reg, testing::Stats(At("a", 0, 0), 0, 1));
  Feed(reg, testing::Stats(At("a", 1, 0), 0, 2));
  Feed(reg, testing::Stats(At("b", 0, 3), 0, 4));
  EXPECT_EQ(Get(reg, "a", 0).gaps, 0u);
  EXPECT_EQ(Get(reg, "a", 1).records, 2u);
  EXPECT_EQ(Get(reg, "b", 0).gaps, 3u);
  auto t = reg.Totals();
  EXPECT_EQ(t.runs, 2u);
  EXPECT_EQ(t.ranks, 3u);
  EXPECT_EQ(t.records, 7u);
  EXPECT_EQ(t.gaps, 3u);
  auto snap = reg.Snapshot();
  ASSERT_EQ(snap.size(), 3u);
  EXPECT_EQ(snap[2].run, "b");
}

TEST(Registry, HeartbeatsCarryAgentDropsAcrossAgentRestarts) {
  Registry reg;
  Feed(reg, testing::Hello(At("r", 0, 0), "e", wire::Role::Baseline, /*pid=*/1, /*start=*/10));
  Feed(reg, testing::Heartbeat(At("r", 0, 1), /*dropped=*/5, /*depth=*/17, /*last_step=*/3), 99);
  RankInfo r = Get(reg, "r", 0);
  EXPECT_EQ(r.agent_records_dropped, 5u);
  EXPECT_EQ(r.agent_queue_depth, 17u);
  EXPECT_EQ(r.last_heartbeat_unix_ns, 99);
  EXPECT_EQ(r.last_step, 3u);
  // Same agent reconnecting: a repeated Hello, not a new session.
  Feed(reg, testing::Hello(At("r", 0, 2), "e", wire::Role::Baseline, 1, 10));
  EXPECT_EQ(Get(reg, "r", 0).sessions, 1u);
  // The job restarted: new pid and start time, numbering from 0 again.
  Feed(reg, testing::Hello(At("r", 0, 0), "e", wire::Role::Baseline, 2, 20));
  Feed(reg, testing::Heartbeat(At("r", 0, 1), 2, 0));
  Feed(reg, testing::Heartbeat(At("r", 0, 3), 2, 0));
  r = Get(reg, "r", 0);
  EXPECT_EQ(r.sessions, 2u);
  EXPECT_EQ(r.duplicates, 0u);
  EXPECT_EQ(r.gaps, 1u);  // seq 2 of the new session
  EXPECT_EQ(r.agent_records_dropped, 7u);
  Feed(reg, testing::Goodbye(At("r", 0, 4), 9));
  r = Get(reg, "r", 0);
  EXPECT_TRUE(r.goodbye);
  EXPECT_EQ(r.goodbye_reason, "close");
  EXPECT_EQ(r.last_step, 9u);
}

TEST(Registry, RebuiltFromLogsCountsAGapAcrossTheRestart) {
  testing::TempDir dir;
  {
    auto w = LogWriter::Open(runlog::LogPathFor(dir.path(), "run-x"), true);
    ASSERT_TRUE(w.ok());
    for (uint64_t s = 0; s < 10; ++s) {
      Bytes b = s == 0 ? testing::Hello(At("run-x", 0, 0)) : testing::Stats(At("run-x", 0, s), s, 3);
      ASSERT_TRUE((*w)->Append(b.data(), b.size(), 100 + s).ok());
    }
  }
  CollectorOptions o;
  o.listen = {"tcp://127.0.0.1:*"};
  o.data_dir = dir.path();
  auto c = Collector::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->counters().rebuilt_messages, 10u);
  RankInfo r = Get((*c)->registry(), "run-x", 0);
  EXPECT_EQ(r.messages, 10u);
  EXPECT_EQ(r.records, 27u);
  EXPECT_EQ(r.last_seq, 9u);
  EXPECT_EQ(r.last_recv_unix_ns, 109);
  EXPECT_TRUE(r.hello_seen);
}

}  // namespace
}  // namespace lockstep::collector
