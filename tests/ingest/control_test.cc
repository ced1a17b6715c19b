// The collector's side of the control channel (docs/design.md "The control channel"):
// the bookkeeping of open requests (ControlRequests, with explicit times), and the
// in-process Collector with a real lockstep::Agent over loopback ZeroMQ, plain and with
// CURVE: a request reaches the agent it is for, the agent's answers settle it, and an
// agent without the collector's key gets nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ingest/control_requests.h"
#include "ingest/curve_keys.h"
#include "lockstep/agent/agent.h"
#include "lockstep/collector/collector.h"
#include "lockstep/schema/lockstep_generated.h"
#include "test_dir.h"
#include "wait_for.h"

namespace lockstep::collector {
namespace {

constexpr int64_t kMs = 1000000;

using testing::WaitFor;

ControlRequestSpec Zoom(const std::string& run) {
  ControlRequestSpec s;
  s.experiment = "exp";
  s.run = run;
  s.action = "zoom";
  s.target = "blocks.1.attn";
  s.step = 12;
  s.steps = 2;
  return s;
}

// An agent's answer as it arrives on the wire.
struct Ack {
  flatbuffers::FlatBufferBuilder fbb;
  Ack(uint64_t id, wire::AckStatus status) {
    fbb.Finish(wire::CreateControlAck(fbb, id, status, 12, fbb.CreateString("zoom blocks.1.attn steps 12..13")));
  }
  const wire::ControlAck& get() const { return *flatbuffers::GetRoot<wire::ControlAck>(fbb.GetBufferPointer()); }
};

TEST(ControlRequests, PublishedAtOnceThenEverySecondAndToEveryNewSubscriber) {
  ControlRequests r(1000 * kMs, 60000 * kMs, [](const std::string&) { return 2u; });
  const uint64_t id = r.Add(Zoom("run-a"), 0);
  auto due = r.Due(0, false);
  ASSERT_EQ(due.size(), 1u);
  const auto* req = flatbuffers::GetRoot<wire::ControlRequest>(due[0].data());
  EXPECT_EQ(req->id(), id);
  EXPECT_EQ(req->run_id()->str(), "run-a");
  EXPECT_EQ(req->action()->str(), "zoom");
  EXPECT_EQ(req->target()->str(), "blocks.1.attn");
  EXPECT_EQ(req->step(), 12u);
  EXPECT_EQ(req->rank(), -1);
  EXPECT_TRUE(r.Due(500 * kMs, false).empty());
  EXPECT_EQ(r.Due(600 * kMs, true).size(), 1u);  // a new subscriber: at once
  EXPECT_TRUE(r.Due(1000 * kMs, false).empty());
  EXPECT_EQ(r.Due(1600 * kMs, false).size(), 1u);
  EXPECT_EQ(r.Snapshot()[0].publications, 3u);
  EXPECT_NE(r.Add(Zoom("run-b"), 0), id);
}

TEST(ControlRequests, SettledWhenEveryRankAnsweredAndNotByReceivedAlone) {
  ControlRequests r(1000 * kMs, 60000 * kMs, [](const std::string&) { return 2u; });
  const uint64_t id = r.Add(Zoom("run-a"), 0);
  r.Due(0, false);
  r.OnAnswer("run-a", 0, Ack(id, wire::AckStatus::Received).get(), nullptr);
  r.OnAnswer("run-a", 1, Ack(id, wire::AckStatus::Received).get(), nullptr);
  EXPECT_FALSE(r.Snapshot()[0].settled);
  r.OnAnswer("run-a", 0, Ack(id, wire::AckStatus::Done).get(), nullptr);
  r.OnAnswer("run-a", 0, Ack(id, wire::AckStatus::Received).get(), nullptr);  // a late duplicate
  r.OnAnswer("run-b", 1, Ack(id, wire::AckStatus::Done).get(), nullptr);      // another run: not its answer
  EXPECT_FALSE(r.Snapshot()[0].settled);
  EXPECT_EQ(r.Snapshot()[0].answers[0].status, "done");
  r.OnAnswer("run-a", 1, Ack(id, wire::AckStatus::Refused).get(), nullptr);
  const auto st = r.Snapshot()[0];
  EXPECT_TRUE(st.settled);
  EXPECT_FALSE(st.expired);
  ASSERT_EQ(st.answers.size(), 2u);
  EXPECT_EQ(st.answers[1].status, "refused");
  EXPECT_EQ(st.answers[1].detail, "zoom blocks.1.attn steps 12..13");
  EXPECT_TRUE(r.Due(5000 * kMs, true).empty());  // settled: never again
}

TEST(ControlRequests, ExpiresUnanswered) {
  ControlRequests r(1000 * kMs, 3000 * kMs, [](const std::string&) { return 0u; });
  r.Add(Zoom("run-a"), 0);
  EXPECT_EQ(r.Due(0, false).size(), 1u);
  EXPECT_TRUE(r.Due(3000 * kMs, false).empty());
  EXPECT_TRUE(r.Snapshot()[0].expired);
}

struct Live {
  std::unique_ptr<Collector> collector;
  std::unique_ptr<Agent> agent;
  Live(const std::string& dir, const std::string& secret, const std::string& server_public) {
    CollectorOptions o;
    o.listen = {"tcp://127.0.0.1:*"};
    o.control_listen = "tcp://127.0.0.1:*";
    o.data_dir = dir;
    o.control_republish_ms = 50;
    o.curve.secret_key = secret;
    auto c = Collector::Create(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return;
    collector = std::move(*c);
    EXPECT_TRUE(collector->Start().ok());
    AgentOptions a;
    a.endpoint = collector->endpoints()[0];
    a.control_endpoint = collector->control_endpoint();
    a.run = "run-a";
    a.experiment = "exp";
    a.curve_server_key = server_public;
    auto made = Agent::Create(a);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    if (made.ok()) agent = std::move(*made);
  }
  ~Live() {
    if (agent) agent->Close(std::chrono::milliseconds(2000));
    if (collector) collector->Shutdown(std::chrono::seconds(2));
  }
};

void RoundTrip(Live* live) {
  ASSERT_TRUE(live->agent && live->collector);
  // The agent says Hello (its world size settles the request) before it is asked.
  ASSERT_TRUE(live->agent->EndStep(0));
  ASSERT_TRUE(WaitFor([&] { return !live->collector->registry().Snapshot().empty(); }));
  const uint64_t other = live->collector->Request(Zoom("run-b"));
  const uint64_t id = live->collector->Request(Zoom("run-a"));
  ASSERT_NE(id, 0u);
  std::vector<ControlRequest> got;
  ASSERT_TRUE(WaitFor([&] {
    for (auto& r : live->agent->TakeRequests()) got.push_back(std::move(r));
    return !got.empty();
  }));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].id, id);
  ASSERT_TRUE(live->agent->Acknowledge(id, AckStatus::kDone, 12, "zoom blocks.1.attn steps 12..13"));
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& r : live->collector->requests())
      if (r.id == id) return r.settled;
    return false;
  }));
  for (const auto& r : live->collector->requests()) {
    if (r.id == other) {
      EXPECT_FALSE(r.settled);
      EXPECT_TRUE(r.answers.empty());
    }
    if (r.id != id) continue;
    ASSERT_EQ(r.answers.size(), 1u);
    EXPECT_EQ(r.answers[0].status, "done");
    EXPECT_EQ(r.answers[0].step, 12u);
    EXPECT_GE(r.publications, 1u);
  }
}

TEST(ControlChannelLive, ARequestReachesItsAgentAndItsAnswerSettlesIt) {
  testing::TempDir dir;
  Live live(dir.path(), "", "");
  RoundTrip(&live);
}

TEST(ControlChannelLive, WithCurveTheSameKeysGuardBothSockets) {
  testing::TempDir dir;
  auto server = MakeCurveKeyPair();
  ASSERT_TRUE(server.ok());
  Live live(dir.path(), server->secret_key, server->public_key);
  RoundTrip(&live);
  // An agent that does not know the collector's key gets no requests.
  AgentOptions a;
  a.endpoint = live.collector->endpoints()[0];
  a.control_endpoint = live.collector->control_endpoint();
  a.run = "run-a";
  a.rank = 0;
  auto plain = Agent::Create(a);
  ASSERT_TRUE(plain.ok());
  live.collector->Request(Zoom("run-a"));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_TRUE((*plain)->TakeRequests().empty());
  EXPECT_EQ((*plain)->Counters().requests_received, 0u);
  (*plain)->Close(std::chrono::milliseconds(500));
}

}  // namespace
}  // namespace lockstep::collector
