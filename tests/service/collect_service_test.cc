// CollectService built directly, as `lockstep collect` builds it, over real loopback
// ZeroMQ with the real C++ agent: two runs are logged, a NaN in the candidate becomes one
// alert that reaches every part of the fan-out (report, /metrics feed, the --alerts-file
// jsonl sink), a restart replays the logs without writing that alert again, and a part
// that cannot be built is named.
#include "service/collect_service.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "detect/live_analyzer.h"
#include "lockstep/agent/agent.h"
#include "lockstep/alerting/dispatcher.h"
#include "lockstep/collector/collector.h"
#include "lockstep/common/clock.h"
#include "metrics/metrics_feed.h"
#include "report/report_recorder.h"
#include "test_dir.h"

namespace lockstep::collector {
namespace {

constexpr int kSteps = 6, kTensors = 3;
constexpr uint64_t kNanStep = 3;
// Both runs' records: a statistics record per tensor and a scalars record per step.
constexpr uint64_t kRecords = 2 * kSteps * (kTensors + 1);

CollectOptions Options(const std::string& dir) {
  CollectOptions o;
  o.ingest.listen = {"tcp://127.0.0.1:*"};
  o.ingest.data_dir = dir;
  o.ingest.fsync_interval_ms = 50;
  o.view_listen = "tcp://127.0.0.1:*";
  o.view_required = true;
  o.metrics_listen = "127.0.0.1:0";
  o.metrics_required = true;
  o.status_interval_s = 0;
  o.version = "test";
  o.alerting.spool_dir = dir + "/alert-spool";  // where the sinks' journals live
  alerting::SinkOptions jsonl;
  jsonl.kind = "jsonl";
  jsonl.target = dir + "/alerts.jsonl";
  o.alerting.sinks.push_back(jsonl);
  return o;
}

// One run of the real agent: kSteps steps of kTensors tensors; with `nan`, tensor 1 of
// step kNanStep holds NaNs.
void SendRun(const std::string& endpoint, const std::string& run, Role role, bool nan) {
  AgentOptions o;
  o.endpoint = endpoint;
  o.run = run;
  o.experiment = "svc";
  o.role = role;
  o.sketch_k = 0;
  o.hist_bins = 0;
  auto agent = Agent::Create(o);
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  std::vector<uint32_t> ids;
  for (uint32_t t = 0; t < kTensors; ++t)
    ids.push_back((*agent)->RegisterTensor("layers." + std::to_string(t), TensorKind::kAct,
                                           DType::kF32, {64}, t));
  for (uint64_t step = 0; step < kSteps; ++step) {
    for (uint32_t t = 0; t < kTensors; ++t) {
      TensorStats s;
      s.numel = 64;
      s.mean = 0.1 * t + 0.01 * static_cast<double>(step);
      s.std = 1.0;
      s.min = -2.0;
      s.max = 2.0;
      s.absmax = 2.0;
      s.l2 = 8.0 + s.mean;
      if (nan && step == kNanStep && t == 1) s.nan_count = 2;
      EXPECT_TRUE((*agent)->RecordStats(step, 0, ids[t], t, s));
    }
    StepScalars sc;
    sc.loss = 2.0 - 0.01 * static_cast<double>(step);
    EXPECT_TRUE((*agent)->RecordScalars(step, sc));
    EXPECT_TRUE((*agent)->EndStep(step));
  }
  EXPECT_TRUE((*agent)->Close(std::chrono::seconds(5)));
}

// Run() until the collector has taken `records` records in, or 10 s.
Status RunUntilRecords(CollectService* svc, uint64_t records) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  return svc->Run([&](std::chrono::nanoseconds max) {
    if (svc->collector().registry().Totals().records >= records) return true;
    if (std::chrono::steady_clock::now() > deadline) return true;
    std::this_thread::sleep_for(
        std::min<std::chrono::nanoseconds>(max, std::chrono::milliseconds(5)));
    return false;
  });
}

std::vector<std::string> Lines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) out.push_back(line);
  return out;
}

size_t CountWith(const std::vector<std::string>& lines, const std::string& needle) {
  return std::count_if(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.find(needle) != std::string::npos; });
}

uint64_t JsonlCounter(const CollectService& svc, uint64_t alerting::SinkCounters::*field) {
  for (const auto& c : svc.dispatcher().Counters()) {
    if (c.kind == "jsonl") return c.*field;
  }
  return 0;
}

TEST(CollectService, LogsTwoRunsAndFansTheAlertOutToEveryPart) {
  testing::TempDir dir;
  CollectPart failed = CollectPart::kIngest;
  auto svc = CollectService::Create(Options(dir.path()), &failed);
  ASSERT_TRUE(svc.ok()) << svc.status().ToString();
  EXPECT_EQ(failed, CollectPart::kNone);
  CollectService& s = **svc;
  // Every endpoint bound with its port resolved.
  ASSERT_EQ(s.collector().endpoints().size(), 1u);
  EXPECT_EQ(s.collector().endpoints()[0].find('*'), std::string::npos);
  EXPECT_EQ(s.view_endpoint().rfind("tcp://127.0.0.1:", 0), 0u);
  EXPECT_EQ(s.view_endpoint().find('*'), std::string::npos);
  EXPECT_EQ(s.metrics_address().rfind("127.0.0.1:", 0), 0u);
  EXPECT_NE(s.metrics_address(), "127.0.0.1:0");
  ASSERT_TRUE(s.Start().ok());
  EXPECT_EQ(s.replay_stats().messages, 0u);  // a fresh data dir: nothing to replay

  const std::string ep = s.collector().endpoints()[0];
  SendRun(ep, "base", Role::kBaseline, /*nan=*/false);
  SendRun(ep, "cand", Role::kCandidate, /*nan=*/true);
  ASSERT_TRUE(RunUntilRecords(&s, kRecords).ok());
  ASSERT_EQ(s.collector().registry().Totals().records, kRecords);
  EXPECT_TRUE(s.Shutdown().ok());
  EXPECT_TRUE(s.Shutdown().ok());  // idempotent

  EXPECT_TRUE(std::filesystem::exists(dir / "base.lslog"));
  EXPECT_TRUE(std::filesystem::exists(dir / "cand.lslog"));
  EXPECT_TRUE(std::filesystem::exists(dir / "cand.settings.toml"));
  EXPECT_EQ(s.analyzer().errors(), 0u);

  // The NaN: one alert naming the candidate, in every part of the fan-out.
  auto report = s.report().AlertsOf("svc");
  auto nf = std::find_if(report.begin(), report.end(),
                         [](const alerting::Alert& a) { return a.rule == "nonfinite"; });
  ASSERT_NE(nf, report.end());
  EXPECT_EQ(nf->step, kNanStep);
  EXPECT_EQ(nf->tensor, "layers.1");
  EXPECT_EQ(nf->runs, std::vector<std::string>{"cand"});
  EXPECT_FALSE(nf->replayed);
  uint64_t fed = 0;
  for (const auto& c : s.metrics_feed().Alerts()) fed += c.rule == "nonfinite" ? c.count : 0;
  EXPECT_EQ(fed, 1u);
  EXPECT_EQ(s.alerts(), report.size());
  EXPECT_EQ(s.replayed_alerts(), 0u);
  auto lines = Lines(dir / "alerts.jsonl");
  EXPECT_EQ(CountWith(lines, "\"nonfinite\""), 1u);
  EXPECT_EQ(lines.size(), report.size());
  EXPECT_EQ(JsonlCounter(s, &alerting::SinkCounters::delivered), lines.size());
}

TEST(CollectService, RestartReplaysTheLogsAndDoesNotWriteTheAlertAgain) {
  testing::TempDir dir;
  {
    auto first = CollectService::Create(Options(dir.path()));
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    ASSERT_TRUE((*first)->Start().ok());
    const std::string ep = (*first)->collector().endpoints()[0];
    SendRun(ep, "base", Role::kBaseline, false);
    SendRun(ep, "cand", Role::kCandidate, true);
    ASSERT_TRUE(RunUntilRecords(first->get(), kRecords).ok());
    ASSERT_TRUE((*first)->Shutdown().ok());
  }  // destroyed: the data dir's lock is released
  ASSERT_EQ(CountWith(Lines(dir / "alerts.jsonl"), "\"nonfinite\""), 1u);

  auto again = CollectService::Create(Options(dir.path()));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  CollectService& s = **again;
  ASSERT_TRUE(s.Start().ok());
  EXPECT_EQ(s.replay_stats().runs, 2u);
  EXPECT_GE(s.replay_stats().messages, 4u);  // two Hellos, two directories, statistics...
  EXPECT_EQ(s.replay_stats().skipped, 0u);
  EXPECT_GE(s.replayed_alerts(), 1u);  // the NaN, derived again from the logs
  auto report = s.report().AlertsOf("svc");
  auto nf = std::find_if(report.begin(), report.end(),
                         [](const alerting::Alert& a) { return a.rule == "nonfinite"; });
  ASSERT_NE(nf, report.end());
  EXPECT_TRUE(nf->replayed);
  EXPECT_TRUE(s.Run([](std::chrono::nanoseconds) { return true; }).ok());
  ASSERT_TRUE(s.Shutdown().ok());
  // The jsonl sink's journal knew it: skipped, not written twice.
  EXPECT_EQ(CountWith(Lines(dir / "alerts.jsonl"), "\"nonfinite\""), 1u);
  EXPECT_GE(JsonlCounter(s, &alerting::SinkCounters::already_sent), 1u);
}

TEST(CollectService, CreateNamesThePartThatCannotBeBuilt) {
  testing::TempDir dir, other;
  auto running = CollectService::Create(Options(dir.path()));
  ASSERT_TRUE(running.ok()) << running.status().ToString();

  // The data dir is held by the running service.
  CollectPart failed = CollectPart::kNone;
  auto same_dir = CollectService::Create(Options(dir.path()), &failed);
  EXPECT_FALSE(same_dir.ok());
  EXPECT_EQ(failed, CollectPart::kIngest);

  // A baseline log that does not exist: the input-data part, naming the file.
  CollectOptions o = Options(other.path());
  o.baseline_log = other / "missing.lslog";
  auto no_baseline = CollectService::Create(o, &failed);
  ASSERT_FALSE(no_baseline.ok());
  EXPECT_EQ(failed, CollectPart::kBaseline);
  EXPECT_NE(no_baseline.status().message().find("missing.lslog"), std::string::npos);

  // /metrics' address taken: an error when asked for, a warning (and none) otherwise.
  o = Options(other.path());
  o.metrics_listen = (*running)->metrics_address();
  auto taken = CollectService::Create(o, &failed);
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(failed, CollectPart::kMetrics);
  o.metrics_required = false;
  auto without = CollectService::Create(o, &failed);
  ASSERT_TRUE(without.ok()) << without.status().ToString();
  EXPECT_EQ(failed, CollectPart::kNone);
  EXPECT_EQ((*without)->metrics_address(), "");
  EXPECT_NE((*without)->view_endpoint(), "");
}

// The analyzer's clock during a restart's replay: the replayed message's receive time,
// then the service's clock again; monotonic time is always the service's.
TEST(CollectService, ReplayClockReadsTheReplayedTimeThenItsBase) {
  FakeClock base(/*unix_ns=*/1'000, /*monotonic_ns=*/7);
  ReplayClock c(&base);
  EXPECT_EQ(c.NowUnixNs(), 1'000);
  c.SetReplayUnixNs(42);
  base.Advance(std::chrono::nanoseconds(5));
  EXPECT_EQ(c.NowUnixNs(), 42);
  EXPECT_EQ(c.NowMonotonicNs(), 12);
  c.SetReplayUnixNs(0);
  EXPECT_EQ(c.NowUnixNs(), 1'005);
}

}  // namespace
}  // namespace lockstep::collector
