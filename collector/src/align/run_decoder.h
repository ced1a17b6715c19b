// RunDecoder: turns one run's verified Envelopes (all ranks) into closed StepData.
//
// It keeps, per rank, the tensor directory (agent id -> canonical name id, kind,
// dtype) and the steps still open, and decides when a step is complete. The agent
// ships a step's records at EndStep (CPU tensors) or one step late (device tensors
// copied asynchronously), and the wire has no end-of-step marker, so a step S closes
// at the first of:
//   1. StepStats for a step T > S + lag arrives on that rank;
//   2. StepScalars for a step T > S + lag + 1 arrives;
//   3. StepScalars(S) arrives, S already has stats, and this rank has never sent
//      stats after its scalars (learned: immediate close, lowest latency);
//   4. Goodbye, CloseAll(), or Tick() finding the rank silent for idle_close.
// A record for a step already closed is "late": counted, dropped, and the rank learns
// (lag += 1 up to 2, or rule 3 switched off) so later steps wait for such records.
//
// Threads: single-threaded (the analyzer's thread). Callbacks run synchronously
// inside Consume/Tick/CloseAll.
#ifndef LOCKSTEP_COLLECTOR_ALIGN_RUN_DECODER_H_
#define LOCKSTEP_COLLECTOR_ALIGN_RUN_DECODER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "align/names.h"
#include "align/step_data.h"

namespace lockstep::wire {
struct Envelope;
}

namespace lockstep::collector {

struct TensorMeta {
  uint32_t name_id = 0;
  Kind kind = Kind::kAct;
  DT dtype = DT::kUnknown;
  uint32_t order = 0;
  bool known = false;
};

struct DecoderCounters {
  uint64_t records = 0;        // stats rows accepted
  uint64_t late_records = 0;   // rows for an already closed step (dropped)
  uint64_t unknown_ids = 0;    // rows whose tensor id had no directory entry (dropped)
  uint64_t steps_closed = 0;
  uint64_t duplicate_rows = 0; // same key twice in one step (the later one kept)
};

class RunDecoder {
 public:
  using ClosedFn = std::function<void(uint32_t rank, StepPtr step)>;

  // `names`/`canon` outlive the decoder. `idle_close_ns` <= 0 disables rule 4's timer.
  RunDecoder(std::string run_id, const NameCanonicalizer* canon, NameTable* names,
             int64_t idle_close_ns, ClosedFn on_closed);

  void Consume(const wire::Envelope& env, int64_t recv_unix_ns);
  void Tick(int64_t now_unix_ns);
  void CloseAll();

  // Directory entry of (rank, agent tensor id), or nullptr.
  const TensorMeta* Meta(uint32_t rank, uint32_t id) const;
  const DecoderCounters& counters() const { return counters_; }
  const std::string& run_id() const { return run_id_; }
  // Highest step closed on `rank` (-1 if none).
  int64_t LastClosed(uint32_t rank) const;

 private:
  struct RankState {
    std::vector<TensorMeta> dir;                     // indexed by agent id
    std::map<uint64_t, std::shared_ptr<StepData>> open;
    int64_t last_closed = -1;
    int64_t last_recv_ns = 0;
    uint32_t lag = 0;
    bool scalars_close_ok = true;
    bool last_close_by_scalars = false;
    bool warned_late = false;
  };
  RankState& Rank(uint32_t rank);
  std::shared_ptr<StepData> OpenStep(RankState& rs, uint32_t rank, uint64_t step, int64_t sent_ns);
  void CloseThrough(RankState& rs, int64_t through_step, bool by_scalars);
  void CloseOne(RankState& rs, std::shared_ptr<StepData> step);
  void NoteLate(RankState& rs, uint32_t rank, uint64_t step, uint64_t n);

  std::string run_id_;
  const NameCanonicalizer* canon_;
  NameTable* names_;
  int64_t idle_close_ns_;
  ClosedFn on_closed_;
  std::unordered_map<uint32_t, RankState> ranks_;
  DecoderCounters counters_;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_ALIGN_RUN_DECODER_H_
