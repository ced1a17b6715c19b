// ReplayLogs (runlog/log_replay.h): the logs of a data dir come back to a sink in the
// order the collector received them, across runs, with the timer ticks replayed.
#include "runlog/log_replay.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_format.h"
#include "runlog/log_writer.h"
#include "test_dir.h"
#include "test_messages.h"

namespace lockstep::collector {
namespace {

using testing::At;

class Recorder : public MessageSink {
 public:
  void OnMessage(const wire::Envelope& env, int64_t recv_ns) override {
    got.emplace_back(env.run_id()->str() + "#" + std::to_string(env.seq()), recv_ns);
  }
  std::vector<std::pair<std::string, int64_t>> got;
};

void Write(LogWriter* w, const testing::Bytes& b, int64_t recv_ns) {
  ASSERT_TRUE(w->Append(b.data(), static_cast<uint32_t>(b.size()), recv_ns).ok());
}

TEST(ReplayLogs, MergesRunsInArrivalOrderAndTicks) {
  testing::TempDir dir;
  {
    auto a = LogWriter::Open(runlog::LogPathFor(dir.path(), "run-a"), true);
    auto b = LogWriter::Open(runlog::LogPathFor(dir.path(), "run-b"), true);
    ASSERT_TRUE(a.ok() && b.ok());
    const int64_t t0 = 1'700'000'000'000'000'000;
    Write(a->get(), testing::Hello(At("run-a", 0, 0)), t0);
    Write(b->get(), testing::Hello(At("run-b", 0, 0)), t0 + 5'000'000);
    Write(a->get(), testing::Scalars(At("run-a", 0, 1), 0, 1.0), t0 + 30'000'000);
    Write(b->get(), testing::Scalars(At("run-b", 0, 1), 0, 1.0), t0 + 31'000'000);
    Write(b->get(), testing::Goodbye(At("run-b", 0, 2), 0), t0 + 32'000'000);
    Write(a->get(), testing::Goodbye(At("run-a", 0, 2), 0), t0 + 90'000'000);
  }
  Recorder rec;
  std::vector<int64_t> ticks;
  auto st = ReplayLogs(dir.path(), &rec, [&](int64_t t) { ticks.push_back(t); });
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->runs, 2u);
  EXPECT_EQ(st->messages, 6u);
  EXPECT_EQ(st->skipped, 0u);
  std::vector<std::string> order;
  for (auto& [what, t] : rec.got) order.push_back(what);
  EXPECT_EQ(order, (std::vector<std::string>{"run-a#0", "run-b#0", "run-a#1", "run-b#1", "run-b#2",
                                             "run-a#2"}));
  // A tick each time the replayed clock moved 10 ms or more since the last one.
  ASSERT_EQ(ticks.size(), 2u);
  EXPECT_EQ(ticks[0] - rec.got[0].second, 30'000'000);
  EXPECT_EQ(ticks[1] - rec.got[0].second, 90'000'000);
  EXPECT_EQ(st->last_recv_unix_ns, rec.got.back().second);
}

TEST(ReplayLogs, AnEmptyDataDirReplaysNothing) {
  testing::TempDir dir;
  Recorder rec;
  auto st = ReplayLogs(dir.path(), &rec, nullptr);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->messages, 0u);
  EXPECT_TRUE(rec.got.empty());
}

}  // namespace
}  // namespace lockstep::collector
