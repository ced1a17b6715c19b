// A real ZeroMQ round trip: Agent::Create -> PUSH -> a PULL bound on an ephemeral
// loopback port; every message is checked with the flatbuffers Verifier and decoded.
#include <gtest/gtest.h>
#include <zmq.h>

#include <chrono>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "../time_scale.h"
#include "agent_test_util.h"

namespace lockstep::testing {
namespace {

struct Pull {
  void* ctx = zmq_ctx_new();
  void* sock = zmq_socket(ctx, ZMQ_PULL);
  std::string endpoint;
  Pull() {
    int linger = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(sock, "tcp://127.0.0.1:*") == 0) {
      char buf[256];
      size_t len = sizeof buf;
      zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, buf, &len);
      endpoint = buf;
    }
  }
  ~Pull() {
    zmq_close(sock);
    zmq_ctx_term(ctx);
  }
  // Receives until a Goodbye or the deadline.
  std::vector<std::vector<uint8_t>> ReceiveUntilGoodbye(std::chrono::milliseconds timeout) {
    std::vector<std::vector<uint8_t>> out;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      zmq_pollitem_t item{sock, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 100) <= 0) continue;
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, sock, 0) < 0) break;
      auto* d = static_cast<uint8_t*>(zmq_msg_data(&msg));
      out.emplace_back(d, d + zmq_msg_size(&msg));
      zmq_msg_close(&msg);
      if (Verify(out.back()) && wire::GetEnvelope(out.back().data())->body_type() == wire::Body::Goodbye) break;
    }
    return out;
  }
};

TEST(ZmqLoopback, AgentMessagesArriveVerifiedAndInOrder) {
  Pull pull;
  ASSERT_FALSE(pull.endpoint.empty());
  AgentOptions o = TestOptions();
  o.endpoint = pull.endpoint;
  o.max_records_per_message = 16;
  auto created = Agent::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  auto agent = std::move(created).value();
  std::vector<uint32_t> ids;
  for (int t = 0; t < 40; ++t) {
    ids.push_back(agent->RegisterTensor("layer." + std::to_string(t), TensorKind::kAct, DType::kBF16, {4, 4}, t));
  }
  for (uint64_t step = 0; step < 5; ++step) {
    for (int t = 0; t < 40; ++t) ASSERT_TRUE(agent->RecordStats(step, 0, ids[t], t, MakeStats(t)));
    StepScalars sc;
    sc.loss = 1.0 / (step + 1);
    ASSERT_TRUE(agent->RecordScalars(step, sc));
    ASSERT_TRUE(agent->EndStep(step));
  }
  ASSERT_TRUE(agent->Close(std::chrono::milliseconds(5000)));
  AgentCounters c = agent->Counters();

  auto msgs = pull.ReceiveUntilGoodbye(std::chrono::milliseconds(10000));
  ASSERT_FALSE(msgs.empty());
  uint64_t records = 0, seq = 0;
  size_t scalars = 0, dir_entries = 0;
  for (const auto& bytes : msgs) {
    ASSERT_TRUE(Verify(bytes));
    const auto* env = wire::GetEnvelope(bytes.data());
    EXPECT_EQ(env->seq(), seq++) << "no gap and no reordering on one connection";
    EXPECT_EQ(env->run_id()->str(), "test-run");
    if (auto* s = env->body_as_StepStats()) {
      EXPECT_LE(s->stats()->size(), 16u);
      EXPECT_EQ(dir_entries, 40u) << "the directory precedes the stats";
      records += s->stats()->size();
    }
    if (auto* d = env->body_as_TensorDirectory()) dir_entries += d->tensors()->size();
    if (env->body_as_StepScalars()) ++scalars;
  }
  EXPECT_EQ(wire::GetEnvelope(msgs.front().data())->body_type(), wire::Body::Hello);
  EXPECT_EQ(wire::GetEnvelope(msgs.back().data())->body_type(), wire::Body::Goodbye);
  EXPECT_EQ(records, 200u);
  EXPECT_EQ(scalars, 5u);
  EXPECT_EQ(c.records_sent, 200u);
  EXPECT_EQ(c.messages_sent, msgs.size());
}

TEST(ZmqLoopback, LargeBatchesGoOutZeroCopyAndArriveIntact) {
  // 1000 records of one step make a ~300 KiB StepStats message: the pooled, zero-copy
  // path. Three steps reuse the pool's blocks while earlier ones may still be in flight.
  Pull pull;
  ASSERT_FALSE(pull.endpoint.empty());
  AgentOptions o = TestOptions();
  o.endpoint = pull.endpoint;
  o.queue_capacity = 4096;
  o.max_records_per_message = 1024;
  auto created = Agent::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  auto agent = std::move(created).value();
  ASSERT_EQ(agent->RegisterTensor("w", TensorKind::kAct, DType::kBF16, {4}, 0), 0u);
  for (uint64_t step = 0; step < 3; ++step) {
    for (int t = 0; t < 1000; ++t) ASSERT_TRUE(agent->RecordStats(step, 0, 0, t, MakeStats(step * 1000 + t)));
    ASSERT_TRUE(agent->EndStep(step));
  }
  // Scaled: under TSan, ZeroMQ's copies of ~1 MiB go through its interceptors, and
  // what the linger (3/4 of Close's budget) cannot deliver is dropped.
  ASSERT_TRUE(agent->Close(Scaled(std::chrono::milliseconds(5000))));
  auto msgs = pull.ReceiveUntilGoodbye(Scaled(std::chrono::milliseconds(10000)));
  uint64_t records = 0;
  size_t large = 0;
  for (const auto& bytes : msgs) {
    ASSERT_TRUE(Verify(bytes));
    const auto* s = wire::GetEnvelope(bytes.data())->body_as_StepStats();
    if (s == nullptr) continue;
    large += bytes.size() > 256 * 1024;
    ASSERT_EQ(s->sketch_k(), kDefaultSketchK);
    for (uint32_t i = 0; i < s->stats()->size(); ++i) {
      double v = static_cast<double>(s->step() * 1000 + s->stats()->Get(i)->order());
      ASSERT_EQ(s->stats()->Get(i)->max(), v);
      ASSERT_EQ(s->sketch()->Get(i * kDefaultSketchK + 5), static_cast<float>(v + 5));
      ASSERT_EQ(s->hist()->Get(i * kHistBins + 3), 3u);
    }
    records += s->stats()->size();
  }
  EXPECT_EQ(records, 3000u);
  EXPECT_EQ(large, 3u) << "one message per step";
}

TEST(ZmqLoopback, CloseWithoutACollectorReturnsWithinItsTimeout) {
  // A port that nobody listens on: bind and close a PULL to learn a free one.
  std::string endpoint;
  {
    Pull p;
    endpoint = p.endpoint;
  }
  AgentOptions o = TestOptions();
  o.endpoint = endpoint;
  auto created = Agent::Create(o);
  ASSERT_TRUE(created.ok());
  auto agent = std::move(created).value();
  for (int i = 0; i < 100; ++i) agent->RecordStats(0, 0, 0, 0, MakeStats(i));
  auto t0 = std::chrono::steady_clock::now();
  // Scaled too: the sender lingers 3/4 of the budget, and the last quarter (75 ms
  // unscaled) must cover a loaded, sanitized thread's wake-up and zmq_ctx_term.
  EXPECT_TRUE(agent->Close(Scaled(std::chrono::milliseconds(300))));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, Scaled(std::chrono::milliseconds(1000)));
  EXPECT_EQ(agent->Counters().records_sent, 100u) << "queued in the socket, as designed";
}


// --- delivery warning: real sockets, a short window -------------------------------

// A socket of `type` bound on an ephemeral loopback port (ZMQ_PUB: what the collector's
// view feed is).
struct Bound {
  void* ctx = zmq_ctx_new();
  void* sock;
  std::string endpoint;
  explicit Bound(int type) : sock(zmq_socket(ctx, type)) {
    int linger = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(sock, "tcp://127.0.0.1:*") == 0) {
      char buf[256];
      size_t len = sizeof buf;
      zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, buf, &len);
      endpoint = buf;
    }
  }
  ~Bound() {
    zmq_close(sock);
    zmq_ctx_term(ctx);
  }
};

// Polls DeliveryProblem() until it is set or `timeout` passes (the sender decides on
// its own thread after delivery_warn_after; nothing to flush).
std::string WaitForProblem(Agent& a, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string p;
  while ((p = a.DeliveryProblem()).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return p;
}

std::unique_ptr<Agent> AgentAt(const std::string& endpoint) {
  AgentOptions o = TestOptions();
  o.endpoint = endpoint;
  o.delivery_warn_after = std::chrono::milliseconds(300);
  auto created = Agent::Create(o);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  return created.ok() ? std::move(*created) : nullptr;
}

TEST(ZmqDelivery, ClosedPortIsReportedOnceNamingTheEndpoint) {
  std::string endpoint;
  {
    Bound gone(ZMQ_PULL);  // bound then closed: nothing listens there any more
    endpoint = gone.endpoint;
  }
  auto a = AgentAt(endpoint);
  ASSERT_NE(a, nullptr);
  const std::string p = WaitForProblem(*a, std::chrono::seconds(5));
  EXPECT_NE(p.find(endpoint), std::string::npos) << p;
  EXPECT_NE(p.find("no connection could be made"), std::string::npos) << p;
  EXPECT_TRUE(a->Counters().delivery_problem);
  EXPECT_EQ(a->Counters().handshakes, 0u);
  a->Close(std::chrono::milliseconds(200));
}

TEST(ZmqDelivery, APubPeerFailsTheHandshakeAndIsReported) {
  Bound pub(ZMQ_PUB);
  ASSERT_FALSE(pub.endpoint.empty());
  auto a = AgentAt(pub.endpoint);
  ASSERT_NE(a, nullptr);
  const std::string p = WaitForProblem(*a, std::chrono::seconds(5));
  EXPECT_NE(p.find(pub.endpoint), std::string::npos) << p;
  EXPECT_NE(p.find("refused the ZeroMQ handshake"), std::string::npos) << p;
  EXPECT_GE(a->Counters().handshake_failures, 1u);
  a->Close(std::chrono::milliseconds(200));
}

TEST(ZmqDelivery, ACollectorsPullSocketIsNotReported) {
  Pull pull;
  auto a = AgentAt(pull.endpoint);
  ASSERT_NE(a, nullptr);
  // Past the window: the handshake succeeded, so nothing is said.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (a->Counters().handshakes == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(a->Counters().handshakes, 1u);
  EXPECT_EQ(WaitForProblem(*a, std::chrono::milliseconds(600)), "");
  EXPECT_FALSE(a->Counters().delivery_problem);
  a->Close(std::chrono::milliseconds(500));
}

}  // namespace
}  // namespace lockstep::testing
