// BufferPool and the zero-copy send path: blocks are reused (so large messages do not
// re-fault fresh memory), the cache is bounded, and a block handed to ZeroMQ comes back
// exactly once, whether the message was sent or refused.
#include "transport/buffer_pool.h"

#include <gtest/gtest.h>
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transport/zmq_transport.h"

namespace lockstep::testing {
namespace {

TEST(BufferPool, ReleasedBlockIsReusedForAnyRequestItFits) {
  BufferPool pool(4);
  uint8_t* a = pool.Acquire(1000);
  std::memset(a, 1, 1000);
  pool.Release(a);
  EXPECT_EQ(pool.cached(), 1u);
  EXPECT_EQ(pool.Acquire(500), a) << "a smaller request takes the cached block";
  uint8_t* big = pool.Acquire(5000);
  EXPECT_NE(big, a) << "a block too small for the request is not handed out";
  pool.Release(a);
  pool.Release(big);
  EXPECT_EQ(pool.Acquire(4000), big);
  pool.Release(big);
}

TEST(BufferPool, CacheIsBoundedAndExtraBlocksAreFreed) {
  BufferPool pool(2);
  std::vector<uint8_t*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(pool.Acquire(64));
  for (uint8_t* b : blocks) pool.Release(b);
  EXPECT_EQ(pool.cached(), 2u);
}

TEST(BufferPool, WaitForRoomCountsBlocksOutUntilTheyComeBack) {
  BufferPool pool(4, 3000);
  EXPECT_TRUE(pool.WaitForRoom(5000, std::chrono::steady_clock::now()))
      << "with nothing out, one message larger than the budget may go";
  uint8_t* a = pool.Acquire(1000);
  uint8_t* b = pool.Acquire(1000);
  EXPECT_EQ(pool.outstanding_bytes(), 2000u);
  EXPECT_TRUE(pool.WaitForRoom(1000, std::chrono::steady_clock::now()));
  EXPECT_FALSE(pool.WaitForRoom(1500, std::chrono::steady_clock::now() + std::chrono::milliseconds(20)));
  std::thread giver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pool.Release(a);  // as ZeroMQ's I/O thread does once the bytes are out
  });
  EXPECT_TRUE(pool.WaitForRoom(1500, std::chrono::steady_clock::now() + std::chrono::seconds(10)));
  giver.join();
  EXPECT_EQ(pool.outstanding_bytes(), 1000u);
  pool.Release(b);
  EXPECT_EQ(pool.outstanding_bytes(), 0u);
}

struct Counted {
  BufferPool* pool;
  std::atomic<int> releases{0};
};

void CountingRelease(void* data, void* hint) {
  TakeBackFromZmq(hint);  // as every zmq_free_fn given to ZmqTransport::SendOwned must
  auto* c = static_cast<Counted*>(hint);
  c->releases.fetch_add(1);
  c->pool->Release(static_cast<uint8_t*>(data));
}

TEST(ZmqTransportOwned, LargeMessageArrivesIntactAndItsBlockComesBackOnce) {
  void* ctx = zmq_ctx_new();
  void* pull = zmq_socket(ctx, ZMQ_PULL);
  ASSERT_EQ(zmq_bind(pull, "tcp://127.0.0.1:*"), 0);
  char ep[256];
  size_t len = sizeof ep;
  zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, ep, &len);
  ZmqTransportOptions o;
  o.endpoint = ep;
  auto t = ZmqTransport::Create(o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();

  BufferPool pool(4);
  Counted counted{&pool};
  constexpr size_t kSize = 300 * 1024;
  uint8_t* block = pool.Acquire(kSize);
  for (size_t i = 0; i < kSize; ++i) block[i] = static_cast<uint8_t>(i * 7);
  ASSERT_EQ((*t)->SendOwned(block, kSize, &CountingRelease, &counted), Transport::SendResult::kSent);

  zmq_msg_t msg;
  zmq_msg_init(&msg);
  int timeout_ms = 10000;
  zmq_setsockopt(pull, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
  ASSERT_EQ(zmq_msg_recv(&msg, pull, 0), static_cast<int>(kSize));
  const auto* got = static_cast<const uint8_t*>(zmq_msg_data(&msg));
  size_t bad = 0;
  for (size_t i = 0; i < kSize; ++i) bad += got[i] != static_cast<uint8_t>(i * 7);
  EXPECT_EQ(bad, 0u);
  zmq_msg_close(&msg);

  // The I/O thread releases the block once the bytes are written: poll with a deadline.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (counted.releases.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  (*t)->Close(std::chrono::milliseconds(0));
  EXPECT_EQ(counted.releases.load(), 1);
  EXPECT_EQ(pool.cached(), 1u);
  EXPECT_EQ(pool.Acquire(kSize), block) << "the sent block is reused";
  pool.Release(block);
  zmq_close(pull);
  zmq_ctx_term(ctx);
}

TEST(ZmqTransportOwned, RefusedMessageReleasesItsBlockAtOnce) {
  ZmqTransportOptions o;
  o.endpoint = "tcp://127.0.0.1:1";  // nobody there; the message would queue
  auto t = ZmqTransport::Create(o);
  ASSERT_TRUE(t.ok());
  (*t)->Close(std::chrono::milliseconds(0));
  BufferPool pool(4);
  Counted counted{&pool};
  uint8_t* block = pool.Acquire(64 * 1024);
  EXPECT_EQ((*t)->SendOwned(block, 64 * 1024, &CountingRelease, &counted),
            Transport::SendResult::kError);
  EXPECT_EQ(counted.releases.load(), 1);
  EXPECT_EQ(pool.cached(), 1u);
}

}  // namespace
}  // namespace lockstep::testing
