#include "metrics/metrics_feed.h"

#include <cmath>

#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::collector::metrics {

void MetricsFeed::OnMessage(const wire::Envelope& env, int64_t /*recv_unix_ns*/) {
  if (env.body_type() != wire::Body::StepScalars) return;
  const auto* s = env.body_as_StepScalars();
  const double t = s->step_time_s();
  // An agent that does not time its steps sends 0 or NaN: not a step time.
  if (!std::isfinite(t) || t <= 0) return;
  std::string run = env.run_id() != nullptr ? env.run_id()->str() : std::string();
  std::lock_guard<std::mutex> l(mu_);
  auto key = std::make_pair(std::move(run), env.rank());
  auto it = steps_.find(key);
  if (it == steps_.end()) {
    it = steps_.emplace(key, StepTimeFigures{}).first;
    it->second.run = key.first;
    it->second.rank = key.second;
  }
  it->second.last_s = t;
  it->second.sum_s += t;
  ++it->second.count;
}

void MetricsFeed::OnAlert(const alerting::Alert& a) {
  std::lock_guard<std::mutex> l(mu_);
  ++alerts_[{a.experiment, a.rule, alerting::SeverityName(a.severity)}];
}

std::vector<StepTimeFigures> MetricsFeed::StepTimes() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<StepTimeFigures> out;
  out.reserve(steps_.size());
  for (const auto& [k, v] : steps_) out.push_back(v);
  return out;
}

std::vector<AlertCount> MetricsFeed::Alerts() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<AlertCount> out;
  out.reserve(alerts_.size());
  for (const auto& [k, n] : alerts_) out.push_back({std::get<0>(k), std::get<1>(k), std::get<2>(k), n});
  return out;
}

}  // namespace lockstep::collector::metrics
