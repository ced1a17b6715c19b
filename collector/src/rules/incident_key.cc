#include "rules/incident_key.h"

namespace lockstep::collector {

std::string IncidentKey(const alerting::Alert& a) {
  const std::string& r = a.rule;
  auto runs = [&] {
    std::string s;
    for (const auto& run : a.runs) s += "/" + run;
    return s;
  };
  if (r == "first_divergence" || r == "tensor_drift" || r == "trend" || r == "loss_drift")
    return "divergence/" + a.experiment + runs();
  if (r == "nonfinite" || r == "overflow" || r == "underflow" || r == "spike")
    return "numerics/" + a.experiment + runs();
  if (r == "setup" || r == "stall" || r == "replicas") return r + "/" + a.experiment + runs();
  return r + "/" + a.experiment;
}

}  // namespace lockstep::collector
