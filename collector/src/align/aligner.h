// Aligner: which runs are compared with which, and which of their closed steps meet
// (docs/design.md "Aligner"; docs/rules.md "Memory bound").
//
// Fed verified Envelopes (live by LiveAnalyzer's thread through the Analyzer, offline
// by `lockstep compare` replaying two logs), it decodes each run into closed steps
// (RunDecoder), pairs each candidate with its experiment's baseline and matches their
// steps by (rank, step). What it finds goes to an AlignedSink — the detection side
// (detect/analyzer.h) — which never reaches back into the aligner:
//   - every closed step of every run, once (OnRunStep: the per-run rules);
//   - every matched (pair, rank, step), per rank in step order (OnPairStep);
//   - a pair's start and the end of input (OnPairStart, OnPairEnd).
//
// Pairing: by Hello's experiment and role, unless OverrideRun() fixed them. Several
// candidates share one baseline; a second baseline of an experiment is not paired
// (logged). Solo runs are never paired.
//
// Memory: a closed step waits in memory only until its partner step is matched (a
// baseline step until every candidate reading the shared copy has passed it). A
// recorded baseline (AddBaselineLog) is read on demand at its candidates' pace and
// never buffered ahead. A live run that gets more than max_buffered_steps ahead of its
// partner is switched to read-back (needs AlignerOptions::data_dir, where the collector
// logs every message before the analyzer sees it): its waiting steps are dropped and,
// from then on to its end, its steps come from its own log `<data_dir>/<run>.lslog`,
// decoded by a second RunDecoder and read only as far as the partner has got. The live
// copy of its messages is still decoded, for OnRunStep only (so the per-run rules fire
// at once and once). With no data dir or no log, the oldest waiting steps are evicted
// instead: counted per pair and logged once, never silently skipped.
//
// Late joiners: a candidate paired after the baseline has released steps (another
// candidate had passed them) reads the baseline from the baseline's log with a reader
// of its own, from the first step, whatever the other candidates do; the shared copy
// no longer waits for it. With no log to read, a warning names the pair and
// late_joins_uncompared counts it; its steps the baseline no longer holds count as
// candidate-only.
//
// Threads: single-threaded; every method on one thread (the owner's). The sink is
// called on that thread, from inside OnMessage / Tick / Resume / Finish / the
// Add*/Override* calls.
#ifndef LOCKSTEP_COLLECTOR_ALIGN_ALIGNER_H_
#define LOCKSTEP_COLLECTOR_ALIGN_ALIGNER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "align/names.h"
#include "align/run_decoder.h"
#include "align/step_data.h"
#include "lockstep/collector/message_sink.h"
#include "lockstep/common/status.h"

namespace lockstep::collector {

class LogReader;

// The wire Role's numbers (aligner.cc checks), so that wire::RoleName names it.
enum class RunRole : uint8_t { kUnknown = 0, kBaseline = 1, kCandidate = 2, kSolo = 3 };

struct AlignerOptions {
  NameCanonicalizer canon;
  size_t max_buffered_steps = 64;          // per (run, rank) waiting for its partner
  // Where the collector writes `<run>.lslog`; a run far ahead, and a baseline a late
  // candidate needs from its first step, are read back from there. Empty: no
  // read-back, the memory bound evicts (in-process tests, compare).
  std::string data_dir;
  int64_t idle_close_ns = 2'000'000'000;   // a rank silent this long: its open step closes
};

struct AlignerCounters {
  uint64_t messages = 0;
  uint64_t steps_closed = 0;
  uint64_t steps_matched = 0;      // (pair, rank, step) handed to OnPairStep
  uint64_t steps_evicted = 0;      // waiting steps dropped by the memory bound
  uint64_t buffered_steps = 0;     // now waiting in memory
  uint64_t buffered_bytes = 0;     // their approximate size
  uint64_t peak_buffered_bytes = 0;
  uint64_t peak_buffered_steps = 0;  // most steps waiting at once, all runs together
  uint64_t runs_read_back = 0;       // live runs switched to reading their own log
  uint64_t late_joins_read_back = 0;   // late candidates compared from the baseline's log
  uint64_t late_joins_uncompared = 0;  // late candidates with no baseline log to read
  // RunDecoder counters (DecoderCounters), summed over all live decoders.
  uint64_t late_records = 0;
  uint64_t unknown_ids = 0;
  uint64_t closed_at_step_end = 0;  // steps closed by the agent's StepEnd
  uint64_t records_missing = 0;     // rows a StepEnd counted that never arrived
  uint64_t restarts = 0;            // sessions whose step numbers went back
  uint64_t rewound_records = 0;     // rows of step numbers a restart repeated (dropped)
};

// What the detection side sees of a run. Stable address for the run's life.
struct AlignedRun {
  std::string id;
  std::string experiment;
  RunRole role = RunRole::kUnknown;
  bool run_rules = true;           // false: a recorded baseline whose per-run rules ran when recorded
  // Its RunFingerprint (the lowest rank's); empty until one arrives.
  const std::map<std::string, std::string>* fingerprint = nullptr;
  // The ranks it says it has (its Hellos' world_size); 0 until a Hello arrives.
  const uint32_t* world_size = nullptr;
};

// One (baseline, candidate) pair and its step accounting. Stable address.
struct AlignedPair {
  size_t index = 0;                // 0, 1, ... in pairing order
  std::string experiment;
  const AlignedRun* baseline = nullptr;
  const AlignedRun* candidate = nullptr;
  uint64_t steps_matched = 0;      // (rank, step) handed to OnPairStep
  uint64_t only_baseline = 0, only_candidate = 0, evicted = 0;
  bool reads_baseline_log = false; // a late joiner reading the baseline's log
  std::vector<uint32_t> ranks;     // distinct ranks matched, ascending
};

// The detection side's view of the aligner. Called on the aligner's thread; must not
// call back into the aligner.
class AlignedSink {
 public:
  virtual ~AlignedSink() = default;
  // Any live message of `run`, before it is decoded; `goodbye` ends the run's session.
  virtual void OnRunActivity(const AlignedRun& run, int64_t recv_ns, bool goodbye) = 0;
  virtual void OnRunTick(const AlignedRun& run, int64_t now_ns) = 0;
  // The collector restarted at `now_ns` after replaying the logs.
  virtual void OnRunResume(const AlignedRun& run, int64_t now_ns) = 0;
  // The live run's step numbers went back in a new session of `rank` (a restart
  // without start_step; run_decoder.h): once per such session.
  virtual void OnRunRewind(const AlignedRun& run, const Rewind& rewind) = 0;
  // A closed step of `run`, once per (rank, step).
  virtual void OnRunStep(const AlignedRun& run, const StepData& step) = 0;
  virtual void OnPairStart(const AlignedPair& pair) = 0;
  // Baseline and candidate steps of one step number on `rank`; per (pair, rank) in
  // step order. The steps are valid during the call only.
  virtual void OnPairStep(const AlignedPair& pair, uint32_t rank, const StepData& b, const StepData& c) = 0;
  // Finish: nothing more will come for `pair`.
  virtual void OnPairEnd(const AlignedPair& pair) = 0;
};

class Aligner : public MessageSink {
 public:
  Aligner(AlignerOptions options, NameTable* names, AlignedSink* sink);
  ~Aligner() override;
  Aligner(const Aligner&) = delete;
  Aligner& operator=(const Aligner&) = delete;

  void OnMessage(const wire::Envelope& env, int64_t recv_unix_ns) override;
  // Closes steps of silent ranks; retries read-back logs not yet written.
  void Tick(int64_t now_unix_ns);
  // After a restart's replay of the logs: the silence clocks restart at `now`.
  void Resume(int64_t now_unix_ns);
  // End of input: closes every open step, matches what can be, reads logs to their end.
  void Finish();

  // See Analyzer (detect/analyzer.h), which forwards these.
  void OverrideRun(const std::string& run, const std::string& experiment, RunRole role);
  StatusOr<std::string> AddBaselineLog(const std::string& path, const std::string& experiment = "",
                                       bool run_rules = false, const std::string& as_run = "");
  void RenameRun(const std::string& from, const std::string& to) { rename_[from] = to; }

  // Pairs in pairing order (AlignedPair::index).
  std::vector<const AlignedPair*> pairs() const;
  AlignerCounters counters() const;

 private:
  struct RunState;
  struct PairState;

  RunState* GetRun(const std::string& run_id);
  void SetRole(RunState* r, const std::string& experiment, RunRole role);
  // Logs once that candidate `r` has no baseline (`why`), naming the experiments that do.
  void WarnUnpaired(RunState* r, const char* why);
  void MakePair(RunState* b, RunState* c);
  bool OpenBaselineLog(PairState* p);
  void OnClosed(RunState* r, uint32_t rank, StepPtr step);
  void Buffer(RunState* r, uint32_t rank, StepPtr step);
  void Drain();
  void Match(PairState* p);
  void OnReadBack(RunState* r, uint32_t rank, StepPtr step);
  bool StartReadBack(RunState* r);
  void DropBuffered(RunState* r);
  int64_t MinDone(const RunState* r, uint32_t rank) const;
  bool Pull(RunState* r, uint32_t rank, uint64_t step);
  bool PullPairBaseline(PairState* p, uint32_t rank, uint64_t step);
  void DrainSourceToEnd(RunState* r);
  void DrainPairBaselineToEnd(PairState* p);
  void Release(RunState* b, uint32_t rank);
  void Unbuffer(std::map<uint64_t, StepPtr>* buf, std::map<uint64_t, StepPtr>::iterator it);

  AlignerOptions opt_;
  NameTable* names_;
  AlignedSink* sink_;
  std::unordered_map<std::string, std::unique_ptr<RunState>> runs_;
  std::vector<std::unique_ptr<PairState>> pairs_;
  std::map<std::string, std::string> baseline_of_;  // experiment -> baseline run
  std::map<std::string, std::string> rename_;       // RenameRun: run id -> id used here
  bool dirty_ = false;
  bool finishing_ = false;  // Finish(): a read-back log's end is the run's end
  AlignerCounters counters_;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_ALIGN_ALIGNER_H_
