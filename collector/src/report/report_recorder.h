// ReportRecorder: what the HTML report (docs/report.md) draws that the Analyzer's
// PairReport does not keep: a bounded, downsampled (tensor x step) matrix of drift
// scores with both runs' l2 per cell, the per-step scalars of both runs (loss, grad
// norm, lr, loss scale, step time), the first NaN/Inf step and tensor, and the alerts.
//
// It is fed by Analyzer::SetPairStepObserver (OnPairStep, once per compared (pair,
// rank, step)) and by the analyzer's AlertFn (OnAlert), so the logs are read once:
// `lockstep report` replays two logs through one Analyzer, `lockstep collect` feeds it
// live and serves /report from it.
//
// Bounds: at most max_cols step columns per pair (when a run grows past them, the stride
// doubles and neighbouring columns merge, keeping each tensor's worst cell), at most
// max_tensors rows (later tensors are counted, not kept), max_points scalar points
// (same halving, keeping every other point) and max_alerts alerts per experiment
// (later ones counted). Memory is O(max_tensors x max_cols), independent of run length:
// a row takes its max_cols cells (16 bytes each) when its tensor is first seen.
//
// The first divergence's neighbourhood at full resolution: besides the merged columns,
// each row keeps the last kNearSteps * 2 + 1 steps in a ring; when the pair's first
// divergence alert arrives (OnAlert), the ring fills up to kNearSteps steps past it and
// stops, so the page can show every step from kNearSteps before the divergence to
// kNearSteps after it however long the run (written as "near" once the heatmap merges
// columns).
//
// Threads: every method takes the recorder's own mutex, so OnPairStep/OnAlert (the
// analyzer's thread) and the Json functions (e.g. an HTTP thread) may run concurrently.
// The mutex is a leaf: nothing is called while it is held.
#ifndef LOCKSTEP_COLLECTOR_REPORT_REPORT_RECORDER_H_
#define LOCKSTEP_COLLECTOR_REPORT_REPORT_RECORDER_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "rules/detector.h"
#include "lockstep/alerting/alert.h"

namespace lockstep::collector {

class JsonOut;

struct ReportLimits {
  uint32_t max_cols = 400;      // step columns of the heatmap per pair
  uint32_t max_tensors = 2000;  // heatmap rows per pair
  uint32_t max_points = 2000;   // points of each scalar curve
  uint32_t max_alerts = 2000;   // alerts kept per experiment
};

class ReportRecorder {
 public:
  explicit ReportRecorder(ReportLimits limits = {});
  ReportRecorder(const ReportRecorder&) = delete;
  ReportRecorder& operator=(const ReportRecorder&) = delete;

  void OnPairStep(const PairCtx& ctx, const PairStepView& v);
  void OnAlert(const alerting::Alert& a);

  // Experiments with a compared pair, sorted.
  std::vector<std::string> Experiments() const;
  // Appends the recorded data of `experiment`'s first pair as the members of the open
  // object `j` ("ds", "cols", "rows", "S", "L", "C", "scal", "nonfinite"). False when
  // the experiment has no pair recorded.
  bool WriteMatrixJson(const std::string& experiment, JsonOut* j) const;
  // The alerts of `experiment` as "alerts" and "alerts_dropped" members of `j`.
  void WriteAlertsJson(const std::string& experiment, JsonOut* j) const;
  // Steps compared for the experiment's first pair (0: none recorded).
  uint64_t StepsCompared(const std::string& experiment) const;
  // A copy of the alerts kept for `experiment`.
  std::vector<alerting::Alert> AlertsOf(const std::string& experiment) const;

 private:
  struct Cell {
    float score = -1;  // score / threshold; < 0: no value
    float b_l2 = 0, c_l2 = 0;
    bool nonfinite = false;
  };
  struct Row {
    uint64_t key = 0;
    std::string name;
    Kind kind = Kind::kAct;
    uint32_t micro = 0;
    uint32_t order = 0;
    std::vector<Cell> cells;
    std::vector<Cell> near;  // kNearCols ring slots (Pair::near_step says which step)
  };
  static constexpr uint32_t kNearSteps = 16;
  static constexpr uint32_t kNearCols = 2 * kNearSteps + 1;
  static constexpr int kScalars = 5;  // loss, grad_norm, lr, loss_scale, step_time_s
  struct Point {
    uint64_t step = 0;
    float b[kScalars], c[kScalars];
  };
  struct Pair {
    std::string baseline, candidate;
    bool started = false;
    uint64_t first_step = 0;
    uint64_t stride = 1, pstride = 1;
    uint32_t ncols = 0;
    uint32_t scalar_rank = 0;
    uint64_t steps = 0, last_step = 0;
    uint64_t tensors_dropped = 0;
    std::vector<Row> rows;
    std::unordered_map<uint64_t, uint32_t> row_of;
    std::vector<Point> points;
    int64_t nf_step = -1;  // first step with a NaN/Inf in either run
    std::string nf_tensor, nf_side;
    // The neighbourhood ring: the step of each slot (UINT64_MAX: empty), the first
    // divergence's step once its alert came (-1 before), and whether the ring stopped.
    std::vector<uint64_t> near_step = std::vector<uint64_t>(kNearCols, UINT64_MAX);
    int64_t near_anchor = -1;
    bool near_frozen = false;
  };
  struct Alerts {
    std::vector<alerting::Alert> kept;
    uint64_t dropped = 0;
  };

  static void MergeCell(Cell* into, const Cell& c);
  void Halve(Pair* p) const;

  const ReportLimits limits_;
  mutable std::mutex mu_;
  std::map<std::string, Pair> pairs_;  // experiment -> its first pair
  std::map<std::string, Alerts> alerts_;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_REPORT_REPORT_RECORDER_H_
