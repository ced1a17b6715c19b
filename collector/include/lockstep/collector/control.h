// The control channel, collector -> agents (docs/design.md "The control channel"): what
// a collector asks of a run, and what became of it.
//
// The collector publishes each request on its control socket (an XPUB beside the
// ingest socket, --control-listen) again and again until every rank of the run has
// answered or the request expires; agents act on an id once and answer on the ingest
// connection (wire ControlAck), so the answers are in the run's log too.
#ifndef LOCKSTEP_COLLECTOR_CONTROL_H_
#define LOCKSTEP_COLLECTOR_CONTROL_H_

#include <cstdint>
#include <string>
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

struct ControlAnswer {
  uint32_t rank = 0;
  std::string status;  // "received", "done", "refused", "ignored"
  uint64_t step = 0;   // the step the job acted at
  std::string detail;  // what was done, or why not
};

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
