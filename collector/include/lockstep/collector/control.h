// The control channel, collector -> agents (docs/design.md "The control channel"): what
// a collector asks of a run, and what became of it.
//
// The collector publishes each request on its control socket (an XPUB beside the
// ingest socket, --control-listen) again and again until every rank of the run has
// answered or the request expires; agents act on an id once and answer on the ingest
// connection (wire ControlAck), so the answers are in the run's log too.
#ifndef LOCKSTEP_COLLECTOR_CONTROL_H_
#define LOCKSTEP_COLLECTOR_CONTROL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::collector {

struct ControlRequestSpec {
  std::string experiment;  // "" = any
  std::string run;         // "" = every run (of the experiment)
  int32_t rank = -1;       // -1 = every rank
  std::string action;      // "zoom", "capture"
  std::string target;      // the module or row the action is about
  uint64_t step = 0;       // act at this step (an agent past it acts at its next)
  uint32_t steps = 2;      // zoom: how many steps
};

// A capture replayed by the run that made it (wire SelfReplay, schema minor 6): its op
// re-run on the job's host in float64 with its own settings and inputs.
struct SelfReplayResult {
  std::string file, row;
  std::string dtype;         // the output's ("float32")
  std::string coarsest;      // the coarsest floating dtype among the op's tensors
  double max_rel_error = 0;  // the output against that float64 result
  double ulps = 0;           // the same in ULPs of dtype
  uint32_t width = 1;        // the reduction length the dtype's budget counts
  std::string settings_digest, inputs_digest, output_digest;  // equal = the same
  std::vector<std::pair<std::string, std::string>> settings, precision;
  std::string error;         // why it could not replay ("" when it did)
};

struct ControlAnswer {
  uint32_t rank = 0;
  std::string status;  // "received", "done", "refused", "ignored"
  uint64_t step = 0;   // the step the job acted at
  std::string detail;  // what was done, or why not
  uint16_t schema_minor = 0;  // the answering agent's (kSelfReplayMinor and up replay captures)
  std::optional<SelfReplayResult> replay;  // a capture's own replay (a second "done")
};

// The statuses an answer may have, as /metrics labels them (wire AckStatus order; a
// status this collector does not know counts as "unknown").
inline constexpr const char* kAnswerStatusNames[] = {"received", "done", "refused", "ignored", "unknown"};
inline constexpr size_t kAnswerStatusCount = 5;

struct ControlRequestState {
  uint64_t id = 0;
  ControlRequestSpec spec;
  int64_t created_unix_ns = 0;
  uint64_t publications = 0;          // times put on the control socket
  std::vector<ControlAnswer> answers;  // the latest answer of each rank, by rank
  bool settled = false;               // every rank answered done/refused/ignored, or expired
  bool expired = false;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_CONTROL_H_
