// The agent's queue, overflow policy, exact counters, and Flush/Close deadlines,
// against a FakeTransport.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "../thread_names.h"
#include "../time_scale.h"
#include "agent_test_util.h"

namespace lockstep::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(AgentQueue, FullQueueDropsNewestAndCountsExactly) {
  AgentOptions o = TestOptions();
  o.queue_capacity = 256;
  o.max_records_per_message = 64;
  auto state = std::make_shared<FakeState>();
  state->gate_open = false;  // the sender blocks on its first message (Hello)
  Made m = MakeAgent(o, state);
  ASSERT_NE(m.agent, nullptr);
  ASSERT_TRUE(state->WaitInSend());
  uint32_t id = m.agent->RegisterTensor("layer.0", TensorKind::kAct, DType::kBF16, {4}, 0);
  ASSERT_EQ(id, 0u);

  const int kAttempts = 1000;
  int accepted = 0, refused = 0, first_refused = -1;
  for (int i = 0; i < kAttempts; ++i) {
    if (m.agent->RecordStats(0, static_cast<uint32_t>(i), id, 0, MakeStats(i))) {
      ++accepted;
      EXPECT_EQ(first_refused, -1) << "a record was accepted after one was refused";
    } else {
      ++refused;
      if (first_refused < 0) first_refused = i;
    }
  }
  // 256 slots hold the directory notice and the oldest records; the newest are refused.
  EXPECT_LE(accepted, 255);
  EXPECT_GE(accepted, 128);
  AgentCounters c = m.agent->Counters();
  EXPECT_EQ(c.records_enqueued, static_cast<uint64_t>(accepted));
  EXPECT_EQ(c.records_dropped, static_cast<uint64_t>(refused));
  EXPECT_EQ(c.records_sent, 0u);

  state->OpenGate();
  ASSERT_TRUE(m.agent->Flush(milliseconds(10000)));
  c = m.agent->Counters();
  auto msgs = state->Snapshot();
  EXPECT_EQ(c.records_sent, static_cast<uint64_t>(accepted));
  EXPECT_EQ(c.records_sent + c.records_dropped, static_cast<uint64_t>(kAttempts));
  EXPECT_EQ(Records(msgs, true), c.records_sent);
  EXPECT_EQ(c.messages_sent, Count(msgs, wire::Body::StepStats) + Count(msgs, wire::Body::Hello) +
                                 Count(msgs, wire::Body::TensorDirectory));
  // Drop-newest: what arrived is exactly records 0..accepted-1, in order.
  uint32_t next = 0;
  for (const auto& msg : msgs) {
    auto* s = msg.env()->body_as_StepStats();
    if (!s) continue;
    for (const auto* st : *s->stats()) EXPECT_EQ(st->micro_step(), next++);
  }
  EXPECT_EQ(next, static_cast<uint32_t>(accepted));
}

TEST(AgentQueue, RefusedMessagesCountTheirRecordsAsDropped) {
  AgentOptions o = TestOptions();
  o.max_records_per_message = 10;
  auto state = std::make_shared<FakeState>();
  // The socket refuses the stats of odd steps (as if at its HWM then).
  state->accept = [](size_t, const wire::Envelope& e) {
    auto* s = e.body_as_StepStats();
    return !(s && s->step() % 2 == 1);
  };
  Made m = MakeAgent(o, state);
  ASSERT_NE(m.agent, nullptr);
  uint32_t id = m.agent->RegisterTensor("w", TensorKind::kParamGrad, DType::kF32, {3}, 0);
  for (uint64_t step = 0; step < 10; ++step) {
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(m.agent->RecordStats(step, 0, id, 0, MakeStats(i)));
    ASSERT_TRUE(m.agent->EndStep(step));
  }
  ASSERT_TRUE(m.agent->Flush(milliseconds(10000)));
  AgentCounters c = m.agent->Counters();
  EXPECT_EQ(c.records_enqueued, 100u);
  EXPECT_EQ(c.records_sent, 50u);
  EXPECT_EQ(c.records_dropped, 50u);
  EXPECT_EQ(c.messages_dropped, 5u);
  auto msgs = state->Snapshot();
  EXPECT_EQ(Records(msgs, true), 50u);
  EXPECT_EQ(Records(msgs, false), 50u);
}

TEST(AgentQueue, SeqAdvancesOnlyForAcceptedMessages) {
  AgentOptions o = TestOptions();
  o.max_records_per_message = 1;
  auto state = std::make_shared<FakeState>();
  state->accept = [](size_t offer, const wire::Envelope&) { return offer % 3 != 2; };
  Made m = MakeAgent(o, state);
  ASSERT_NE(m.agent, nullptr);
  uint32_t id = m.agent->RegisterTensor("w", TensorKind::kAct, DType::kF32, {3}, 0);
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(m.agent->RecordStats(0, i, id, 0, MakeStats(i)));
  ASSERT_TRUE(m.agent->Flush(milliseconds(10000)));
  auto msgs = state->Snapshot();
  ASSERT_GE(msgs.size(), 30u);
  uint64_t expect = 0;
  size_t refused = 0;
  for (const auto& msg : msgs) {
    // A refused message carried the seq the next accepted one reuses.
    EXPECT_EQ(msg.env()->seq(), expect);
    EXPECT_EQ(msg.env()->run_id()->str(), "test-run");
    EXPECT_EQ(msg.env()->rank(), 1u);
    if (msg.accepted) ++expect; else ++refused;
  }
  EXPECT_GT(refused, 5u);
  EXPECT_EQ(m.agent->Counters().messages_sent, expect);
  EXPECT_EQ(m.agent->Counters().messages_dropped, refused);
}

TEST(AgentQueue, FlushAndCloseTimeOutWhenTheTransportHangs) {
  AgentOptions o = TestOptions();
  auto state = std::make_shared<FakeState>();
  state->gate_open = false;  // Send() never returns until the gate opens
  Made m = MakeAgent(o, state);
  ASSERT_NE(m.agent, nullptr);
  ASSERT_TRUE(state->WaitInSend());
  for (int i = 0; i < 10; ++i) m.agent->RecordStats(0, 0, 0, 0, MakeStats(i));

  auto t0 = Clock::now();
  EXPECT_FALSE(m.agent->Flush(milliseconds(50)));
  auto flush_took = Clock::now() - t0;
  EXPECT_GE(flush_took, milliseconds(50));
  EXPECT_LT(flush_took, Scaled(milliseconds(2000)));

  t0 = Clock::now();
  EXPECT_FALSE(m.agent->Close(milliseconds(100)));
  auto close_took = Clock::now() - t0;
  EXPECT_GE(close_took, milliseconds(100));
  EXPECT_LT(close_took, Scaled(milliseconds(2000)));
  EXPECT_FALSE(m.agent->RecordStats(0, 0, 0, 0, MakeStats(1))) << "closed agents refuse records";

  state->OpenGate();  // lets the sender finish so the destructor can join it
  EXPECT_TRUE(m.agent->Close(milliseconds(10000)));
  auto msgs = state->Snapshot();
  ASSERT_FALSE(msgs.empty());
  EXPECT_EQ(msgs.back().type(), wire::Body::Goodbye);
}

TEST(AgentQueue, FlushAndCloseReturnWhenTheTransportNeverAccepts) {
  AgentOptions o = TestOptions();
  auto state = std::make_shared<FakeState>();
  state->accept = [](size_t, const wire::Envelope&) { return false; };
  Made m = MakeAgent(o, state);
  ASSERT_NE(m.agent, nullptr);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(m.agent->RecordStats(0, 0, 0, 0, MakeStats(i)));
  m.agent->EndStep(0);
  auto t0 = Clock::now();
  EXPECT_TRUE(m.agent->Flush(milliseconds(5000)));
  EXPECT_TRUE(m.agent->Close(milliseconds(5000)));
  EXPECT_LT(Clock::now() - t0, Scaled(milliseconds(2000)));
  AgentCounters c = m.agent->Counters();
  EXPECT_EQ(c.records_sent, 0u);
  EXPECT_EQ(c.records_dropped, 100u);
  EXPECT_EQ(c.messages_sent, 0u);
  EXPECT_GE(c.messages_dropped, 3u);  // Hello, stats, heartbeat, goodbye at least
  EXPECT_TRUE(m.agent->Close(milliseconds(10))) << "Close is idempotent";
}

TEST(AgentQueue, RecordsAfterCloseAreRefusedAndCounted) {
  Made m = MakeAgent(TestOptions());
  ASSERT_NE(m.agent, nullptr);
  ASSERT_TRUE(m.agent->Close(milliseconds(5000)));
  EXPECT_FALSE(m.agent->RecordStats(0, 0, 0, 0, MakeStats(1)));
  EXPECT_FALSE(m.agent->RecordScalars(0, StepScalars{}));
  EXPECT_FALSE(m.agent->EndStep(0));
  AgentCounters c = m.agent->Counters();
  EXPECT_EQ(c.records_dropped, 1u);
  EXPECT_EQ(c.other_dropped, 2u);
  EXPECT_EQ(c.records_enqueued, 0u);
}

TEST(AgentQueue, BadOptionsGiveOneClearSentence) {
  AgentOptions o = TestOptions();
  o.run = "../escape";
  auto a = Agent::CreateWithTransport(o, std::make_unique<FakeTransport>(std::make_shared<FakeState>()));
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(a.status().IsInvalidArgument());
  EXPECT_NE(a.status().message().find("../escape"), std::string::npos);

  o = TestOptions();
  o.sketch_k = 1000;
  EXPECT_FALSE(Agent::CreateWithTransport(o, std::make_unique<FakeTransport>(std::make_shared<FakeState>())).ok());
  o = TestOptions();
  o.queue_capacity = 0;
  EXPECT_FALSE(Agent::CreateWithTransport(o, std::make_unique<FakeTransport>(std::make_shared<FakeState>())).ok());
  o = TestOptions();
  o.rank = 2;  // world_size 2
  EXPECT_FALSE(Agent::CreateWithTransport(o, std::make_unique<FakeTransport>(std::make_shared<FakeState>())).ok());
  o = TestOptions();
  o.send_buffer_bytes = 100000;  // below two full messages
  auto small = Agent::CreateWithTransport(o, std::make_unique<FakeTransport>(std::make_shared<FakeState>()));
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("send_buffer_bytes"), std::string::npos);
  EXPECT_NE(small.status().message().find("MiB"), std::string::npos);
  o.send_buffer_bytes = 0;  // no byte bound
  EXPECT_TRUE(Agent::CreateWithTransport(o, std::make_unique<FakeTransport>(std::make_shared<FakeState>())).ok());

  o = TestOptions();
  o.endpoint = "not-an-endpoint";
  auto z = Agent::Create(o);
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.status().message().find("not-an-endpoint"), std::string::npos);
  o.endpoint = "tcp://127.0.0.1";  // no port
  EXPECT_FALSE(Agent::Create(o).ok());
}

TEST(AgentQueue, TheSenderThreadIsNamedForTopAndDebuggers) {
  const int before = ThreadsNamed("lockstep-agent");
  {
    Made m = MakeAgent(TestOptions());
    ASSERT_NE(m.agent, nullptr);
    // The name is set by the thread itself as it starts. A Flush() with nothing queued
    // may return before the thread ran; one with a record waits for the thread to send it.
    ASSERT_TRUE(m.agent->RecordStats(0, 0, 0, 0, MakeStats(1.0)));
    ASSERT_TRUE(m.agent->Flush(std::chrono::seconds(10)));
    EXPECT_EQ(ThreadsNamed("lockstep-agent"), before + 1);
  }
  EXPECT_EQ(ThreadsNamed("lockstep-agent"), before);
}

TEST(AgentQueue, RegisterTensorIsIdempotentPerNameAndKind) {
  Made m = MakeAgent(TestOptions());
  ASSERT_NE(m.agent, nullptr);
  uint32_t a = m.agent->RegisterTensor("x", TensorKind::kAct, DType::kF32, {1}, 0);
  uint32_t b = m.agent->RegisterTensor("x", TensorKind::kActGrad, DType::kF32, {1}, 1);
  EXPECT_NE(a, b);
  EXPECT_EQ(m.agent->RegisterTensor("x", TensorKind::kAct, DType::kF32, {1}, 0), a);
  EXPECT_EQ(m.agent->RegisterTensor("", TensorKind::kAct, DType::kF32, {1}, 0), UINT32_MAX);
  EXPECT_EQ(m.agent->Counters().errors, 1u);
}

}  // namespace
}  // namespace lockstep::testing
