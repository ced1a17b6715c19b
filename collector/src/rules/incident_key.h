// Which incident an alert belongs to (docs/alerting.md "Incidents"): the detectors
// know which alerts one cause explains, so they name the incident; the alerting sinks
// group by that key, as Alertmanager groups by labels.
//
//   divergence/<experiment>/<baseline>/<candidate>   first_divergence, tensor_drift,
//       trend, loss_drift of one pair: a first divergence, the drift downstream of it
//       (later in execution order or at later steps) and the loss it moves;
//   numerics/<experiment>/<run>                      nonfinite, overflow, underflow,
//       spike of one run: a NaN onset and the tensors it reaches, the overflow that
//       led to it, the loss turning non-finite;
//   setup/<experiment>/<baseline>/<candidate>        setup (fingerprint differences);
//   stall/<experiment>/<run>                         stall;
//   <rule>/<experiment>                              anything else.
//
// Pure; any thread.
#ifndef LOCKSTEP_COLLECTOR_RULES_INCIDENT_KEY_H_
#define LOCKSTEP_COLLECTOR_RULES_INCIDENT_KEY_H_

#include <string>

#include "lockstep/alerting/alert.h"

namespace lockstep::collector {

std::string IncidentKey(const alerting::Alert& a);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RULES_INCIDENT_KEY_H_
