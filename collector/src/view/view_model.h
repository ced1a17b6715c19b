// ViewModel: what `lockstep top` shows, kept up to date inside `lockstep collect` and
// turned into a JSON snapshot (docs/top.md "Feed format") for the view feed.
//
// It is fed from three places, each cheap and non-blocking:
//   - OnPairStep: the Analyzer's pair-step observer, once per compared (pair, rank,
//     step), on the analyzer's thread with LiveAnalyzer's mutex held. It records the
//     pair's losses and, per matched tensor, the step's drift (score / threshold) and
//     both norms into a short ring, so a tensor's drift history exists without asking
//     the analyzer anything later.
//   - OnMessage (a MessageSink on the ingest thread): per-run loss and step time from
//     StepScalars, and a steps/s estimate.
//   - OnAlert: every alert the analyzer emits (its AlertFn, analyzer's thread).
// SnapshotJson (the publisher's thread) copies what it needs into a view::Snapshot under
// mu_ and writes it as JSON (view/snapshot_json.h, which `lockstep top` reads it back
// with) outside it, so neither the ingest thread nor the analyzer waits on JSON.
//
// Lock order: LiveAnalyzer's mutex -> ViewModel::mu_. The Registry's mutex is never
// held together with mu_ (the caller snapshots the registry first).
//
// Memory: per (pair, tensor) one ring of kHistory entries (~1.5 KB); per pair a loss
// ring; the last kAlerts alerts.
#ifndef LOCKSTEP_COLLECTOR_VIEW_VIEW_MODEL_H_
#define LOCKSTEP_COLLECTOR_VIEW_VIEW_MODEL_H_

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "rules/rank_onsets.h"
#include "lockstep/collector/message_sink.h"
#include "lockstep/collector/registry.h"
#include "lockstep/alerting/alert.h"
#include "lockstep/common/thread_annotations.h"

namespace lockstep::collector {

struct PairCtx;
struct PairStepView;

// Collector-wide figures the snapshot shows next to the runs.
struct ViewExtras {
  uint64_t records = 0;
  uint64_t bad_messages = 0;
  uint64_t analyzer_errors = 0;
};

struct ViewModelOptions {
  size_t max_tensors = 256;    // tensors per pair in a snapshot, most drifting first
  size_t history_tensors = 32; // of those, how many carry their drift history
  size_t loss_points = 120;    // loss history per pair
  size_t max_alerts = 50;      // recent alerts kept and sent
};

class ViewModel : public MessageSink {
 public:
  static constexpr size_t kHistory = 60;  // drift history points per tensor

  explicit ViewModel(ViewModelOptions opt = {});
  ViewModel(const ViewModel&) = delete;
  ViewModel& operator=(const ViewModel&) = delete;

  void OnPairStep(const PairCtx& ctx, const PairStepView& v) EXCLUDES(mu_);
  void OnMessage(const wire::Envelope& env, int64_t recv_unix_ns) override EXCLUDES(mu_);
  void OnAlert(const alerting::Alert& a) EXCLUDES(mu_);

  // The whole snapshot as one JSON object. `ranks` from Registry::Snapshot().
  std::string SnapshotJson(const std::vector<RankInfo>& ranks, const ViewExtras& extras,
                           int64_t now_unix_ns) const EXCLUDES(mu_);

 private:
  struct Point {
    uint64_t step;
    float ratio, b_l2, c_l2;
  };
  struct TensorState {
    std::string name, kind;
    uint32_t order = 0;
    uint64_t step = 0;
    double ratio = 0, score = 0, threshold = 1;
    double rel_l2 = 0, cosine = 1, b_l2 = 0, c_l2 = 0;
    std::string metric;
    int64_t first_drift_step = -1;
    int64_t first_nonfinite_step = -1;  // first step NaN/Inf on one side only
    double worst_ratio = 0;
    bool nonfinite = false;      // ever non-finite on one side only
    bool nonfinite_now = false;  // at `step`
    std::vector<Point> ring;  // kHistory entries once full
    size_t ring_pos = 0;
    // The point of first_drift_step: sent ahead of the ring once the ring has moved
    // past it, so the history always reaches the onset.
    Point onset{0, 0, 0, 0};
    bool has_onset = false;
  };
  struct LossPoint {
    uint64_t step;
    double b, c;
    bool b_given, c_given;  // false: the run gave no loss (b/c NaN); true NaN: a NaN loss
  };
  struct PairState {
    std::string experiment, baseline, candidate;
    uint64_t step = 0;
    uint64_t steps_compared = 0;     // (step, rank) comparisons
    std::set<uint32_t> ranks;        // the ranks among them
    double critical_factor = 10;
    std::deque<LossPoint> loss;
    std::unordered_map<uint64_t, TensorState> tensors;
    bool setup_known = false;        // both fingerprints compared (rule `setup`)
    uint64_t setup_differences = 0;
    std::string setup_summary;
    bool diverged = false;
    uint64_t first_div_step = 0;
    uint32_t first_div_rank = 0;
    std::string first_div_tensor;
    RankOnsets onsets;  // each rank's first drifting step: "on all 4 ranks"
    // The NaN/Inf producer: the first (step, execution order) a tensor went non-finite
    // on one side only. Pinned first in the tensor list.
    bool has_onset = false;
    uint64_t onset_step = 0, onset_key = 0;
    uint32_t onset_order = 0;
  };
  struct RunState {
    double loss = 0, step_time_s = 0;  // loss may be NaN/Inf when given so
    bool has_loss = false, has_time = false;
    uint64_t max_step = 0;
    bool any_step = false;
    std::deque<std::pair<int64_t, uint64_t>> progress;  // (recv ns, max step) when it advanced
  };
  struct AlertRow {
    int64_t unix_ns;
    std::string severity, rule, experiment, tensor, message;
    std::vector<std::string> runs;
    uint64_t step;
  };

  ViewModelOptions opt_;
  mutable Mutex mu_;
  std::map<std::string, PairState> pairs_ GUARDED_BY(mu_);  // by "experiment\tbaseline\tcandidate"
  std::map<std::string, RunState> runs_ GUARDED_BY(mu_);
  std::deque<AlertRow> alerts_ GUARDED_BY(mu_);
  uint64_t alerts_total_ GUARDED_BY(mu_) = 0;
  uint64_t alerts_by_severity_[3] GUARDED_BY(mu_) = {0, 0, 0};
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_VIEW_VIEW_MODEL_H_
