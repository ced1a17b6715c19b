// The ingest hot path does not allocate after warm-up: operator new is counted on the
// ingest thread (where sinks run) while steady-state messages flow through verify,
// log append, registry and sinks.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <thread>
#include <zmq.hpp>

#include "lockstep/collector/collector.h"
#include "test_dir.h"
#include "test_messages.h"

namespace {
thread_local bool t_counting = false;
std::atomic<uint64_t> g_allocs{0};
}  // namespace

// The whole set that a delete can meet, not only operator new(size_t): libzmq allocates
// with new (std::nothrow) and frees with delete. Left to the runtime, ASan's nothrow
// new then met this file's free()-based delete: an alloc-dealloc mismatch report.
void* operator new(size_t n) {
  if (t_counting) g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return ::operator new(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  if (t_counting) g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept { return ::operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace lockstep::collector {
namespace {

using testing::At;

// Turns counting on for the ingest thread after `warmup` messages and off after `end`.
class CountingSink : public MessageSink {
 public:
  CountingSink(uint64_t warmup, uint64_t end) : warmup_(warmup), end_(end) {}
  void OnMessage(const wire::Envelope&, int64_t) override {
    ++seen_;
    t_counting = seen_ > warmup_ && seen_ < end_;
    // One deliberate allocation inside the window: proves the counter sees this thread.
    if (seen_ == warmup_ + 1) ::operator delete(::operator new(16));
    done.store(seen_, std::memory_order_release);
  }
  std::atomic<uint64_t> done{0};

 private:
  uint64_t seen_ = 0, warmup_, end_;
};

TEST(IngestHotPath, NoAllocationPerMessageAfterWarmUp) {
  testing::TempDir dir;
  CollectorOptions o;
  o.listen = {"tcp://127.0.0.1:*"};
  o.data_dir = dir.path();
  o.fsync_interval_ms = 1000000;  // no fsync inside the window (it does not allocate either)
  auto c = Collector::Create(o);
  ASSERT_TRUE(c.ok());
  constexpr uint64_t kWarm = 200, kN = 3000;
  CountingSink sink(kWarm, kN);
  ASSERT_TRUE((*c)->AddSink(&sink).ok());
  ASSERT_TRUE((*c)->Start().ok());
  zmq::context_t ctx;
  zmq::socket_t push(ctx, zmq::socket_type::push);
  push.connect((*c)->endpoints()[0]);
  // Two runs, two ranks, stats/scalars/heartbeats, misaligned sizes: the mix an agent sends.
  std::vector<testing::Bytes> msgs;
  for (uint64_t s = 0; s < kN; ++s) {
    std::string run = s % 2 ? "alloc-a" : "alloc-b";
    uint32_t rank = static_cast<uint32_t>(s % 4 / 2);
    uint64_t seq = s / 4;
    if (s % 5 == 0) msgs.push_back(testing::Heartbeat(At(run, rank, seq), 0, 1, seq));
    else if (s % 5 == 1) msgs.push_back(testing::Scalars(At(run, rank, seq), seq, 1.0));
    else msgs.push_back(testing::Stats(At(run, rank, seq), seq, 1 + s % 7, 32, 16));
  }
  for (const auto& m : msgs) push.send(zmq::buffer(m.data(), m.size()), zmq::send_flags::none);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (sink.done.load(std::memory_order_acquire) < kN && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  ASSERT_EQ(sink.done.load(), kN);
  ASSERT_TRUE((*c)->Shutdown(std::chrono::seconds(5)).ok());
  EXPECT_EQ((*c)->counters().accepted, kN);
  // Exactly the sink's own canary allocation: nothing from verify, log, registry.
  EXPECT_EQ(g_allocs.load(), 1u) << "operator new calls on the ingest thread in steady state";
}

}  // namespace
}  // namespace lockstep::collector
