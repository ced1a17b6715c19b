// The control channel on real ZeroMQ sockets (docs/design.md "The control channel"):
// the test binds the collector's two sockets (an XPUB for requests, a PULL for the
// agent's messages) on ephemeral loopback ports, an Agent connects to both, and the
// requests it takes and the answers it puts on the wire are checked.
#include <gtest/gtest.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "agent_test_util.h"
#include "lockstep/common/control_endpoint.h"

namespace lockstep::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string Bound(void* sock) {
  char buf[256];
  size_t len = sizeof buf;
  zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, buf, &len);
  return buf;
}

struct Collector {
  void* ctx = zmq_ctx_new();
  void* pull = zmq_socket(ctx, ZMQ_PULL);
  void* pub = zmq_socket(ctx, ZMQ_XPUB);
  std::string ingest, control;
  Collector() {
    int linger = 0;
    zmq_setsockopt(pull, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(pub, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(pull, "tcp://127.0.0.1:*") == 0) ingest = Bound(pull);
    if (zmq_bind(pub, "tcp://127.0.0.1:*") == 0) control = Bound(pub);
  }
  ~Collector() {
    zmq_close(pull);
    zmq_close(pub);
    zmq_ctx_term(ctx);
  }
  // Waits for the agent's subscription (so nothing published is lost to the slow joiner).
  bool WaitSubscribed(milliseconds timeout) {
    zmq_pollitem_t item{pub, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, static_cast<long>(timeout.count())) <= 0) return false;
    char b[16];
    return zmq_recv(pub, b, sizeof b, 0) >= 1 && b[0] == 1;
  }
  void Publish(const std::string& frame) { zmq_send(pub, frame.data(), frame.size(), 0); }
  // The agent's ControlAck messages received within `timeout`, until `n` of them.
  std::vector<std::vector<uint8_t>> Acks(size_t n, milliseconds timeout) {
    std::vector<std::vector<uint8_t>> out;
    const auto deadline = Clock::now() + timeout;
    while (out.size() < n && Clock::now() < deadline) {
      zmq_pollitem_t item{pull, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 50) <= 0) continue;
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, pull, 0) >= 0) {
        auto* d = static_cast<uint8_t*>(zmq_msg_data(&msg));
        std::vector<uint8_t> m(d, d + zmq_msg_size(&msg));
        if (Verify(m) && wire::GetEnvelope(m.data())->body_type() == wire::Body::ControlAck) out.push_back(m);
      }
      zmq_msg_close(&msg);
    }
    return out;
  }
};

std::string Request(uint64_t id, const std::string& action, const std::string& run = "", int32_t rank = -1,
                    const std::string& experiment = "", uint16_t major = kSchemaMajor) {
  flatbuffers::FlatBufferBuilder fbb;
  auto r = wire::CreateControlRequest(fbb, major, id, fbb.CreateString(experiment), fbb.CreateString(run), rank,
                                      fbb.CreateString(action), fbb.CreateString("blocks.1.attn"), 7, 3, 0);
  fbb.Finish(r);
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
}

const wire::ControlAck* AckOf(const std::vector<uint8_t>& m) {
  return wire::GetEnvelope(m.data())->body_as_ControlAck();
}

// Requests until the agent has taken `n`, publishing `frames` again every 50 ms (as the
// collector does until answered), or until the deadline.
std::vector<ControlRequest> TakeUntil(Agent* agent, Collector* col, const std::vector<std::string>& frames,
                                      size_t n, milliseconds timeout) {
  std::vector<ControlRequest> got;
  const auto deadline = Clock::now() + timeout;
  while (got.size() < n && Clock::now() < deadline) {
    for (const auto& f : frames) col->Publish(f);
    std::this_thread::sleep_for(milliseconds(50));
    for (auto& r : agent->TakeRequests()) got.push_back(std::move(r));
  }
  return got;
}

class ControlChannel : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(col_.ingest.empty());
    ASSERT_FALSE(col_.control.empty());
    AgentOptions o = TestOptions();
    o.endpoint = col_.ingest;
    o.control_endpoint = col_.control;
    o.experiment = "exp";
    auto created = Agent::Create(o);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    agent_ = std::move(created).value();
    ASSERT_TRUE(col_.WaitSubscribed(milliseconds(10000)));
  }
  void TearDown() override {
    if (agent_) agent_->Close(milliseconds(2000));
  }
  Collector col_;
  std::unique_ptr<Agent> agent_;
};

TEST_F(ControlChannel, ARequestIsTakenOnceAndAnsweredReceivedThenDone) {
  const std::string run = agent_->options().run;
  EXPECT_FALSE(agent_->HasRequests());
  auto got = TakeUntil(agent_.get(), &col_, {Request(42, "zoom", run)}, 1, milliseconds(10000));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].id, 42u);
  EXPECT_EQ(got[0].action, "zoom");
  EXPECT_EQ(got[0].target, "blocks.1.attn");
  EXPECT_EQ(got[0].step, 7u);
  EXPECT_EQ(got[0].steps, 3u);
  // Published again and again: taken once.
  for (int i = 0; i < 5; ++i) col_.Publish(Request(42, "zoom", run));
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_TRUE(agent_->TakeRequests().empty());
  EXPECT_FALSE(agent_->HasRequests());
  ASSERT_TRUE(agent_->Acknowledge(42, AckStatus::kDone, 7, "zoom blocks.1.attn steps 7..9"));
  auto acks = col_.Acks(2, milliseconds(10000));
  ASSERT_EQ(acks.size(), 2u);
  EXPECT_EQ(AckOf(acks[0])->id(), 42u);
  EXPECT_EQ(AckOf(acks[0])->status(), wire::AckStatus::Received);
  EXPECT_EQ(AckOf(acks[1])->status(), wire::AckStatus::Done);
  EXPECT_EQ(AckOf(acks[1])->step(), 7u);
  EXPECT_EQ(AckOf(acks[1])->detail()->str(), "zoom blocks.1.attn steps 7..9");
  EXPECT_EQ(agent_->Counters().requests_received, 1u);
}

// "sample" (the collector's --sample-quiet) is an action the agent knows: taken and
// handed to the job with its step and stride, not ignored.
TEST_F(ControlChannel, ASampleRequestIsTakenNotIgnored) {
  const std::string run = agent_->options().run;
  auto got = TakeUntil(agent_.get(), &col_, {Request(43, "sample", run)}, 1, milliseconds(10000));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].action, "sample");
  EXPECT_EQ(got[0].step, 7u);
  EXPECT_EQ(got[0].steps, 3u);
  EXPECT_EQ(agent_->Counters().requests_ignored, 0u);
}

TEST_F(ControlChannel, RequestsForOthersAreNotTakenAndUnknownActionsAreIgnoredAloud) {
  const std::string run = agent_->options().run;
  // The agent is rank 1 of run test-run in experiment exp (TestOptions). Another run,
  // another rank, another experiment: not ours. An unknown action for us:
  // ignored, counted and answered; a frame that is no request: counted as bad.
  std::vector<std::string> frames = {Request(1, "zoom", "other-run"), Request(2, "zoom", run, 0),
                                     Request(3, "zoom", "", -1, "other-exp"), Request(4, "dance", run),
                                     std::string("not a flatbuffer"), Request(6, "zoom", run, -1, "", 2),
                                     Request(5, "capture", "", 1, "exp")};
  auto got = TakeUntil(agent_.get(), &col_, frames, 1, milliseconds(10000));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].id, 5u);
  EXPECT_EQ(got[0].action, "capture");
  AgentCounters c = agent_->Counters();
  EXPECT_EQ(c.requests_received, 1u);
  EXPECT_EQ(c.requests_ignored, 1u);
  EXPECT_GE(c.requests_bad, 2u);  // the text and the request of schema major 2, at least once each
  auto acks = col_.Acks(2, milliseconds(10000));
  ASSERT_EQ(acks.size(), 2u);
  std::vector<std::pair<uint64_t, wire::AckStatus>> seen;
  for (const auto& m : acks) seen.emplace_back(AckOf(m)->id(), AckOf(m)->status());
  EXPECT_NE(std::find(seen.begin(), seen.end(), std::make_pair(uint64_t{4}, wire::AckStatus::Ignored)), seen.end());
  EXPECT_NE(std::find(seen.begin(), seen.end(), std::make_pair(uint64_t{5}, wire::AckStatus::Received)), seen.end());
}

TEST(ControlEndpoint, DerivedFromTheIngestEndpoint) {
  EXPECT_EQ(ControlEndpointFor("tcp://127.0.0.1:6200"), "tcp://127.0.0.1:6202");
  EXPECT_EQ(ControlEndpointFor("tcp://[::1]:7000"), "tcp://[::1]:7002");
  EXPECT_EQ(ControlEndpointFor("ipc:///tmp/ls.sock"), "ipc:///tmp/ls.sock.control");
  EXPECT_EQ(ControlEndpointFor("inproc://x"), "inproc://x.control");
  EXPECT_EQ(ControlEndpointFor("tcp://127.0.0.1:*"), "");
  EXPECT_EQ(ControlEndpointFor("tcp://127.0.0.1:65534"), "");
  EXPECT_EQ(ControlEndpointFor("tcp://host"), "");
  EXPECT_EQ(ControlEndpointFor("udp://x:1"), "");
}

}  // namespace
}  // namespace lockstep::testing
