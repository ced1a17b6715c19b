// CollectorMetrics over an in-process Collector fed through ZeroMQ: the figures a
// scrape shows for good messages, a bad frame, step times and alerts, the
// messages/s gauge under an injected clock, and the log retention's figures.
#include "metrics/collector_metrics.h"

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <zmq.hpp>

#include "http_get.h"
#include "lockstep/common/clock.h"
#include "detect/live_analyzer.h"
#include "lockstep/collector/collector.h"
#include "metrics/http_server.h"
#include "metrics/metrics_feed.h"
#include "runlog/log_format.h"
#include "runlog/log_writer.h"
#include "runlog/retention.h"
#include "test_dir.h"
#include "test_messages.h"
#include "wait_for.h"

namespace lockstep::collector::metrics {
namespace {

using lockstep::testing::Bytes;
using lockstep::testing::Head;

Bytes ScalarsWithTime(const Head& h, uint64_t step, double step_time_s) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = wire::CreateStepScalars(fbb, step, /*loss=*/1.0, 0, 0, 0, step_time_s);
  return lockstep::testing::Finish(fbb, h, wire::Body::StepScalars, body.Union());
}

struct Fixture {
  // `analysis` (optional) is fed by the collector, after the metrics feed.
  explicit Fixture(MessageSink* analysis = nullptr) {
    CollectorOptions o;
    o.listen = {"tcp://127.0.0.1:*"};
    o.data_dir = dir.path();
    auto c = Collector::Create(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    col = std::move(*c);
    EXPECT_TRUE(col->AddSink(&feed).ok());
    if (analysis != nullptr) EXPECT_TRUE(col->AddSink(analysis).ok());
    EXPECT_TRUE(col->Start().ok());
    push.set(zmq::sockopt::linger, 5000);
    push.connect(col->endpoints()[0]);
  }
  void Send(const Bytes& b) { push.send(zmq::buffer(b.data(), b.size()), zmq::send_flags::none); }
  void WaitReceived(uint64_t n) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (col->counters().received < n && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(col->counters().received, n);
  }
  // The rates count accepted messages, which ingest counts after `received` (once a
  // message is checked): a loaded machine can render between the two.
  void WaitAccepted(uint64_t n) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (col->counters().accepted < n && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(col->counters().accepted, n);
  }

  lockstep::testing::TempDir dir;
  MetricsFeed feed;
  std::unique_ptr<Collector> col;
  zmq::context_t ctx;
  zmq::socket_t push{ctx, zmq::socket_type::push};
};

bool Has(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

// An agent's answer to request `id`; with a capture's own replay when `replay`.
Bytes Ack(const Head& h, uint64_t id, wire::AckStatus status, bool replay = false) {
  flatbuffers::FlatBufferBuilder fbb;
  flatbuffers::Offset<wire::SelfReplay> r;
  if (replay) r = wire::CreateSelfReplayDirect(fbb, "/tmp/x.pt", "blocks.0/gelu#0", "float32", "float32", 1e-7, 1.0);
  auto body = wire::CreateControlAck(fbb, id, status, 5, fbb.CreateString("capture"), r);
  return lockstep::testing::Finish(fbb, h, wire::Body::ControlAck, body.Union());
}

TEST(CollectorMetrics, ShowsRanksBadMessagesStepTimesAndAlerts) {
  Fixture f;
  f.Send(lockstep::testing::Hello(lockstep::testing::At("run-a", 1, 0), "exp \"x\""));
  f.Send(ScalarsWithTime(lockstep::testing::At("run-a", 1, 1), 0, 0.5));
  f.Send(ScalarsWithTime(lockstep::testing::At("run-a", 1, 2), 1, 0.25));
  // seq 3 never sent: one gap.
  f.Send(lockstep::testing::Heartbeat(lockstep::testing::At("run-a", 1, 4), /*dropped=*/7, 3, 1));
  f.Send(Bytes{'n', 'o', 'p', 'e', 0, 0, 0, 0});  // not a lockstep envelope
  f.Send(Ack(lockstep::testing::At("run-a", 1, 5), 7, wire::AckStatus::Received));
  f.Send(Ack(lockstep::testing::At("run-a", 1, 6), 7, wire::AckStatus::Done));
  f.Send(Ack(lockstep::testing::At("run-a", 1, 7), 7, wire::AckStatus::Done, /*replay=*/true));
  f.WaitReceived(8);
  f.WaitAccepted(7);  // the registry counts a message before `accepted` does, not before `received`
  alerting::Alert a;
  a.rule = "loss_drift";
  a.severity = alerting::Severity::kCritical;
  a.experiment = "exp \"x\"";
  f.feed.OnAlert(a);
  f.feed.OnAlert(a);

  lockstep::FakeClock clock(/*unix_ns=*/0);
  CollectorMetrics m({f.col.get(), nullptr, nullptr, &f.feed}, &clock);
  clock.SetUnixNs(f.col->registry().Snapshot().at(0).last_recv_unix_ns + 1'500'000'000);
  std::string t = "\n" + m.Render();
  const std::string ra = "{run=\"run-a\",rank=\"1\"}";
  EXPECT_TRUE(Has(t, "lockstep_rank_messages_total" + ra + " 7")) << t;
  EXPECT_TRUE(Has(t, "lockstep_rank_records_total" + ra + " 2"));
  EXPECT_TRUE(Has(t, "lockstep_rank_last_step" + ra + " 1"));
  EXPECT_TRUE(Has(t, "lockstep_rank_missing_messages" + ra + " 1"));
  EXPECT_TRUE(Has(t, "lockstep_rank_agent_dropped_records_total" + ra + " 7"));
  EXPECT_TRUE(Has(t, "lockstep_rank_agent_queue_depth" + ra + " 3"));
  EXPECT_TRUE(Has(t, "lockstep_rank_last_seen_age_seconds" + ra + " 1.5"));
  EXPECT_TRUE(Has(t, "lockstep_rank_last_step_duration_seconds" + ra + " 0.25"));
  EXPECT_TRUE(Has(t, "lockstep_rank_step_duration_seconds_sum" + ra + " 0.75"));
  EXPECT_TRUE(Has(t, "lockstep_rank_step_duration_seconds_count" + ra + " 2"));
  EXPECT_NE(t.find("lockstep_rank_info{run=\"run-a\",rank=\"1\",experiment=\"exp \\\"x\\\"\",role=\"baseline\""),
            std::string::npos);
  EXPECT_TRUE(Has(t, "lockstep_collector_bad_messages_total{reason=\"file_identifier\"} 1"));
  EXPECT_TRUE(Has(t, "lockstep_collector_bad_messages_total{reason=\"malformed\"} 0"));
  EXPECT_TRUE(Has(t, "lockstep_collector_received_messages_total 8"));
  EXPECT_TRUE(Has(t, "lockstep_collector_messages_total 7"));
  // The control channel: answers by status (every status present), the replays among them.
  EXPECT_TRUE(Has(t, "# TYPE lockstep_collector_control_answers_total counter"));
  EXPECT_TRUE(Has(t, "lockstep_collector_control_answers_total{status=\"received\"} 1"));
  EXPECT_TRUE(Has(t, "lockstep_collector_control_answers_total{status=\"done\"} 2"));
  EXPECT_TRUE(Has(t, "lockstep_collector_control_answers_total{status=\"refused\"} 0"));
  EXPECT_TRUE(Has(t, "lockstep_collector_control_answers_total{status=\"unknown\"} 0"));
  EXPECT_TRUE(Has(t, "lockstep_collector_control_replays_total 1"));
  EXPECT_TRUE(Has(t, "lockstep_collector_control_requests_total 0"));
  EXPECT_TRUE(Has(t, "lockstep_collector_control_publications_total 0"));
  EXPECT_TRUE(Has(t, "lockstep_alerts_total{experiment=\"exp \\\"x\\\"\",rule=\"loss_drift\",severity=\"critical\"} 2"));
  EXPECT_TRUE(Has(t, "lockstep_collector_up 1"));
  EXPECT_TRUE(Has(t, "# TYPE lockstep_rank_step_duration_seconds summary"));
  // No analyzer or dispatcher given: their families are absent, not empty.
  EXPECT_EQ(t.find("lockstep_pair_"), std::string::npos);
  EXPECT_EQ(t.find("lockstep_alert_sink_"), std::string::npos);
}

TEST(CollectorMetrics, MessagesPerSecondOverTheWindow) {
  Fixture f;
  lockstep::FakeClock clock(lockstep::UnixNowNs(), /*monotonic_ns=*/0);
  auto at = [&](std::chrono::nanoseconds since_t0) { clock.SetMonotonicNs(since_t0.count()); };
  CollectorMetrics m({f.col.get(), nullptr, nullptr, nullptr}, &clock);
  m.Tick();  // 0 messages at t0
  EXPECT_TRUE(Has("\n" + m.Render(), "lockstep_collector_messages_per_second 0"));
  for (uint64_t i = 0; i < 10; ++i) f.Send(lockstep::testing::Heartbeat(lockstep::testing::At("r", 0, i), 0, 0));
  f.WaitAccepted(10);
  at(std::chrono::seconds(2));
  EXPECT_TRUE(Has("\n" + m.Render(), "lockstep_collector_messages_per_second 5"));
  // Ticks every second for longer than the window: t0 leaves it, the rate is over
  // the last 10 s only, during which nothing arrived.
  for (int s = 1; s <= 12; ++s) {
    at(std::chrono::seconds(s));
    m.Tick();
  }
  at(std::chrono::milliseconds(12500));
  EXPECT_TRUE(Has("\n" + m.Render(), "lockstep_collector_messages_per_second 0"));
}

// The step-end decoder's figures: steps closed by the agent's StepEnd, rows a StepEnd
// counted that never arrived, and a job restarted under the same run id (its repeated
// step numbers counted, not compared).
TEST(CollectorMetrics, ShowsStepEndClosesMissingRecordsAndRestarts) {
  lockstep::FakeClock clock;
  LiveAnalyzer live(std::make_unique<Analyzer>(AnalyzerOptions{}, [](alerting::Alert) {}, &clock));
  Fixture f(&live);
  uint64_t seq = 0;
  auto head = [&](uint64_t session) {
    Head h = lockstep::testing::At("run-s", 0, seq++);
    h.minor = kStepEndMinor;
    h.session = session;
    return h;
  };
  const std::vector<std::pair<uint32_t, std::string>> dir = {{0, "a"}, {1, "b"}, {2, "c"}};
  auto step = [&](uint64_t session, uint64_t s, uint32_t sent, uint64_t counted) {
    f.Send(lockstep::testing::Stats(head(session), s, sent));
    f.Send(lockstep::testing::Scalars(head(session), s, 1.0));
    f.Send(lockstep::testing::StepEnd(head(session), s, counted));
  };
  f.Send(lockstep::testing::Hello(head(11), "exp", wire::Role::Candidate));
  f.Send(lockstep::testing::Directory(head(11), dir));
  step(11, 0, 3, 3);
  step(11, 1, 2, 3);  // one of step 1's three records lost on the way
  step(11, 2, 3, 3);
  f.Send(lockstep::testing::Goodbye(head(11), 2));
  // The job runs again under the same run id, numbering its steps from 0 again.
  f.Send(lockstep::testing::Hello(head(12), "exp", wire::Role::Candidate));
  f.Send(lockstep::testing::Directory(head(12), dir));
  step(12, 0, 3, 3);
  step(12, 1, 3, 3);
  step(12, 2, 3, 3);
  step(12, 3, 3, 3);  // new: decoded as usual
  f.WaitReceived(seq);
  // The analyzer runs on the ingest thread after the collector counted the message.
  auto analyzed = [&] {
    uint64_t n = 0;
    live.Inspect([&](const Analyzer& a) { n = a.counters().messages; });
    return n;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (analyzed() < seq && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(analyzed(), seq);

  CollectorMetrics m({f.col.get(), &live, nullptr, nullptr}, &clock);
  std::string t = "\n" + m.Render();
  EXPECT_TRUE(Has(t, "# TYPE lockstep_analyzer_steps_closed_at_step_end_total counter")) << t;
  EXPECT_TRUE(Has(t, "lockstep_analyzer_steps_closed_at_step_end_total 4")) << t;
  EXPECT_TRUE(Has(t, "lockstep_analyzer_records_missing_total 1")) << t;
  EXPECT_TRUE(Has(t, "lockstep_analyzer_restarts_total 1")) << t;
  EXPECT_TRUE(Has(t, "lockstep_analyzer_rewound_records_total 9")) << t;
}

TEST(CollectorMetrics, ServedOverHttp) {
  Fixture f;
  auto server = StartCollectorMetrics("127.0.0.1:0", {f.col.get(), nullptr, nullptr, &f.feed});
  ASSERT_TRUE(server.ok()) << server.status().message();
  auto r = lockstep::testing::HttpRequest((*server)->address(), "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("# TYPE lockstep_collector_messages_total counter\n"), std::string::npos);
}

// The sample value of `name` (no labels) in a scrape; -1 when absent.
double Value(const std::string& text, const std::string& name) {
  const auto at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(text.substr(at + name.size() + 2));
}

// The real retention thread thins a run's closed segments while /metrics is scraped over
// HTTP (TSan: the retention thread writes what the server's thread reads); the scrape
// shows what the pass left on disk.
TEST(CollectorMetrics, ShowsRetentionOverHttp) {
  Fixture f;
  lockstep::testing::TempDir data;
  {
    auto w = LogWriter::Open(runlog::LogPathFor(data.path(), "run-a"), true, 64 << 10, /*compress=*/false);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    (*w)->SetSegmentBytes(16 << 10);
    uint64_t seq = 0;
    auto put = [&](const Bytes& b) { ASSERT_TRUE((*w)->Append(b.data(), b.size(), 1000 + seq).ok()); };
    put(lockstep::testing::Hello(lockstep::testing::At("run-a", 0, seq++), "exp", wire::Role::Candidate));
    for (uint64_t s = 0; s < 600; ++s) {
      put(lockstep::testing::Stats(lockstep::testing::At("run-a", 0, seq++), s, 8));
      put(lockstep::testing::Scalars(lockstep::testing::At("run-a", 0, seq++), s, 1.0));
      ASSERT_TRUE((*w)->Flush().ok());
    }
  }
  RetentionOptions o;
  o.data_dir = data.path();
  o.retain_steps = 100;
  o.thin_every = 10;
  o.max_disk_bytes = 1 << 30;
  o.interval_ms = 5;
  Retention ret(o);
  ret.KeepSteps("exp", 50, 59);
  auto server = StartCollectorMetrics("127.0.0.1:0", {f.col.get(), nullptr, nullptr, &f.feed, &ret});
  ASSERT_TRUE(server.ok()) << server.status().message();
  auto scrape = [&] { return "\n" + lockstep::testing::HttpRequest((*server)->address(), "/metrics").body; };
  std::string t = scrape();
  EXPECT_TRUE(Has(t, "lockstep_retention_thinned_segments_total 0")) << t;
  EXPECT_TRUE(Has(t, "lockstep_retention_pass_duration_seconds_count 0")) << t;
  ret.Start();
  // Two passes after the one that thinned: the figures are settled.
  ASSERT_TRUE(lockstep::testing::WaitFor([&] {
    t = scrape();
    return Value(t, "lockstep_retention_thinned_segments_total") > 0 &&
           Value(t, "lockstep_retention_pass_duration_seconds_count") >= 3;
  })) << t;
  ret.Shutdown();
  t = scrape();
  const RetentionCounters c = ret.counters();
  uint64_t on_disk = 0;
  for (const auto& e : std::filesystem::directory_iterator(data.path()))
    if (e.path().filename().string().find(".lslog") != std::string::npos) on_disk += e.file_size();
  EXPECT_TRUE(Has(t, "# TYPE lockstep_retention_log_bytes gauge")) << t;
  EXPECT_TRUE(Has(t, "lockstep_retention_log_bytes " + std::to_string(on_disk))) << t;
  EXPECT_TRUE(Has(t, "lockstep_retention_max_disk_bytes 1073741824")) << t;
  EXPECT_TRUE(Has(t, "lockstep_retention_over_max_disk 0")) << t;
  EXPECT_TRUE(Has(t, "# TYPE lockstep_retention_pass_duration_seconds summary")) << t;
  EXPECT_TRUE(Has(t, "lockstep_retention_pass_duration_seconds_count " + std::to_string(c.passes))) << t;
  EXPECT_TRUE(Has(t, "lockstep_retention_thinned_segments_total " + std::to_string(c.segments_thinned))) << t;
  EXPECT_TRUE(Has(t, "lockstep_retention_hollowed_messages_total " + std::to_string(c.messages_dropped))) << t;
  EXPECT_TRUE(Has(t, "lockstep_retention_reclaimed_bytes_total " + std::to_string(c.bytes_reclaimed))) << t;
  EXPECT_TRUE(Has(t, "lockstep_retention_compaction_failures_total 0")) << t;
  EXPECT_TRUE(Has(t, "lockstep_retention_stalled_pairs 0")) << t;  // no pairs
  EXPECT_TRUE(Has(t, "lockstep_retention_incident_kept_steps{experiment=\"exp\"} 10")) << t;
  // 8 of every 10 thinned steps hollowed (the 10th and the incident's are kept).
  EXPECT_GT(c.messages_dropped, 300u);
  EXPECT_GT(c.bytes_reclaimed, 0u);
}

// Without retention (no segments), its families are absent.
TEST(CollectorMetrics, NoRetentionFamiliesWhenItIsOff) {
  Fixture f;
  CollectorMetrics m({f.col.get(), nullptr, nullptr, &f.feed});
  EXPECT_EQ(m.Render().find("lockstep_retention_"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::collector::metrics
