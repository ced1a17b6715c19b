// HostRecorder (the agent engine's host statistics path) and the packed row layout,
// on an Agent over the FakeTransport: typed outcomes, what reaches the agent's queue.
#include "lockstep/agent/host_recorder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "agent_test_util.h"
#include "lockstep/agent/packed_rows.h"

namespace lockstep {
namespace {

using testing::MakeAgent;
using testing::TestOptions;

constexpr auto kBadDType = static_cast<DType>(77);

double L2(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

TEST(AgentHostRecorder, RecordRepeatAndRefusalAreTyped) {
  auto made = MakeAgent(TestOptions());
  ASSERT_NE(made.agent, nullptr);
  HostRecorder rec(made.agent.get(), StatsConfig{});
  const std::vector<float> x = {1, -2, 3, 4};

  HostResult none = rec.Repeat(RecordKey{0, 0, 1, 0});
  EXPECT_EQ(none.outcome, HostOutcome::kNothingToRepeat);

  HostResult r = rec.Record(RecordKey{0, 0, 0, 0}, x.data(), x.size(), DType::kF32);
  ASSERT_TRUE(r.recorded());
  EXPECT_NEAR(r.l2, L2(x), 1e-9);
  HostResult again = rec.Repeat(RecordKey{0, 0, 1, 1});
  ASSERT_TRUE(again.recorded());
  EXPECT_EQ(again.l2, r.l2);

  // Another recorder (or thread) has no last statistics of this one.
  HostRecorder other(made.agent.get(), StatsConfig{});
  EXPECT_EQ(other.Repeat(RecordKey{0, 0, 2, 2}).outcome, HostOutcome::kNothingToRepeat);
  HostOutcome on_thread = HostOutcome::kRecorded;
  std::thread([&] { on_thread = rec.Repeat(RecordKey{0, 0, 2, 2}).outcome; }).join();
  EXPECT_EQ(on_thread, HostOutcome::kNothingToRepeat);

  EXPECT_EQ(rec.Record(RecordKey{0, 0, 0, 3}, x.data(), x.size(), kBadDType).outcome,
            HostOutcome::kRefused);
  EXPECT_EQ(rec.errors(), 1u);
  // A refused tensor leaves nothing to repeat.
  EXPECT_EQ(rec.Repeat(RecordKey{0, 0, 1, 4}).outcome, HostOutcome::kNothingToRepeat);
  EXPECT_EQ(made.agent->Counters().records_enqueued, 2u);
}

TEST(AgentHostRecorder, StridedViewsAndLayoutsItCannotRead) {
  auto made = MakeAgent(TestOptions());
  HostRecorder rec(made.agent.get(), StatsConfig{});
  // A 2x2 transposed view of [[1, 2], [3, 4]]: elements 1, 3, 2, 4.
  const std::vector<float> x = {1, 2, 3, 4};
  const int64_t sizes[] = {2, 2}, strides[] = {1, 2}, negative[] = {-1, 2};
  HostResult r = rec.RecordStrided(RecordKey{0, 0, 0, 0}, x.data(), DType::kF32, sizes,
                                   strides, 2);
  ASSERT_TRUE(r.recorded());
  EXPECT_NEAR(r.l2, L2(x), 1e-9);
  EXPECT_EQ(rec.RecordStrided(RecordKey{0, 0, 0, 1}, x.data() + 1, DType::kF32, sizes,
                              negative, 2).outcome,
            HostOutcome::kBadLayout);
  EXPECT_EQ(rec.SubmitStrided(RecordKey{0, 0, 0, 1}, x.data() + 1, DType::kF32, sizes,
                              negative, 2).outcome,
            HostOutcome::kBadLayout);
}

TEST(AgentHostRecorder, WorkerResultsSettleInTicketOrder) {
  auto made = MakeAgent(TestOptions());
  HostRecorder rec(made.agent.get(), StatsConfig{});
  const std::vector<float> a = {3, 4}, b = {6, 8}, c = {1, 1};
  // No worker yet: the caller computes inline.
  EXPECT_EQ(rec.Submit(RecordKey{0, 0, 0, 0}, a.data(), a.size(), DType::kF32).outcome,
            HostOutcome::kFull);
  ASSERT_TRUE(rec.StartWorker(4).ok());
  ASSERT_TRUE(rec.has_worker());
  HostSubmit ta = rec.Submit(RecordKey{0, 0, 0, 0}, a.data(), a.size(), DType::kF32);
  HostSubmit tb = rec.Submit(RecordKey{0, 0, 1, 1}, b.data(), b.size(), DType::kF32);
  HostSubmit tc = rec.Submit(RecordKey{0, 0, 2, 2}, c.data(), c.size(), kBadDType);
  ASSERT_TRUE(ta.queued() && tb.queued() && tc.queued());
  EXPECT_EQ(tb.ticket, ta.ticket + 1);
  rec.Kick();
  rec.Wait(tc.ticket);
  EXPECT_GT(rec.Done(), tc.ticket);
  // Out of order: not settled.
  EXPECT_EQ(rec.Settle(tb.ticket, true, false).outcome, HostOutcome::kNotReady);
  EXPECT_EQ(rec.Settle(ta.ticket, false, false).outcome, HostOutcome::kDropped);
  HostResult rb = rec.Settle(tb.ticket, true, true);
  ASSERT_TRUE(rb.recorded());
  EXPECT_DOUBLE_EQ(rb.l2, 10.0);
  // as_last: b's statistics are this thread's last, for a repeat.
  HostResult rep = rec.Repeat(RecordKey{0, 0, 3, 3});
  ASSERT_TRUE(rep.recorded());
  EXPECT_DOUBLE_EQ(rep.l2, 10.0);
  EXPECT_EQ(rec.Settle(tc.ticket, true, false).outcome, HostOutcome::kRefused);
  EXPECT_EQ(rec.errors(), 1u);
  EXPECT_EQ(made.agent->Counters().records_enqueued, 2u);  // b and its repeat
}

TEST(AgentPackedRows, UnpacksValidRowsAndCountsMalformedOnes) {
  auto made = MakeAgent(TestOptions());
  StatsConfig config;
  config.sketch_k = 2;
  config.hist_bins = 0;
  const size_t cols = kPackedFixed + 2;
  std::vector<double> rows(2 * cols, 0.0);
  rows[kColNumel] = 4;
  rows[kColL2] = 5;
  rows[kColLimitDtype] = static_cast<double>(DType::kF16);
  rows[cols + kColNumel] = -1;  // a negative count: malformed
  const uint32_t micros[] = {0, 0}, ids[] = {0, 1}, orders[] = {0, 1};
  PackedResult r = RecordPackedRows(made.agent.get(), config, 0, micros, ids, orders,
                                    rows.data(), 2, cols, nullptr);
  EXPECT_EQ(r.accepted, 1u);
  EXPECT_EQ(r.malformed, 1u);
  TensorStats s;
  ASSERT_TRUE(UnpackRow(rows.data(), cols, 2, 0, &s));
  EXPECT_EQ(s.numel, 4u);
  EXPECT_EQ(s.l2, 5.0);
  EXPECT_EQ(s.limit_dtype, DType::kF16);
  EXPECT_FALSE(UnpackRow(rows.data(), cols - 1, 2, 0, &s));  // width mismatch
  EXPECT_STREQ(kPackedColumnNames[kColLimitDtype], "limit_dtype");
}

}  // namespace
}  // namespace lockstep
