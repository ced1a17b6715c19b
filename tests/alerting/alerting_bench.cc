// alerting_bench: how fast an alert reaches a receiver, and whether a slow receiver
// slows the thread that submits alerts. Prints BENCH lines last.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/alerting/dispatcher.h"
#include "test_server.h"
#include "test_util.h"

using namespace std::chrono_literals;
using lockstep::alerting::AlertingOptions;
using lockstep::alerting::Dispatcher;
namespace t = lockstep::alerting::testing;
using Clock = std::chrono::steady_clock;

namespace {

// alert_e2e_ms_p99: for 300 alerts submitted one at a time (each after the previous
// one arrived, so no queueing), the 99th percentile of (time the local HTTP receiver
// has parsed the request) - (time just before Dispatcher::Submit), in ms. Generic
// webhook format over plain HTTP on loopback, a new TCP connection per alert.
double E2eP99Ms() {
  t::TestServer srv;
  AlertingOptions o;
  o.sinks.push_back(t::HttpSink("webhook", srv.Url()));
  o.dedup_cooldown = 0ms;
  auto d = std::move(Dispatcher::Create(o).value());
  constexpr int kN = 300;
  std::vector<double> ms;
  for (int i = 0; i < kN; ++i) {
    auto a = t::SampleAlert("e" + std::to_string(i));
    auto t0 = Clock::now();
    d->Submit(a);
    if (!srv.WaitFor(i + 1, 5s)) {
      std::fprintf(stderr, "alert %d never arrived\n", i);
      return -1;
    }
    ms.push_back(std::chrono::duration<double, std::milli>(srv.Requests()[i].at - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("alert e2e over %d alerts: p50 %.3f ms, p99 %.3f ms, max %.3f ms\n", kN, ms[kN / 2],
              ms[kN * 99 / 100], ms.back());
  return ms[kN * 99 / 100];
}

// The ingest-like work of one message: checksum 4 KiB (a run-log append does about
// this much per record).
uint64_t IngestOne(const std::vector<uint8_t>& buf, uint64_t seed) {
  uint64_t h = seed;
  for (uint8_t b : buf) h = (h ^ b) * 1099511628211ull;
  return h;
}

// Messages per second of a thread that does IngestOne() in a loop and hands the
// dispatcher one alert every 1000 messages (a few hundred alerts a second — far
// above what detectors emit), for `dur`.
double IngestRate(Dispatcher* d, std::chrono::milliseconds dur) {
  std::vector<uint8_t> buf(4096, 7);
  uint64_t h = 0, n = 0;
  auto end = Clock::now() + dur;
  auto start = Clock::now();
  while (Clock::now() < end) {
    for (int i = 0; i < 1000; ++i) h = IngestOne(buf, h + n++);
    d->Submit(t::SampleAlert("i" + std::to_string(n), "t" + std::to_string(n % 50)));
  }
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  if (h == 42) std::printf(" ");  // keep the work observable
  return n / secs;
}

// ingest_slowdown_with_slow_webhook_ratio: IngestRate() with one webhook sink whose
// receiver takes 5 s per request, over IngestRate() with a dispatcher that has no
// sink; both measured in this run as 8 interleaved pairs of 250 ms, the figure is the
// median of the 8 per-pair ratios (robust to other processes on a shared machine).
// A proxy for the collector's ingest thread (it calls Submit the same way); 1.0 = no
// slowdown.
double SlowdownRatio() {
  t::TestServer slow;
  slow.SetDelay(5000ms);
  AlertingOptions with;
  with.sinks.push_back(t::HttpSink("webhook", slow.Url()));
  with.sinks[0].request_timeout = 10s;
  with.dedup_cooldown = 0ms;
  auto d_slow = std::move(Dispatcher::Create(with).value());
  auto d_none = std::move(Dispatcher::Create(AlertingOptions{}).value());
  std::vector<double> ratios;
  double none_sum = 0, slow_sum = 0;
  for (int round = 0; round < 8; ++round) {
    double none = IngestRate(d_none.get(), 250ms);
    double slowed = IngestRate(d_slow.get(), 250ms);
    none_sum += none;
    slow_sum += slowed;
    ratios.push_back(slowed / none);
  }
  std::sort(ratios.begin(), ratios.end());
  auto c = d_slow->Counters()[0];
  std::printf("ingest: %.0f msg/s without sinks, %.0f msg/s with a 5 s webhook (%llu alerts dropped at "
              "the full queue, %llu requests reached the receiver); per-pair ratios %.3f..%.3f\n",
              none_sum / 8, slow_sum / 8, static_cast<unsigned long long>(c.queue_dropped),
              static_cast<unsigned long long>(slow.Count()), ratios.front(), ratios.back());
  d_slow->Shutdown(10ms);
  return (ratios[3] + ratios[4]) / 2;
}

}  // namespace

int main() {
  double p99 = E2eP99Ms();
  double ratio = SlowdownRatio();
  std::printf("BENCH alert_e2e_ms_p99 %.3f ms\n", p99);
  std::printf("BENCH ingest_slowdown_with_slow_webhook_ratio %.3f ratio\n", ratio);
  return 0;
}
