// collector_bench: what the collector alone sustains, and what its checksum costs.
//
// An in-process Collector (tcp loopback, logs in a temp dir, fsync every second as by
// default) is fed pre-built envelopes by a PUSH socket on this thread, as fast as
// ZeroMQ takes them; the clock stops when the collector has verified and logged the
// last one (counters().accepted). Sender, ZeroMQ I/O thread and ingest thread share
// the machine's cores, as they would with a local agent.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "lockstep/common/envelope_check.h"
#include "lockstep/collector/collector.h"
#include "runlog/crc32c.h"
#include "test_dir.h"
#include "test_messages.h"

namespace lockstep {
namespace {

using SteadyClock = std::chrono::steady_clock;
using testing::At;
using testing::Bytes;

struct Ingest {
  double seconds = 0;
  uint64_t messages = 0, records = 0, bytes = 0;
};

// Sends `msgs` (cycled, with fresh sequence numbers baked in) `n` times in all.
Ingest RunIngest(const std::vector<Bytes>& msgs, uint64_t n) {
  testing::TempDir dir;
  collector::CollectorOptions o;
  o.listen = {"tcp://127.0.0.1:*"};
  o.data_dir = dir.path();
  auto c = collector::Collector::Create(o);
  if (!c.ok() || !(*c)->Start().ok()) {
    std::fprintf(stderr, "collector_bench: %s\n", c.status().ToString().c_str());
    std::exit(1);
  }
  zmq::context_t ctx;
  zmq::socket_t push(ctx, zmq::socket_type::push);
  push.set(zmq::sockopt::sndhwm, 100000);
  push.connect((*c)->endpoints()[0]);
  auto t0 = SteadyClock::now();
  uint64_t bytes = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const Bytes& m = msgs[i % msgs.size()];
    push.send(zmq::buffer(m.data(), m.size()), zmq::send_flags::none);
    bytes += m.size();
  }
  while ((*c)->counters().accepted + (*c)->counters().rejected < n) std::this_thread::yield();
  auto t1 = SteadyClock::now();
  (void)(*c)->Shutdown(std::chrono::seconds(10));
  Ingest r;
  r.seconds = std::chrono::duration<double>(t1 - t0).count();
  r.messages = (*c)->counters().accepted;
  r.records = (*c)->counters().records;
  r.bytes = bytes;
  if ((*c)->counters().rejected != 0) std::fprintf(stderr, "collector_bench: rejections!\n");
  return r;
}

// The same bytes through a bare PUSH/PULL pair (received and dropped): the ceiling
// ZeroMQ itself sets on this machine, measured in the same run.
double RunRawSeconds(const std::vector<Bytes>& msgs, uint64_t n) {
  // Two contexts (two I/O threads), as between the bench's sender and the Collector.
  zmq::context_t ctx, rctx;
  zmq::socket_t pull(rctx, zmq::socket_type::pull);
  pull.set(zmq::sockopt::rcvhwm, 100000);
  pull.bind("tcp://127.0.0.1:*");
  std::string ep = pull.get(zmq::sockopt::last_endpoint);
  std::thread receiver([&] {
    zmq::message_t m;
    for (uint64_t i = 0; i < n; ++i) (void)pull.recv(m, zmq::recv_flags::none);
  });
  zmq::socket_t push(ctx, zmq::socket_type::push);
  push.set(zmq::sockopt::sndhwm, 100000);
  push.connect(ep);
  auto t0 = SteadyClock::now();
  for (uint64_t i = 0; i < n; ++i) {
    const Bytes& m = msgs[i % msgs.size()];
    push.send(zmq::buffer(m.data(), m.size()), zmq::send_flags::none);
  }
  receiver.join();
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

template <typename T, typename F>
T MedianOf3(F f) {
  T a = f(), b = f(), c = f();
  return std::max(std::min(a, b), std::min(std::max(a, b), c));
}

// GB/s of one CRC32C implementation over a 64 KiB buffer.
double CrcGbPerS(uint32_t (*fn)(uint32_t, const void*, size_t)) {
  std::vector<uint8_t> buf(64 << 10);
  std::mt19937 rng(3);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  uint32_t sink = 0;
  size_t total = 0;
  auto t0 = SteadyClock::now();
  while (SteadyClock::now() - t0 < std::chrono::milliseconds(300)) {
    for (int i = 0; i < 64; ++i) sink ^= fn(sink, buf.data(), buf.size());
    total += 64 * buf.size();
  }
  double s = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  if (sink == 0x12345678) std::puts("");  // keep the work observable
  return total / s / 1e9;
}

}  // namespace
}  // namespace lockstep

int main() {
  using namespace lockstep;
  // A realistic stats message: 64 tensors' records with a 32-wide sketch and 16
  // histogram bins each (~20 KB), as an agent batches one step of a small model.
  std::vector<testing::Bytes> big;
  for (uint64_t s = 0; s < 64; ++s) big.push_back(testing::Stats(At("bench", 0, s), s, 64, 32, 16));
  // Tiny messages: one record, no sketch: the per-message overhead.
  std::vector<testing::Bytes> small;
  for (uint64_t s = 0; s < 64; ++s) small.push_back(testing::Stats(At("bench-small", 0, s), s, 1, 0, 0));

  RunIngest(big, 500);  // warm-up: page cache, allocator, connections
  // The machine is shared (2 cores, other builds running): each figure is the median
  // of three runs, and the ratio to bare ZeroMQ is taken from runs side by side.
  std::vector<Ingest> runs;
  for (int i = 0; i < 3; ++i) runs.push_back(RunIngest(big, 8000));
  std::sort(runs.begin(), runs.end(), [](const Ingest& x, const Ingest& y) { return x.seconds < y.seconds; });
  Ingest b = runs[1];
  double raw_s = MedianOf3<double>([&] { return RunRawSeconds(big, 8000); });
  std::vector<Ingest> tiny;
  for (int i = 0; i < 3; ++i) tiny.push_back(RunIngest(small, 200000));
  std::sort(tiny.begin(), tiny.end(), [](const Ingest& x, const Ingest& y) { return x.seconds < y.seconds; });
  Ingest t = tiny[1];

  // Verification alone (CheckEnvelope on the ~20 KB message), ns per message.
  auto t0 = SteadyClock::now();
  uint64_t ok = 0;
  constexpr int kVerify = 20000;
  for (int i = 0; i < kVerify; ++i) {
    const auto& m = big[i % big.size()];
    ok += collector::CheckEnvelope(m.data(), m.size(), kMaxMessageBytes).reject == collector::Reject::kNone;
  }
  double verify_ns = std::chrono::duration<double, std::nano>(SteadyClock::now() - t0).count() / kVerify;

  double sw = CrcGbPerS(&collector::crc32c::ExtendSoftware);
  double hw = collector::crc32c::HardwareAvailable() ? CrcGbPerS(&collector::crc32c::ExtendHardware) : 0;

  std::printf("stats messages: %llu messages, %llu records, %.1f MB in %.3f s\n",
              (unsigned long long)b.messages, (unsigned long long)b.records, b.bytes / 1e6, b.seconds);
  std::printf("tiny messages: %llu messages in %.3f s; verify ok %llu\n",
              (unsigned long long)t.messages, t.seconds, (unsigned long long)ok);
  // Records (tensor statistics) verified and logged per second, 64-record messages.
  std::printf("BENCH collector_ingest_records_per_s %.0f records/s\n", b.records / b.seconds);
  // Messages verified and logged per second, 64-record (~20 KB) messages.
  std::printf("BENCH collector_ingest_messages_per_s %.0f msg/s\n", b.messages / b.seconds);
  // Envelope bytes verified and logged per second, 64-record messages.
  std::printf("BENCH collector_ingest_mb_per_s %.1f MB/s\n", b.bytes / 1e6 / b.seconds);
  // Collector throughput over bare PUSH/PULL throughput of the same 64-record messages.
  std::printf("BENCH collector_vs_raw_zmq_ratio %.2f x\n", raw_s / b.seconds);
  // Messages per second with one record each: the fixed cost per message.
  std::printf("BENCH collector_ingest_tiny_messages_per_s %.0f msg/s\n", t.messages / t.seconds);
  // CheckEnvelope (size, identifier, Verifier, major, run id) on one 64-record message.
  std::printf("BENCH collector_verify_ns_per_msg %.0f ns\n", verify_ns);
  // CRC32C throughput over a 64 KiB buffer: SSE4.2 instruction, table fallback, ratio.
  std::printf("BENCH crc32c_hw_gb_per_s %.2f GB/s\n", hw);
  std::printf("BENCH crc32c_sw_gb_per_s %.2f GB/s\n", sw);
  std::printf("BENCH crc32c_hw_vs_sw_ratio %.1f x\n", sw > 0 ? hw / sw : 0);
  return 0;
}
