// Aligner's private state (aligner.h), shared by the files that implement it:
//   aligner.cc          runs and ranks: the entry points (OnMessage, Tick, Resume, Finish),
//                       the per-run bookkeeping and the counters;
//   aligner_pairing.cc  who is compared with whom (roles, experiments, pairs);
//   aligner_match.cc    waiting steps, the memory bound and the (rank, step) merge-join;
//   aligner_logs.cc     the log-file side: recorded baselines, read-back, late joiners.
// Include it from those files only.
#ifndef LOCKSTEP_COLLECTOR_ALIGN_ALIGNER_STATE_H_
#define LOCKSTEP_COLLECTOR_ALIGN_ALIGNER_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "align/aligner.h"
#include "align/run_decoder.h"
#include "align/step_data.h"
#include "runlog/log_reader.h"

namespace lockstep::collector {

using StepBuffer = std::map<uint64_t, StepPtr>;  // step -> closed step

struct Aligner::RunState {
  AlignedRun info;
  bool fixed = false;       // OverrideRun / AddBaselineLog: Hello does not change it
  bool ended = false;       // no more steps will come to pair (for a read-back run: its log is done)
  // Live ranks heard from, and those whose latest session said Goodbye: no more steps
  // will come from them. Per rank, not per run: when one rank says Goodbye, the other
  // ranks' last steps may still be on their way.
  std::set<uint32_t> ranks_seen, ranks_ended;
  std::unique_ptr<RunDecoder> decoder;
  std::map<uint32_t, StepBuffer> buffer;  // rank -> waiting steps
  std::vector<PairState*> pairs;
  std::string log_path;               // a recorded baseline's log ("" for a live run)
  std::unique_ptr<LogReader> source;  // a recorded baseline, or a live run read back
  bool source_done = false;
  // Read-back: `source` is this live run's own log and `back` decodes it; `decoder`
  // keeps decoding the live messages for OnRunStep only.
  bool readback = false;
  std::unique_ptr<RunDecoder> back;
  bool warned_readback = false;
  bool released = false;    // a step left `buffer` after its candidates passed it
  uint64_t evicted = 0;
  bool warned_evict = false;
  bool warned_unpaired = false;  // a candidate said to be without a baseline (once)
};

struct Aligner::PairState {
  AlignedPair info;
  RunState* b = nullptr;
  RunState* c = nullptr;
  std::map<uint32_t, int64_t> done;  // rank -> highest step matched or skipped
  // A late joiner's own copy of the baseline, read from the baseline's log.
  std::unique_ptr<LogReader> b_source;
  std::unique_ptr<RunDecoder> b_decoder;
  bool b_source_done = false;
  std::map<uint32_t, StepBuffer> b_buffer;
};

// The decoder whose closed steps are paired: the log's for a read-back run.
inline RunDecoder& Paced(const auto* r) { return r->readback ? *r->back : *r->decoder; }

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_ALIGN_ALIGNER_STATE_H_
