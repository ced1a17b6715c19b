// Snapshot: the view feed (docs/top.md "Feed format") as plain structs — what the
// collector's ViewModel fills and `lockstep top` reads back (the JSON both ways:
// snapshot_json.h; what top prints of it: top/top_text.h).
//
// Values; any thread.
#ifndef LOCKSTEP_COLLECTOR_VIEW_SNAPSHOT_H_
#define LOCKSTEP_COLLECTOR_VIEW_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <vector>


namespace lockstep::collector::view {

// Unknown numbers are NaN (null in the feed); unknown steps are -1.
struct RunRow {
  std::string run, role, platform, device, experiment;
  uint32_t ranks = 0, world = 0;
  int64_t step = -1, lag = 0;
  bool has_lag = false, ended = false;
  double sps = 0, loss = 0, step_time_s = 0, last_seen_s = 0;
  bool has_loss = false;  // false: no loss given ("-"); true: `loss`, NaN/Inf included
  uint64_t drops = 0, gaps = 0, bad = 0;
};

struct HistPoint {
  int64_t step = 0;
  double ratio = 0, b_l2 = 0, c_l2 = 0;
};

struct TensorRow {
  std::string name, kind, metric, status;
  uint32_t order = 0;
  int64_t step = 0, first = -1, first_nonfinite = -1;
  double ratio = 0, score = 0, rel_l2 = 0, cos = 1, b_l2 = 0, c_l2 = 0, worst = 0;
  bool has_hist = false;
  std::vector<HistPoint> hist;
};

struct LossPoint {
  int64_t step = 0;
  double b = 0, c = 0;  // NaN also when not given
  bool b_given = false, c_given = false;  // as RunRow::has_loss
};

struct PairRow {
  std::string experiment, baseline, candidate;
  int64_t step = 0;
  uint64_t compared = 0, tensors_total = 0, drifting = 0;
  uint64_t ranks = 0;  // distinct ranks compared (0: an older collector, which does not say)
  double loss_b = 0, loss_c = 0, loss_rel = 0;
  bool has_loss_b = false, has_loss_c = false;  // as RunRow::has_loss
  std::vector<LossPoint> loss_hist;
  bool has_setup = false;          // the fingerprints were compared
  int64_t setup_differences = -1;  // -1: fingerprints not compared (yet)
  std::string setup_summary;
  bool diverged = false;
  int64_t first_div_step = -1;
  uint32_t first_div_rank = 0;  // the rank that diverged first
  std::string first_div_tensor;
  std::string first_div_where;  // "rank 2", "all 4 ranks" ("" from an older collector)
  // " rank 2" / " on all 4 ranks" / "" for the first-divergence line.
  std::string FirstDivWhere() const {
    if (first_div_where.empty()) return "";
    return first_div_where.rfind("rank ", 0) == 0 ? " " + first_div_where : " on " + first_div_where;
  }
  bool has_nan_onset = false;  // the first tensor to go NaN/Inf on one side only
  int64_t nan_onset_step = -1;
  std::string nan_onset_tensor, nan_onset_kind;
  bool active = false;             // a run of the pair has not said goodbye
  std::vector<TensorRow> tensors;  // the NaN producer first, then most drifting
};

struct AlertRow {
  int64_t unix_ms = 0, step = 0;
  std::string severity, rule, experiment, tensor, message;
  std::vector<std::string> runs;
};

// One snapshot of the view feed; snapshot_json.h writes and reads it as JSON.
struct Snapshot {
  int64_t unix_ms = 0;
  uint64_t records = 0, bad = 0, analyzer_errors = 0;
  std::vector<RunRow> runs;
  std::vector<PairRow> pairs;
  uint64_t alerts_total = 0, alerts_info = 0, alerts_warning = 0, alerts_critical = 0;
  std::vector<AlertRow> alerts;  // newest first
  // Derived: one sentence per live candidate that no baseline of its experiment can
  // pair (a typo in experiment= is the usual cause), naming the experiments that do
  // have a baseline.
  std::vector<std::string> unpaired;
};

}  // namespace lockstep::collector::view

#endif  // LOCKSTEP_COLLECTOR_VIEW_SNAPSHOT_H_
