// The alert: what a detector found, in the form every sink formats (docs/design.md
// "Alerting"). A plain value; copied into the dispatcher's queue.
#ifndef LOCKSTEP_ALERTING_ALERT_H_
#define LOCKSTEP_ALERTING_ALERT_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::alerting {

enum class Severity : uint8_t { kInfo = 0, kWarning = 1, kCritical = 2 };

inline const char* SeverityName(Severity s) {
  switch (s) {
    case Severity::kInfo: return "info";
    case Severity::kWarning: return "warning";
    case Severity::kCritical: return "critical";
  }
  return "unknown";
}

// One fact of an incident as its notifications list it: the alert that opened it and
// every critical alert that brought news (a first divergence, a NaN onset and its
// producer, the loss turning non-finite).
struct IncidentFact {
  std::string rule;
  Severity severity = Severity::kWarning;
  uint64_t step = 0;
  std::string run;     // the run it is about (the candidate for a pair rule)
  std::string tensor;
  std::string kind;
  std::string message;
};

struct Alert {
  std::string id;          // unique per alert instance (e.g. dedup key + first step)
  std::string rule;        // "first_divergence", "nonfinite", "overflow", ...
  Severity severity = Severity::kWarning;
  std::string experiment;
  std::vector<std::string> runs;  // the run(s) involved: [run] or [baseline, candidate]
  uint64_t step = 0;
  uint32_t rank = 0;
  uint32_t micro_step = 0; // the tensor's micro step within the step (0 without accumulation)
  std::string tensor;      // canonical tensor name ("" for run-level rules)
  std::string kind;        // "act", "act_grad", "param_grad", "param", "optim", "loss", ""
  double baseline_value = std::nan("");   // the value in each run (NaN if not applicable)
  double candidate_value = std::nan("");
  std::string metric;      // name of the error metric, e.g. "rel_err_l2", "cosine"
  double error = std::nan("");            // its value
  double threshold = std::nan("");        // the threshold it crossed
  int64_t first_seen_unix_ns = 0;
  uint64_t repeat_count = 1;              // times seen while deduplicated
  std::string message;     // one human line
  // first_divergence: its likely cause (docs/rules.md "Causes"): "config", "weights",
  // "data", "precision", "op" or "unknown"; "" for other rules.
  std::string cause;
  // Derived again from the run logs when a restarted collector replays them: a sink
  // drops it if its journal shows it handled this alert before the restart.
  bool replayed = false;

  // The incident it belongs to (docs/alerting.md "Incidents"): alerts that one cause
  // explains share this key, set by the detectors (collector/src/rules/incident_key.h),
  // and a grouping sink notifies per incident, not per alert. "" = an incident of its own.
  std::string incident;
  // Set only on a notification a grouping sink makes of an incident: "opened",
  // "escalated", "update" (the digest), "resolved"; then severity is the incident's,
  // incident_alerts counts the alerts grouped so far and facts lists its facts.
  std::string notification;
  uint64_t incident_alerts = 0;
  std::vector<IncidentFact> facts;

  // Receivers may dedup on this too (docs/design.md "Alerting", docs/alerting.md "Dedup"):
  // rule/experiment/run/tensor/kind/rank<N>, then /micro<M> for micro step M > 0, the
  // run being the candidate for a pair rule. One finding per (run, tensor, kind, rank,
  // micro step): the same tensor drifting on two ranks, as an activation and as its
  // gradient, or in two micro batches of one accumulated step, is two findings, never
  // one swallowing the other (the rules judge each micro step's tensor apart, so a
  // sink's cooldown must too). Micro step 0 adds nothing, so a job without gradient
  // accumulation keeps the keys it always had. The id is this key @ step, so ids never
  // repeat across ranks or micro steps.
  std::string DedupKey() const {
    std::string k = rule + "/" + experiment + "/" + (runs.empty() ? std::string() : runs.back()) + "/" + tensor +
                    "/" + kind + "/rank" + std::to_string(rank);
    if (micro_step != 0) k += "/micro" + std::to_string(micro_step);
    return k;
  }
};

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_ALERT_H_
