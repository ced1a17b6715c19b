// The verdict of two runs' replays of their own captures of one op (docs/design.md "The
// control channel", docs/rules.md "replay").
//
// Each agent replays the capture it wrote against float64 of its own settings and sends
// what one run alone can know (SelfReplayResult: its error, digests of its settings,
// inputs and output). JudgeReplays combines the two with the meanings and words of
// `python -m lockstep replay` (agent/python/lockstep/_replay.py), as far as they reach:
//
// - different_functions (cause config): the settings digests differ;
// - less_accurate (names the run; cause precision when a dtype or precision setting
//   differs, else platform): one run's error is beyond the dtype's budget
//   (16 + sqrt(width) ULPs of the pair's finer dtype) and at least 4x the other's;
// - inconclusive: both beyond the budget, neither 4x the other;
// - identical: inputs and outputs bit-identical;
// - within_rounding: both within the budget on bit-identical inputs;
// - needs_both_files: what one run alone cannot decide (both accurate on inputs that
//   differ: is the op or its inputs the cause?; a run that did not replay): the message
//   keeps the replay command.
//
// FollowUp (live, from the agents' answers) and CompareRunLogs (offline, from the same
// answers in the run logs) both build the alert here, so the two agree. Pure functions.
#ifndef LOCKSTEP_COLLECTOR_SERVICE_REPLAY_VERDICT_H_
#define LOCKSTEP_COLLECTOR_SERVICE_REPLAY_VERDICT_H_

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "detect/compare_gate.h"
#include "lockstep/alerting/alert.h"
#include "lockstep/collector/control.h"

namespace lockstep::collector {

// One op captured by both runs of a pair at one step, and what each replay found.
struct ReplayCase {
  std::string experiment, baseline, candidate;  // run ids
  std::string row;                              // the op ("blocks.1.mlp/gelu#0")
  uint64_t step = 0;
  std::string file_b, file_c;                   // the capture files
  std::optional<SelfReplayResult> b, c;         // nullopt: that run sent none
  std::string why_missing;  // why a replay is missing (an older agent), for the message
  int64_t answered_unix_ns = 0;  // when the later replay was sent (offline: the alert's time)
};

struct ReplayVerdict {
  std::string verdict;        // the words of the header comment
  std::string cause;          // "config", "precision", "platform" or ""
  std::string less_accurate;  // "baseline" / "candidate" for less_accurate, else ""
  std::string pair_dtype;     // the finer of the two runs' coarsest dtypes
  double ulps_b = std::nan(""), ulps_c = std::nan("");  // error in ULPs of pair_dtype
  double budget = std::nan("");                          // ULPs its dtype explains
  std::string message;        // one line, as replay words it
};

// The multiplier and base of the budget, as `python -m lockstep replay`'s defaults.
inline constexpr double kReplayFactor = 4.0;
inline constexpr double kReplayUlps = 16.0;

ReplayVerdict JudgeReplays(const ReplayCase& rc);

// The "capture" alert's message (both runs answered with their files): the files and
// the replay command; when an agent is older than kSelfReplayMinor (`minor_b`,
// `minor_c`: the answering agents'), it sends no replay of its own, and the message says
// that the verdict needs both files.
std::string CaptureMessage(const ReplayCase& rc, uint16_t minor_b, uint16_t minor_c);

// The info alert (rule "replay") that puts the verdict on the pair's incident: metric =
// the verdict, baseline/candidate values = their ULPs, threshold = the budget.
// An info alert `rule` about rc's op: its runs, step and row (the capture and replay
// alerts); the caller fills the metric, message and id.
alerting::Alert OpInfoAlert(const ReplayCase& rc, const char* rule);
alerting::Alert ReplayAlert(const ReplayCase& rc, const ReplayVerdict& v, int64_t now_unix_ns);

// The ops both logs' rank 0 replayed at one step (the latest answer of each), in the
// baseline's order; `experiment`, run ids as compared.
std::vector<ReplayCase> PairReplays(const LogScan& base, const LogScan& cand, const std::string& experiment,
                                    const std::string& baseline, const std::string& candidate);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_SERVICE_REPLAY_VERDICT_H_
