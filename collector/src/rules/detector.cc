#include "rules/detector.h"

#include "rules/incident_key.h"

namespace lockstep::collector {

const alerting::Alert& AlertEmitter::Emit(alerting::Alert a) {
  a.id = a.DedupKey() + "@" + std::to_string(a.step);
  if (a.incident.empty()) a.incident = IncidentKey(a);
  if (a.first_seen_unix_ns == 0) a.first_seen_unix_ns = Now();
  ++by_rule_[a.rule];
  ++by_severity_[static_cast<int>(a.severity)];
  ++total_;
  last_ = a;
  if (fn_) fn_(std::move(a));
  return last_;
}

}  // namespace lockstep::collector
