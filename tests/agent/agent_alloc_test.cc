// The hot path does not allocate after warm-up (docs/design.md "Rules for the agent"):
// this binary replaces the global operator new to count allocations per thread.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>

#include "agent_test_util.h"

namespace {
thread_local uint64_t t_allocations = 0;
}  // namespace

void* operator new(std::size_t n) {
  ++t_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  ++t_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  ++t_allocations;
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  ++t_allocations;
  return std::malloc(n ? n : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace lockstep::testing {
namespace {

TEST(AgentAlloc, CountingWorks) {
  uint64_t before = t_allocations;
  // volatile: the pointer escapes, so the compiler cannot elide the new/delete pair
  // (GCC does at -O1 under -fsanitize=thread, and the count stays 0).
  int* volatile p = new int(3);
  delete p;
  EXPECT_EQ(t_allocations - before, 1u) << "the replaced operator new is not in use";
}

TEST(AgentAlloc, RecordPathDoesNotAllocateAfterWarmUp) {
  AgentOptions o = TestOptions();
  o.queue_capacity = 4096;
  o.max_records_per_message = 64;
  Made m = MakeAgent(o);
  ASSERT_NE(m.agent, nullptr);
  uint32_t id = m.agent->RegisterTensor("w", TensorKind::kAct, DType::kF32, {1}, 0);
  TensorStats s = MakeStats(1.0);
  StepScalars sc;
  sc.loss = 1;
  // Warm-up: this thread's producer token, and the queue's blocks for this producer.
  for (int i = 0; i < 64; ++i) m.agent->RecordStats(0, 0, id, 0, s);
  ASSERT_TRUE(m.agent->Flush(std::chrono::milliseconds(10000)));

  uint64_t before = t_allocations;
  uint64_t ok = 0;
  for (uint64_t step = 1; step <= 200; ++step) {
    for (int i = 0; i < 50; ++i) ok += m.agent->RecordStats(step, 0, id, i, s);
    ok += m.agent->RecordScalars(step, sc);
    ok += m.agent->EndStep(step);
  }
  uint64_t after = t_allocations;
  EXPECT_EQ(after - before, 0u) << "RecordStats/RecordScalars/EndStep allocated on the calling thread";
  EXPECT_GT(ok, 1000u);
  // Full queue (refusals) does not allocate either.
  auto state = std::make_shared<FakeState>();
  state->gate_open = false;
  o.queue_capacity = 128;
  Made blocked = MakeAgent(o, state);
  ASSERT_TRUE(state->WaitInSend());
  blocked.agent->RecordStats(0, 0, 0, 0, s);  // warm-up: token
  before = t_allocations;
  uint64_t refused = 0;
  for (int i = 0; i < 1000; ++i) refused += !blocked.agent->RecordStats(0, 0, 0, 0, s);
  EXPECT_EQ(t_allocations - before, 0u);
  EXPECT_GT(refused, 800u);
  state->OpenGate();
}

}  // namespace
}  // namespace lockstep::testing
