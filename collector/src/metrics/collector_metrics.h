// CollectorMetrics: renders everything `lockstep collect` knows as one Prometheus
// scrape (docs/metrics.md lists every metric), and StartCollectorMetrics() serves it.
//
// Sources are read, never waited on: Collector::counters() (atomics), the Registry
// snapshot (its mutex, for a copy), Dispatcher::Counters() (atomics), MetricsFeed
// and Retention (their mutexes, for a copy; retention holds its own only to add to
// its counters or note an incident's steps) and the analyzer through LiveAnalyzer::Inspect(), which
// holds the analyzer's mutex for one Reports() copy — the only moment a scrape can
// delay the ingest thread (metrics_bench measures it).
//
// Threads: Tick() and Render() on one thread (the metrics server's). The sources must
// outlive this object; collector is required, the others may be null (not shown).
#ifndef LOCKSTEP_COLLECTOR_METRICS_COLLECTOR_METRICS_H_
#define LOCKSTEP_COLLECTOR_METRICS_COLLECTOR_METRICS_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "lockstep/common/clock.h"
#include "lockstep/common/status.h"

namespace lockstep::alerting {
class Dispatcher;
}

namespace lockstep::collector {
class Collector;
struct CollectorCounters;
class LiveAnalyzer;
class Retention;
}  // namespace lockstep::collector

namespace lockstep::collector::metrics {

class MetricsFeed;
class MetricsServer;
class TextWriter;

struct MetricsSources {
  const Collector* collector = nullptr;
  const LiveAnalyzer* analyzer = nullptr;
  const alerting::Dispatcher* dispatcher = nullptr;
  const MetricsFeed* feed = nullptr;
  const Retention* retention = nullptr;  // null: retention is off (no segments)
};

class CollectorMetrics {
 public:
  // `clock` (null: the real one) times the rate window (monotonic) and the last-seen
  // ages (unix); tests inject a FakeClock, which must outlive this.
  explicit CollectorMetrics(MetricsSources sources, const Clock* clock = nullptr);

  // Samples the ingest counters for the messages/s and records/s gauges (a sliding
  // window of kRateWindow). Call about once a second.
  void Tick();
  // The whole scrape: one small renderer per source (collector_metrics.cc), in order.
  std::string Render();

  static constexpr std::chrono::seconds kRateWindow{10};

 private:
  std::chrono::steady_clock::time_point SteadyNow() const {
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(clock_->NowMonotonicNs()));
  }

  // The messages/s, records/s and bytes/s gauges over the window.
  void RenderRates(TextWriter& w, const CollectorCounters& counters) const;

  struct RateSample {
    std::chrono::steady_clock::time_point t;
    uint64_t messages, records, bytes;
  };

  MetricsSources src_;
  const Clock* clock_;
  int64_t start_unix_ns_;
  std::deque<RateSample> window_;
};

// Binds `listen` ("127.0.0.1:9464", "[::1]:0", "localhost:9464"; port 0 picks a free
// one) and serves CollectorMetrics over HTTP on its own thread, ticking it every
// second. InvalidArgument for a malformed address, Unavailable when it cannot bind;
// each one sentence naming --metrics-listen.
// `page`, when given, answers the other GET paths (MetricsServerHandlers::page); `action`,
// when given, the POSTs from this machine (MetricsServerHandlers::action).
StatusOr<std::unique_ptr<MetricsServer>> StartCollectorMetrics(
    const std::string& listen, MetricsSources sources,
    std::function<bool(std::string_view, std::string*, std::string*)> page = nullptr,
    std::function<int(std::string_view, std::string*)> action = nullptr);

}  // namespace lockstep::collector::metrics

#endif  // LOCKSTEP_COLLECTOR_METRICS_COLLECTOR_METRICS_H_
