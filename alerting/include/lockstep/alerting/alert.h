// The alert: what a detector found, in the form every sink formats (DESIGN.md
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

struct Alert {
  std::string id;          // unique per alert instance (e.g. dedup key + first step)
  std::string rule;        // "first_divergence", "nonfinite", "overflow", ...
  Severity severity = Severity::kWarning;
  std::string experiment;
  std::vector<std::string> runs;  // the run(s) involved: [run] or [baseline, candidate]
  uint64_t step = 0;
  uint32_t rank = 0;
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
  // Derived again from the run logs when a restarted collector replays them: a sink
  // drops it if its journal shows it handled this alert before the restart.
  bool replayed = false;

  // Receivers may dedup on this too: rule/experiment/tensor (DESIGN.md).
  std::string DedupKey() const { return rule + "/" + experiment + "/" + tensor; }
};

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_ALERT_H_
