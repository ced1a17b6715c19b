// What `lockstep top` prints of a view-feed snapshot (view/snapshot.h): the snapshot read
// and arranged for display, and the text pieces both the ncurses screen and `--once`
// print (number formats, sparklines, table rows), so the two never disagree. The client's
// side of the feed: the collector only writes it.
//
// Pure functions; any thread.
#ifndef LOCKSTEP_COLLECTOR_TOP_TOP_TEXT_H_
#define LOCKSTEP_COLLECTOR_TOP_TOP_TEXT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/common/status.h"
#include "view/snapshot.h"

namespace lockstep::collector::view {

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

#endif  // LOCKSTEP_COLLECTOR_TOP_TOP_TEXT_H_
