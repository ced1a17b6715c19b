// `lockstep compare` as a CI gate: what each log holds (LogScan), and the verdict over
// a compared pair (JudgeCompare): a few lines that come first in the output, and one
// outcome that becomes the exit status (lockstep/common/exit_codes.h; docs/rules.md "compare as a
// CI gate").
//
// Threads: plain values and pure functions.
#ifndef LOCKSTEP_COLLECTOR_DETECT_COMPARE_GATE_H_
#define LOCKSTEP_COLLECTOR_DETECT_COMPARE_GATE_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "detect/analyzer.h"
#include "rules/rank_onsets.h"
#include "lockstep/alerting/alert.h"
#include "lockstep/collector/control.h"

namespace lockstep::wire {
struct Envelope;
}

namespace lockstep::collector {

// One log as read: its run id, the (rank, step)s it holds, its Goodbye, and whether it
// was read to its end.
struct LogScan {
  std::string path;
  std::string run_id;                          // the first message's
  std::set<std::pair<uint32_t, uint64_t>> steps;  // (rank, step) of StepStats/StepScalars
  bool goodbye = false;
  uint64_t goodbye_last_step = 0;              // of the last Goodbye (valid when goodbye)
  uint64_t records = 0;
  uint64_t unreadable = 0;                     // records whose message failed verification
  bool corrupt = false;                        // a bad record: nothing after it was read
  bool truncated = false;                      // the file ends inside a record
  std::string problem;                         // the reader's sentence for either
  // What retention thinned in it (LogReader::DescribeThinning); "" when nothing was.
  std::string thinned;
  // Rank 0's replays of its own captures (ControlAck.replay), with the step each
  // capture was taken at and when the answer was sent, in log order.
  struct Replay {
    uint64_t step = 0;
    int64_t sent_unix_ns = 0;
    SelfReplayResult result;
  };
  std::vector<Replay> replays;

  // Notes one verified message.
  void Add(const wire::Envelope& env);
  // One sentence when the log was not read whole ("" when it was).
  std::string InputProblem(const std::string& role) const;
};

// Reads a whole log (CRC of every record, every message verified). An unopenable file
// is an error; corruption is reported in the scan, with what came before it.
StatusOr<LogScan> ScanLog(const std::string& path);

enum class GateOutcome { kOk, kFinding, kBadInput, kTooFewSteps, kNotSameModel };

struct GateVerdict {
  GateOutcome outcome = GateOutcome::kOk;
  std::vector<std::string> lines;  // 3-5 lines: the headline first
  uint64_t steps_compared = 0, steps_expected = 0;
  uint64_t tensors_shared = 0, tensors_baseline = 0, tensors_candidate = 0;
  std::vector<std::string> problems;  // why the gate failed, one sentence each
};

inline constexpr double kMinStepsComparedFraction = 0.9;
inline constexpr double kMinTensorsSharedFraction = 0.5;

// The verdict over one compared pair. `critical`: a critical alert was raised; a
// `restart` alert in `alerts` (steps not compared: their numbers repeat) is a finding too. The
// outcome's precedence: bad input, not the same model, too few steps, finding, ok.
// The first divergence is said to be "on all 4 ranks" when every rank parts at that
// step (the report's onsets).
GateVerdict JudgeCompare(const PairReport& r, const LogScan& base, const LogScan& cand,
                         const std::vector<alerting::Alert>& alerts, bool critical);

// The first divergence's place, "rank 2" or "all 4 ranks" (RankOnsets::Where), and its
// message with "at step S rank R" said that way.
std::string FirstDivergenceWhere(const alerting::Alert& a, const RankOnsets* onsets);
std::string WithWhere(const std::string& message, const alerting::Alert& a, const RankOnsets* onsets);

// Steps the comparison should have covered: every (rank, step) of either log from the
// candidate's first step to its end (its Goodbye's last step when it said goodbye and
// was read whole; otherwise the baseline's last step: it was meant to go as far).
uint64_t ExpectedSteps(const LogScan& base, const LogScan& cand);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_DETECT_COMPARE_GATE_H_
