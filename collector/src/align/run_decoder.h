// RunDecoder: turns one run's verified Envelopes (all ranks) into closed StepData.
//
// It keeps, per rank, the tensor directory (agent id -> canonical name id, kind,
// dtype) and the steps still open, and decides when a step is complete.
//
// Agents of schema minor >= 3 (kStepEndMinor; the rank's Hello says so) end every step
// with a StepEnd, sent after all of the step's records on the same connection: the
// step (and any older one still open) closes when it arrives, with no timer and nothing
// learned. Rows fewer than the StepEnd's count were lost on the way (records_missing).
// Only Goodbye, CloseAll(), idle_close and kMaxOpenSteps open steps (an agent that never
// calls EndStep) close steps otherwise.
//
// Older agents and logs (no StepEnd) are decoded by inference. The agent sends a step's
// StepScalars after all of its statistics (Monitor.step() records the scalars after the step's last tensor, and the
// sender ships its pending batch before the scalars; device tensors are handed over one
// step late, in the same order). So a step S closes at the first of:
//   1. StepStats for a step T > S + lag arrives on that rank;
//   2. StepScalars for a step T > S + lag + 1 arrives;
//   3. StepScalars(S) arrives (lag 0, rule 3 not switched off), and then:
//      a. at once, if S has statistics (the normal case);
//      b. if S has none yet, or the rank has shown that statistics can follow its
//         scalars (older agents sent the pending batch after them): when a StepStats(S)
//         arrives, or when the rank stays silent for `settle_ns` (a step with no records:
//         sampling with every=N) — Tick() closes it;
//   4. Goodbye, CloseAll(), or Tick() finding the rank silent for idle_close.
// Rule 3 makes detection immediate: without it a step would wait for the next step's
// records, or for idle_close when the job pauses (evaluation, checkpointing).
// A record for a step already closed is "late": counted, dropped, and the rank learns
// from the rule that closed that step: rule 1 -> lag += 1 (up to 2); 3a -> statistics
// may follow the scalars (3b from then on); 3b on a StepStats -> rule 3 is switched
// off; 3b on silence -> settle_ns doubles (up to idle_close).
//
// A rank whose step numbers go back under a new agent session (a job restarted under
// the same run id without start_step) is a restart: the RewindFn is told once per
// restart, and the records of the repeated step numbers are counted (rewound_records),
// not compared: their numbers already belong to the steps before the restart.
//
// Two live processes claiming one rank (an older agent's Monitor made before
// init_process_group under mp.spawn, a copied run id): a session that a later session
// replaced, that had not said Goodbye, and that is heard again, was not restarted: both
// are live. The earliest such session keeps the rank; every later one still live is set
// apart (its messages are counted in apart_messages and not decoded: they stay in the
// log, and are never compared as that rank). The RewindFn is told once (kDuplicate).
// This needs no clock, so live and `compare` decide alike. Records a later session sent
// before the first one was heard again were decoded as the rank's (a restart's rules
// apply to them until then).
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
struct StepEnd;
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
  uint64_t closed_at_scalars = 0;     // by rule 3a
  uint64_t closed_after_scalars = 0;  // by rule 3b, on the StepStats that followed
  uint64_t closed_by_settle = 0;      // by rule 3b, on silence
  uint64_t closed_at_step_end = 0;    // by a StepEnd
  uint64_t records_missing = 0;       // rows a StepEnd counted that never arrived
  uint64_t rewound_records = 0;       // rows of step numbers a restart repeated (dropped)
  uint64_t restarts = 0;              // sessions whose step numbers went back
  uint64_t apart_sessions = 0;        // sessions set apart: another live session has their rank
  uint64_t apart_messages = 0;        // their messages (not decoded)
};

// An identity finding on one rank of a run. kRestart: the rank's step numbers went
// back: a new session of `rank` sent step `to_step` after the previous session had
// reached `from_step`. kDuplicate: two live sessions claim `rank`; `kept` (the first)
// keeps it, `apart` (one or more, "; "-separated) are set apart; `from_step` is the
// highest step the rank had reached.
struct Rewind {
  enum class What : uint8_t { kRestart, kDuplicate };
  What what = What::kRestart;
  uint32_t rank = 0;
  uint64_t from_step = 0;
  uint64_t to_step = 0;
  std::string kept;   // kDuplicate: "host h pid p (session 0x...)"
  std::string apart;  // kDuplicate: the same for each session set apart
};

class RunDecoder {
 public:
  using ClosedFn = std::function<void(uint32_t rank, StepPtr step)>;
  using RewindFn = std::function<void(const Rewind&)>;

  // `names`/`canon` outlive the decoder. `idle_close_ns` <= 0 disables the timers of
  // rules 3b and 4 (offline replay: steps close on the data only).
  RunDecoder(std::string run_id, const NameCanonicalizer* canon, NameTable* names,
             int64_t idle_close_ns, ClosedFn on_closed, int64_t settle_ns = kDefaultSettleNs);

  // Rule 3b's silence after a step's scalars. Records that follow the scalars at all
  // follow them within the agent's batch linger (5 ms) even when training stalls.
  static constexpr int64_t kDefaultSettleNs = 50'000'000;
  // With StepEnd: more steps open on one rank than this and the oldest closes (an agent
  // that never ends its steps must not grow the collector's memory).
  static constexpr size_t kMaxOpenSteps = 8;

  // Called (synchronously, inside Consume) when a rank's step numbers go back.
  void set_on_rewind(RewindFn fn) { on_rewind_ = std::move(fn); }

  void Consume(const wire::Envelope& env, int64_t recv_unix_ns);
  void Tick(int64_t now_unix_ns);
  void CloseAll();
  // Restarts every rank's silence clock at `now` (a collector restart: the silence
  // while it was down is not the run's).
  void Touch(int64_t now_unix_ns);

  // Directory entry of (rank, agent tensor id), or nullptr.
  const TensorMeta* Meta(uint32_t rank, uint32_t id) const;
  const DecoderCounters& counters() const { return counters_; }
  const std::string& run_id() const { return run_id_; }
  // The run fingerprint (wire RunFingerprint) of its lowest rank that sent one; empty
  // before. version() grows with each fingerprint taken.
  const std::map<std::string, std::string>& fingerprint() const { return fingerprint_; }
  uint32_t fingerprint_version() const { return fingerprint_version_; }
  // The ranks the run says it has: the largest world_size of its ranks' Hellos (0
  // before any).
  const uint32_t& world_size() const { return world_size_; }
  // Highest step closed on `rank` (-1 if none).
  int64_t LastClosed(uint32_t rank) const;

 private:
  enum class Cause : uint8_t { kData, kAtScalars, kAfterScalars, kSettle, kStepEnd };  // why a step closed
  struct RankState {
    std::vector<TensorMeta> dir;                     // indexed by agent id
    uint32_t declared = 0;                           // entries of dir that are known
    std::map<uint64_t, std::shared_ptr<StepData>> open;
    int64_t last_closed = -1;
    int64_t last_recv_ns = 0;
    uint32_t lag = 0;
    bool scalars_close_ok = true;
    int64_t scalars_step = -1;         // open step waiting after its scalars (rule 3b)
    bool stats_after_scalars = false;  // learned: statistics may follow the scalars
    int64_t settle_ns = 0;
    Cause last_cause = Cause::kData;
    bool warned_late = false;
    bool step_end = false;  // the rank's agent sends StepEnd (its Hello's schema minor)
    std::map<uint64_t, uint64_t> wire_rows;  // open step -> rows received (for StepEnd)
    // Restarts: the session of the rank's last Hello, the highest step it closed
    // before it, and whether the current session's steps are repeats (`rewound`).
    uint64_t session = 0;
    bool new_session = false;  // a Hello of another session came after closed steps
    int64_t rewind_from = -1;  // last_closed when that Hello came
    bool rewound = false;
    // Every agent session heard on the rank (bounded), for telling two live processes
    // from a restart.
    struct SessionSeen {
      uint64_t seq = 0;  // order of first appearance
      bool ended = false;
      bool apart = false;
      std::string who;
    };
    std::map<uint64_t, SessionSeen> sessions;
    uint64_t next_seq = 0;
  };
  RankState& Rank(uint32_t rank);
  std::shared_ptr<StepData> OpenStep(RankState& rs, uint32_t rank, uint64_t step, int64_t sent_ns);
  void CloseThrough(RankState& rs, int64_t through_step, Cause cause);
  void CloseOne(RankState& rs, std::shared_ptr<StepData> step);
  // StepEnd mode: closes the oldest open steps past kMaxOpenSteps.
  void BoundOpen(RankState& rs);
  // Names each repeat row's producer's alias in the NameTable (StatRow::repeat).
  void NoteAliases(const std::vector<StatRow>& rows);
  void NoteLate(RankState& rs, uint32_t rank, uint64_t step, uint64_t n);
  // True when data of `step` belongs to a restart that repeats step numbers (counted,
  // dropped); tells on_rewind_ the first time.
  bool Rewound(RankState& rs, uint32_t rank, uint64_t step, uint64_t n);
  void OnStepEnd(RankState& rs, const wire::StepEnd& e);
  // True when `env` comes from a session set apart from its rank, or is a Goodbye of a
  // session no longer the rank's (not decoded). Detects the duplicate (class comment).
  bool SetApart(RankState& rs, uint32_t rank, const wire::Envelope& env);

  std::string run_id_;
  const NameCanonicalizer* canon_;
  NameTable* names_;
  int64_t idle_close_ns_;
  int64_t settle_ns_;
  ClosedFn on_closed_;
  RewindFn on_rewind_;
  std::unordered_map<uint32_t, RankState> ranks_;
  DecoderCounters counters_;
  std::map<std::string, std::string> fingerprint_;
  int64_t fingerprint_rank_ = -1;
  uint32_t fingerprint_version_ = 0;
  uint32_t world_size_ = 0;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_ALIGN_RUN_DECODER_H_
