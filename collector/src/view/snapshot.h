// Snapshot: the view feed (docs/top.md "Feed format") as plain structs — what the
// collector's ViewModel fills and `lockstep top` reads back (the JSON both ways:
// snapshot_json.h) — plus the text pieces both the ncurses screen and `--once` print
// (number formats, sparklines, table rows), so the two never disagree.
//
// Pure functions and values; any thread.
#ifndef LOCKSTEP_COLLECTOR_VIEW_SNAPSHOT_H_
#define LOCKSTEP_COLLECTOR_VIEW_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/common/status.h"

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

// ReadSnapshotJson (snapshot_json.h), then arranged for display: InvalidArgument (one
// sentence) when `json` is not a feed snapshot of version 1. Orders for display: pairs
// with a live run first, then runs of those pairs, other live runs, and ended runs
// last, so a small screen shows what is running.
StatusOr<Snapshot> ParseSnapshot(std::string_view json);

// What a pair's `compared` count counts: (step, rank) comparisons. "40 steps" (one
// rank), "40 steps x 4 ranks" (× with unicode), "161 rank-steps over 4 ranks" (ranks
// at different steps), or the bare count from an older collector.
std::string ComparedText(uint64_t compared, uint64_t ranks, bool unicode);

// Whether an alert is about the pair: one of its runs is the pair's baseline or candidate.
bool AlertOfPair(const AlertRow& a, const PairRow& p);
// Short label of the runs an alert is about: "base/cand" or "run".
std::string AlertLabel(const AlertRow& a);
// A loss: "-" when not given, "NaN", "inf", else FormatNum.
std::string FormatLoss(double v, bool given, int width = 8);
// A duration in seconds as "7.81ms", "781ms", "1.23s"; "-" for NaN. At most 6 characters.
std::string FormatSeconds(double s);
// A tensor name cut to `w` columns from the left, at a '.' when one fits, so the leaf
// stays: "...layers.11.mlp.fc2". `unicode`: an ellipsis character, else "~".
std::string ShortName(const std::string& name, size_t w, bool unicode);
// Display columns of a UTF-8 string (every code point one column: the view's are), and
// its first `w` columns (the plain snapshot and the terminal view share them).
size_t Cols(const std::string& s);
std::string ClipCols(const std::string& s, size_t w);

// "1.23e-05", "0.0123", "12.3", "-" for NaN; at most `width` characters.
std::string FormatNum(double v, int width = 8);
// One character per value scaled between the min and max of `values` (NaN: a space);
// Unicode blocks when `unicode`, an ASCII ramp otherwise. The last `width` values.
std::string Sparkline(const std::vector<double>& values, int width, bool unicode);
// "ago" text for an age in seconds: "0.4s", "12s", "3m", "-".
std::string FormatAge(double seconds);

// The plain-text report of `lockstep top --once` (and the heart of the screen's rows),
// at most `width` columns (at least 60).
std::string FormatPlain(const Snapshot& s, const std::string& endpoint, int width, bool unicode);

// Column layout of the tensor table for a terminal `width` wide (screen and --once).
size_t TensorNameWidth(int width);
std::string TensorHeader(size_t name_w);
std::string TensorLine(const TensorRow& t, size_t name_w, bool unicode);
// Column layout of the runs table (PLAT only when RunShowsPlatform(width)).
bool RunShowsPlatform(int width);
size_t RunNameWidth(int width);
std::string RunHeader(size_t name_w, bool platform);
std::string RunLine(const RunRow& r, size_t name_w, bool platform, bool unicode);

}  // namespace lockstep::collector::view

#endif  // LOCKSTEP_COLLECTOR_VIEW_SNAPSHOT_H_
