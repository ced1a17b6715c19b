// The view feed's JSON (docs/top.md "Feed format") in one place: a Snapshot
// (snapshot.h) written by the collector (ViewModel::SnapshotJson) and read back by
// `lockstep top` (ParseSnapshot). Each row's fields are listed once, in one function
// that both directions walk, so the writer and the reader cannot drift apart; a field
// added there is sent and read.
//
// Pure functions; any thread.
#ifndef LOCKSTEP_COLLECTOR_VIEW_SNAPSHOT_JSON_H_
#define LOCKSTEP_COLLECTOR_VIEW_SNAPSHOT_JSON_H_

#include <string>
#include <string_view>

#include "lockstep/common/status.h"
#include "view/snapshot.h"

namespace lockstep::collector::view {

// The feed's version ("v"); a reader refuses any other.
inline constexpr int kFeedVersion = 1;

// One JSON object: numbers rounded to ~5 significant digits (the feed is for eyes and
// sparklines, and short numbers keep a 2 Hz snapshot small), unknown numbers (NaN) and
// steps (-1) null, a loss null when not given and "NaN" / "inf" / "-inf" when
// non-finite (JSON has no NaN). Invalid UTF-8 in a name (agents send bytes) is
// replaced, never thrown on. Snapshot::unpaired is derived, not sent.
std::string WriteSnapshotJson(const Snapshot& s);

// The feed's JSON back into a Snapshot, rows in the feed's order (ParseSnapshot
// arranges them for display). A missing field keeps its default (an older collector);
// InvalidArgument (one sentence) for what is not a snapshot of kFeedVersion.
StatusOr<Snapshot> ReadSnapshotJson(std::string_view json);

}  // namespace lockstep::collector::view

#endif  // LOCKSTEP_COLLECTOR_VIEW_SNAPSHOT_JSON_H_
