// metrics_bench: what one /metrics scrape costs a busy collector.
//
// An in-process collector daemon (CollectService: ingest, analyzer, metrics feed, as
// `lockstep collect` wires them; no view feed, no /metrics server, no status lines) is
// fed over loopback ZeroMQ by a baseline and a candidate run of kRanks ranks x kTensors tensors x kSteps steps, so
// the registry, the pair reports and the step times are all populated. Then the
// scrape is rendered kReps times. Figures are printed last as BENCH lines.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "detect/analyzer.h"
#include "detect/live_analyzer.h"
#include "lockstep/collector/collector.h"
#include "metrics/collector_metrics.h"
#include "service/collect_service.h"
#include "test_dir.h"
#include "test_messages.h"

namespace {

using namespace lockstep;
using namespace lockstep::collector;
using SteadyClock = std::chrono::steady_clock;

constexpr uint32_t kRanks = 8, kTensors = 1024, kSteps = 5;
constexpr int kReps = 51;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  lockstep::testing::TempDir dir;
  CollectOptions o;
  o.ingest.listen = {"tcp://127.0.0.1:*"};
  o.ingest.data_dir = dir.path();
  o.ingest.rebuild_from_logs = false;
  o.view_listen = "";     // the scrape is rendered below, without HTTP
  o.metrics_listen = "";
  o.status_interval_s = 0;
  auto svc = CollectService::Create(o);
  Status started = svc.ok() ? (*svc)->Start() : svc.status();
  if (!started.ok()) {
    std::fprintf(stderr, "metrics_bench: %s\n", started.message().c_str());
    return 1;
  }
  const Collector& c = (*svc)->collector();
  const LiveAnalyzer& live = (*svc)->analyzer();

  std::vector<std::pair<uint32_t, std::string>> dir_entries;
  for (uint32_t i = 0; i < kTensors; ++i) dir_entries.emplace_back(i, "layers." + std::to_string(i / 8) + ".op" + std::to_string(i % 8));
  zmq::context_t ctx;
  zmq::socket_t push(ctx, zmq::socket_type::push);
  push.set(zmq::sockopt::sndhwm, 0);
  push.set(zmq::sockopt::linger, 10000);
  push.connect(c.endpoints()[0]);
  uint64_t sent = 0;
  auto send = [&](const lockstep::testing::Bytes& b) {
    push.send(zmq::buffer(b.data(), b.size()), zmq::send_flags::none);
    ++sent;
  };
  for (const char* run : {"base", "cand"}) {
    auto role = std::string(run) == "base" ? wire::Role::Baseline : wire::Role::Candidate;
    for (uint32_t r = 0; r < kRanks; ++r) {
      uint64_t seq = 0;
      send(lockstep::testing::Hello(lockstep::testing::At(run, r, seq++), "bench", role, 100 + r));
      send(lockstep::testing::Directory(lockstep::testing::At(run, r, seq++), dir_entries));
      for (uint64_t s = 0; s < kSteps; ++s) {
        send(lockstep::testing::Stats(lockstep::testing::At(run, r, seq++), s, kTensors));
        send(lockstep::testing::Scalars(lockstep::testing::At(run, r, seq++), s, 1.0 + s));
      }
    }
  }
  auto deadline = SteadyClock::now() + std::chrono::seconds(60);
  while (c.counters().received < sent && SteadyClock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  uint64_t compared = 0;
  while (SteadyClock::now() < deadline) {
    live.Inspect([&](const Analyzer& a) { compared = a.counters().steps_compared; });
    if (compared >= kRanks * (kSteps - 1)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (compared == 0) {
    std::fprintf(stderr, "metrics_bench: the analyzer compared no steps\n");
    return 1;
  }

  metrics::CollectorMetrics m({&c, &live, nullptr, &(*svc)->metrics_feed()});
  m.Tick();
  std::vector<double> render_us, lock_us;
  size_t bytes = 0;
  for (int i = 0; i < kReps; ++i) {
    auto t0 = SteadyClock::now();
    std::string body = m.Render();
    render_us.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count());
    bytes = body.size();
    // The part of a scrape that holds the analyzer's mutex (and so can delay the
    // ingest thread's next analyzer call): Inspect() around one Reports() copy, as
    // Render() does it.
    auto t1 = SteadyClock::now();
    live.Inspect([](const Analyzer& a) { (void)a.Reports(); });
    lock_us.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t1).count());
  }
  (void)(*svc)->Shutdown();

  std::printf("scrape of %u ranks x 2 runs, %u matched tensors, %llu compared (rank, step)s\n", kRanks, kTensors,
              static_cast<unsigned long long>(compared));
  // Median wall time of one CollectorMetrics::Render() (the whole /metrics body,
  // without HTTP), over kReps renders.
  std::printf("BENCH metrics_render_us_p50 %.1f us\n", Median(render_us));
  // Median time the analyzer's mutex is held by one scrape (Inspect + Reports copy).
  std::printf("BENCH metrics_analyzer_lock_us_p50 %.1f us\n", Median(lock_us));
  // Size of the scrape body.
  std::printf("BENCH metrics_scrape_bytes %zu bytes\n", bytes);
  return 0;
}
