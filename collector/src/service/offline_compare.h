// OfflineCompare: the one owner of the offline pipeline (docs/design.md "The offline
// pipeline"). `lockstep compare` and `lockstep report` each judge two recorded run logs;
// both come here, so they read, align, detect and judge the same way and give the
// same verdict (the live report page judges the live Analyzer's PairReport with the
// same JudgeCompare). The commands keep only their flags and their output.
//
// The pipeline: the baseline's log scanned whole (its extent, for the steps expected),
// then added to the Analyzer first (read again at the candidate's pace, so memory stays
// bounded for any log length; a candidate added before its baseline would wait for one),
// the candidate's log replayed in its recorded order, Finish(), the verdicts of the
// captures both runs replayed on their hosts (service/replay_verdict.h: the alerts the
// live collector sent), the pair's report and JudgeCompare's verdict. Runs on the caller's thread; nothing here prints.
#ifndef LOCKSTEP_COLLECTOR_SERVICE_OFFLINE_COMPARE_H_
#define LOCKSTEP_COLLECTOR_SERVICE_OFFLINE_COMPARE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "detect/analyzer.h"
#include "detect/compare_gate.h"
#include "lockstep/alerting/alert.h"
#include "lockstep/common/status.h"
#include "service/replay_verdict.h"

namespace lockstep::collector {

struct OfflineCompareSpec {
  std::string baseline_path, candidate_path;
  std::string experiment = "compare";  // the pair's label in alerts and the report
  // Take a log's run as this id ("" = its own): two recordings of one run id.
  std::string rename_baseline, rename_candidate;
  // Rules, name canonicalization, max_buffered_steps; idle_close_ns is set to 0
  // (offline, steps close on the data, never on a timer).
  AnalyzerOptions options;
  // Each alert as the Analyzer emits it (an alerts file, the report's recorder); may be empty.
  std::function<void(const alerting::Alert&)> on_alert;
  // Each compared (pair, rank, step), after the rules ran on it; may be empty.
  Analyzer::PairStepObserver on_pair_step;
};

struct OfflineComparison {
  std::string baseline_id, candidate_id;  // as compared (renames applied)
  LogScan baseline_scan, candidate_scan;
  std::vector<alerting::Alert> alerts;    // every alert, in emission order
  uint64_t alerts_critical = 0, alerts_warning = 0, alerts_info = 0;
  bool critical = false;                  // a critical alert was raised
  PairReport report;
  GateVerdict verdict;
  // The ops both runs replayed on their hosts (their ControlAck answers in the logs),
  // with the verdict each got; each is also a "replay" alert in `alerts`, as live.
  struct Replay {
    ReplayCase what;
    ReplayVerdict verdict;
  };
  std::vector<Replay> replays;
};

// Why an offline comparison could not be made: which of the commands' exit statuses it
// is, with one sentence.
enum class OfflineProblem { kNone, kBadInput, kSameRun };

// Compares the two logs of `spec`. On a problem returns it with *error set to one
// sentence: a log missing, unreadable or holding no message (kBadInput); both logs
// holding one run id (kSameRun: "both logs hold run X", the command says what to do).
OfflineProblem CompareRunLogs(OfflineCompareSpec spec, OfflineComparison* out, std::string* error);

// The run id of a log (from its first message that names one), or a one-sentence error.
StatusOr<std::string> RunIdOfLog(const std::string& path);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_SERVICE_OFFLINE_COMPARE_H_
