// MetricsFeed: the figures /metrics needs that nobody else keeps — step times per
// (run, rank) from StepScalars, and alerts fired by (experiment, rule, severity).
//
// `lockstep collect` adds it as a MessageSink (ingest thread) and calls OnAlert from
// the analyzer's AlertFn (ingest or analyzer timer thread). StepTimes()/Alerts() are
// read by the metrics server thread. One mutex, held for a map update or a copy;
// nothing else is locked while it is held. Step times are live only: messages
// replayed from the run logs at start-up do not pass through sinks.
#ifndef LOCKSTEP_COLLECTOR_METRICS_METRICS_FEED_H_
#define LOCKSTEP_COLLECTOR_METRICS_METRICS_FEED_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lockstep/collector/message_sink.h"
#include "lockstep/alerting/alert.h"

namespace lockstep::collector::metrics {

struct StepTimeFigures {
  std::string run;
  uint32_t rank = 0;
  double last_s = 0;    // step_time_s of the latest StepScalars
  double sum_s = 0;     // over every StepScalars with a finite, non-negative step time
  uint64_t count = 0;
};

struct AlertCount {
  std::string experiment, rule, severity;
  uint64_t count = 0;
};

class MetricsFeed : public MessageSink {
 public:
  MetricsFeed() = default;
  MetricsFeed(const MetricsFeed&) = delete;
  MetricsFeed& operator=(const MetricsFeed&) = delete;

  void OnMessage(const wire::Envelope& env, int64_t recv_unix_ns) override;
  void OnAlert(const alerting::Alert& alert);

  // Copies, sorted by (run, rank) / (experiment, rule, severity).
  std::vector<StepTimeFigures> StepTimes() const;
  std::vector<AlertCount> Alerts() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, uint32_t>, StepTimeFigures, std::less<>> steps_;
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t> alerts_;
};

}  // namespace lockstep::collector::metrics

#endif  // LOCKSTEP_COLLECTOR_METRICS_METRICS_FEED_H_
