// Snapshot: the view feed's JSON (docs/top.md "Feed format") read back into plain
// structs for `lockstep top`, plus the text pieces both the ncurses screen and
// `--once` print (number formats, sparklines, table rows), so the two never disagree.
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
  uint64_t drops = 0, gaps = 0, bad = 0;
};

struct HistPoint {
  int64_t step = 0;
  double ratio = 0, b_l2 = 0, c_l2 = 0;
};

struct TensorRow {
  std::string name, kind, metric, status;
  uint32_t order = 0;
  int64_t step = 0, first = -1;
  double ratio = 0, score = 0, rel_l2 = 0, cos = 1, b_l2 = 0, c_l2 = 0, worst = 0;
  bool has_hist = false;
  std::vector<HistPoint> hist;
};

struct LossPoint {
  int64_t step = 0;
  double b = 0, c = 0;
};

struct PairRow {
  std::string experiment, baseline, candidate;
  int64_t step = 0;
  uint64_t compared = 0, tensors_total = 0, drifting = 0;
  double loss_b = 0, loss_c = 0, loss_rel = 0;
  std::vector<LossPoint> loss_hist;
  int64_t setup_differences = -1;  // -1: fingerprints not compared (yet)
  std::string setup_summary;
  bool diverged = false;
  int64_t first_div_step = -1;
  std::string first_div_tensor;
  std::vector<TensorRow> tensors;  // most drifting first
};

struct AlertRow {
  int64_t unix_ms = 0, step = 0;
  std::string severity, rule, experiment, tensor, message;
  std::vector<std::string> runs;
};

struct Snapshot {
  int64_t unix_ms = 0;
  uint64_t records = 0, bad = 0;
  std::vector<RunRow> runs;
  std::vector<PairRow> pairs;
  uint64_t alerts_total = 0, alerts_info = 0, alerts_warning = 0, alerts_critical = 0;
  std::vector<AlertRow> alerts;  // newest first
};

// InvalidArgument (one sentence) when `json` is not a feed snapshot of version 1.
StatusOr<Snapshot> ParseSnapshot(std::string_view json);

// "1.23e-05", "0.0123", "12.3", "-" for NaN; at most `width` characters.
std::string FormatNum(double v, int width = 8);
// One character per value scaled between the min and max of `values` (NaN: a space);
// Unicode blocks when `unicode`, an ASCII ramp otherwise. The last `width` values.
std::string Sparkline(const std::vector<double>& values, int width, bool unicode);
// "ago" text for an age in seconds: "0.4s", "12s", "3m", "-".
std::string FormatAge(double seconds);

// The plain-text report of `lockstep top --once` (and the heart of the screen's rows).
std::string FormatPlain(const Snapshot& s, const std::string& endpoint, int width, bool unicode);

}  // namespace lockstep::collector::view

#endif  // LOCKSTEP_COLLECTOR_VIEW_SNAPSHOT_H_
