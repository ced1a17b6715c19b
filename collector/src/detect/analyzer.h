// Analyzer: the detection side of the collector behind one MessageSink (docs/design.md
// "Detectors"; docs/rules.md).
//
// Fed verified Envelopes — live by LiveAnalyzer's thread, offline by `lockstep
// compare` replaying two logs — it hands them to its Aligner (align/aligner.h), which
// decodes each run into closed steps, pairs each candidate with its experiment's
// baseline, bounds what waits in memory, reads runs back from disk and matches steps
// by (rank, step). The analyzer is the aligner's AlignedSink: it runs the per-run
// rules on every closed step, joins each matched step's tensors by (canonical name,
// kind, micro step), evaluates them (PairEval) against their tolerance and noise floor
// and runs the per-pair rules. Alerts go to the AlertFn given at construction.
//
// State, per pair: the rules' state per (rank, tensor) (TensorTrack: noise floor,
// trend, drift level; learned per rank in step order, so live and offline give the
// same alerts on the same logs) and, apart, the report table per tensor over all
// ranks (worst step and its rank, first drift).
//
// Pairing, memory bound, read-back and late joiners: see align/aligner.h.
//
// Threads: single-threaded; every method on one thread (the owner's).
#ifndef LOCKSTEP_COLLECTOR_DETECT_ANALYZER_H_
#define LOCKSTEP_COLLECTOR_DETECT_ANALYZER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "align/aligner.h"
#include "align/names.h"
#include "rules/detector.h"
#include "rules/rank_onsets.h"
#include "rules/rules_config.h"
#include "rules/setup_rule.h"
#include "lockstep/collector/message_sink.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/status.h"

namespace lockstep::collector {

// The aligner's options (canon, max_buffered_steps, data_dir, idle_close_ns: see
// AlignerOptions) and the detectors' rules.
struct AnalyzerOptions : AlignerOptions {
  RulesConfig rules;
};

// The aligner's counters (AlignerCounters: messages, buffering, read-back, the
// decoders' late/missing/rewound records) and the detection side's own.
struct AnalyzerCounters : AlignerCounters {
  uint64_t pairs_compared = 0;     // matched tensor pairs evaluated
  uint64_t steps_compared = 0;     // (pair, rank, step) comparisons: the aligner's steps_matched
  uint64_t unmatched_tensors = 0;  // distinct (pair, tensor) seen on one side only
};

// One row of the compare table: a matched tensor at its worst step.
struct TensorReport {
  std::string name;
  std::string label;                 // name with its aliases: "blocks.0.mlp.fc2 (= blocks.0.mlp)"
  std::vector<std::string> aliases;  // names whose records repeat this one (docs/rules.md)
  std::string kind;
  uint32_t micro_step = 0;
  uint32_t order = 0;
  std::string dtype_b, dtype_c;
  uint64_t steps = 0;              // (rank, step) comparisons, all ranks
  uint64_t worst_step = 0;
  uint32_t rank = 0;               // the rank at worst_step
  double b_l2 = 0, c_l2 = 0;
  double b_max = 0, b_min = 0, b_mean = 0, c_max = 0, c_min = 0, c_mean = 0;  // at worst_step
  double rel_l2 = 0, rel_mean = 0, rel_absmax = 0, rel_std = 0, rel_minmax = 0;
  bool stats_only = false;  // judged on the statistics only (align/pair_metrics.h)
  double cosine = 1, rel_dist = 0, kl = 0;
  double score = 0, threshold = 1;  // normalized; drift when score > threshold
  std::string metric;               // dominant metric at the worst step
  int64_t first_drift_step = -1;
  std::string status;               // "ok", "drift", "critical", "nonfinite"
};

struct UnmatchedReport {
  std::string name, kind;
  std::string side;  // "baseline" or "candidate": where it exists
  uint64_t first_step = 0;
  uint64_t steps = 0;
};

// One op at one step, as the birth rule ranked it (rules/birth.h).
struct OpBirthReport {
  std::string name, module_type;
  std::string pass;  // "forward" or "backward"
  double input_error = 0, output_error = 0, explained = 0, ratio = 0;
  bool born = false;  // adds error of its own (the birth point, or a later one)
};

// The ops of one compared (step, rank), ranked by the error they add (largest first).
struct BirthReport {
  uint64_t step = 0;
  uint32_t rank = 0;
  std::vector<OpBirthReport> ops;
};

// What the analyzer keeps of the birth rule per pair: the first kMaxBirthSteps
// compared (step, rank)s, their kBirthOpsPerStep worst ops.
inline constexpr size_t kMaxBirthSteps = 10000;
inline constexpr size_t kBirthOpsPerStep = 5;
struct StepBirths {
  uint64_t step = 0;
  uint32_t rank = 0;
  std::vector<OpBirth> ops;
};

struct PairReport {
  std::string experiment, baseline, candidate;
  uint64_t steps_compared = 0;     // (rank, step) comparisons
  uint32_t ranks = 0;              // distinct ranks compared
  uint64_t steps_only_baseline = 0, steps_only_candidate = 0, steps_evicted = 0;
  bool diverged = false;
  alerting::Alert first_divergence;  // valid when diverged
  uint64_t trends_downstream = 0;        // trends downstream of the onset: counted, not alerted
  std::vector<TensorReport> tensors;     // in execution order
  std::vector<UnmatchedReport> unmatched;
  double loss_b = 0, loss_c = 0;         // at the last compared step (NaN if none)
  bool setup_known = false;              // both runs sent a fingerprint
  std::vector<SetupDiff> setup;          // their differences (rule `setup`)
  std::string setup_note;                // what was not compared and why ("" if nothing)
  std::vector<BirthReport> births;       // per compared step: ops by the error they add
  bool births_truncated = false;         // more steps were compared than kept
  bool loss_b_given = false, loss_c_given = false;  // false: no loss; true: loss_b/c, NaN included
  // Each rank's first drifting step and tensor, from every compared step: where the
  // first divergence is ("on all 4 ranks"), the same for compare, report and the live page.
  RankOnsets onsets;
  // Some tensor was judged on the statistics only: a run is an import of a statistics
  // dump (msprobe's, docs/msprobe.md), so rel_dist is a lower bound and there is no cosine.
  bool stats_only = false;
};

class Analyzer : public MessageSink {
 public:
  // `clock` (not owned, outlives the analyzer; null: the real clock) stamps alerts'
  // first_seen and drives LiveAnalyzer's ticks.
  Analyzer(AnalyzerOptions options, AlertFn alerts, const Clock* clock = nullptr);
  ~Analyzer() override;
  Analyzer(const Analyzer&) = delete;
  Analyzer& operator=(const Analyzer&) = delete;

  void OnMessage(const wire::Envelope& env, int64_t recv_unix_ns) override;
  // Periodic: closes steps of silent ranks, runs stall checks. `now` from the clock.
  void Tick(int64_t now_unix_ns);
  // After a restart's replay of the logs, before live input: the silence clocks (idle
  // step close, stall) restart at `now`, since the collector, not the runs, was silent.
  void Resume(int64_t now_unix_ns);
  // End of input: closes every open step, compares what can be, reads recorded
  // baselines to their end.
  void Finish();

  // Fixes a run's experiment and role whatever its Hello says (compare, tests).
  void OverrideRun(const std::string& run, const std::string& experiment, RunRole role) {
    aligner_.OverrideRun(run, experiment, role);
  }
  // A recorded run log as the baseline of `experiment` ("" = the log's own), read
  // from disk at its candidates' pace. Its per-run rules run only if `run_rules`
  // (compare: yes; a live collector: no, they ran when it was recorded). Returns the
  // log's run id, or `as_run` when given: the run is known by that id instead
  // (compare --rename-baseline, for two recordings of one run id).
  StatusOr<std::string> AddBaselineLog(const std::string& path, const std::string& experiment = "",
                                       bool run_rules = false, const std::string& as_run = "") {
    return aligner_.AddBaselineLog(path, experiment, run_rules, as_run);
  }
  // Messages of run `from` given to OnMessage are taken as run `to` (compare
  // --rename-candidate). Before the first message of `from`.
  void RenameRun(const std::string& from, const std::string& to) { aligner_.RenameRun(from, to); }

  std::vector<PairReport> Reports() const;
  AnalyzerCounters counters() const;
  const AlertEmitter& emitter() const { return emitter_; }
  const Clock* clock() const { return clock_; }  // never null
  const NameTable& names() const { return names_; }

  // Called at the end of every compared (pair, rank, step), after the tensor tracks
  // were updated, on the analyzer's thread; must not block. The view feed keeps its
  // per-step histories from it (collector/src/view/view_model.h). At most one.
  using PairStepObserver = std::function<void(const PairCtx&, const PairStepView&)>;
  void SetPairStepObserver(PairStepObserver fn) { observer_ = std::move(fn); }
  // Called once per pair when its first divergence is emitted (ctx.outcome says what
  // it was, and what to zoom into), and once more when a zoom refines it; on the
  // analyzer's thread; must not block. At most one.
  using DivergenceObserver = std::function<void(const PairCtx&)>;
  void SetDivergenceObserver(DivergenceObserver fn) { divergence_observer_ = std::move(fn); }

 private:
  struct RunDet;
  struct PairDet;
  // The detection side of the aligner; forwards to the analyzer.
  class Sink : public AlignedSink {
   public:
    explicit Sink(Analyzer* a) : a_(a) {}
    void OnRunActivity(const AlignedRun& run, int64_t recv_ns, bool goodbye) override;
    void OnRunTick(const AlignedRun& run, int64_t now_ns) override;
    void OnRunResume(const AlignedRun& run, int64_t now_ns) override;
    void OnRunRewind(const AlignedRun& run, const Rewind& rewind) override;
    void OnRunStep(const AlignedRun& run, const StepData& step) override;
    void OnPairStart(const AlignedPair& pair) override;
    void OnPairStep(const AlignedPair& pair, uint32_t rank, const StepData& b, const StepData& c) override;
    void OnPairEnd(const AlignedPair& pair) override;

   private:
    Analyzer* a_;
  };

  RunDet* Det(const AlignedRun& run);
  void Compare(PairDet* p, uint32_t rank, const StepData& bs, const StepData& cs);
  // The `setup` rule: once per pair, when both fingerprints are known (at the first
  // compared step, or at the end).
  void CheckSetup(PairDet* p, uint64_t step, uint32_t rank);
  void NoteUnmatched(PairDet* p, uint64_t key, bool in_baseline, uint64_t step);
  // Tells divergence_observer_ once that pair `p` diverged (its first divergence fires
  // at a compared step or, waiting for late ranks, at a tick).
  void NoteDivergence(PairDet* p);

  AnalyzerOptions opt_;
  const Clock* clock_;
  AlertEmitter emitter_;
  NameTable names_;
  Sink sink_{this};
  Aligner aligner_;  // after names_ and sink_, which it uses
  std::unordered_map<const AlignedRun*, std::unique_ptr<RunDet>> runs_;
  std::vector<std::unique_ptr<PairDet>> pairs_;  // by AlignedPair::index
  uint64_t pairs_compared_ = 0;
  uint64_t unmatched_tensors_ = 0;
  PairStepObserver observer_;
  DivergenceObserver divergence_observer_;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_DETECT_ANALYZER_H_
