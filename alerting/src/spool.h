// Spool: the alerts one sink has accepted but not yet delivered, oldest first.
//
// On disk (a directory per sink) each alert is one file "<seq>.json", written to a
// temporary name and renamed, so a crash leaves either the whole record or none; a
// restart finds them in order. The size cap drops the oldest (counted). Without a
// directory the spool lives in memory, capped by count.
//
// Threads: single owner (the sink's worker thread).
#ifndef LOCKSTEP_ALERTING_SRC_SPOOL_H_
#define LOCKSTEP_ALERTING_SRC_SPOOL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "lockstep/alerting/alert.h"
#include "lockstep/common/status.h"

namespace lockstep::alerting {

class Spool {
 public:
  // `dir` "" = memory only (at most `max_items`); else created if missing, and what
  // it holds is picked up (at most `max_bytes` in all).
  static StatusOr<std::unique_ptr<Spool>> Open(const std::string& dir, uint64_t max_bytes,
                                               size_t max_items);
  // Appends `alert`. Returns how many of the oldest were dropped to stay in the cap.
  // A failed disk write keeps the alert in memory (not lost, but not restart-proof)
  // and returns the error in `*write_error`.
  uint64_t Push(const Alert& alert, Status* write_error);
  bool Empty() const { return entries_.empty(); }
  size_t Size() const { return entries_.size(); }
  // The oldest alert, or nullptr if empty. Unreadable records are removed (counted).
  const Alert* Front();
  void PopFront();
  uint64_t corrupt_dropped() const { return corrupt_dropped_; }
  bool on_disk() const { return !dir_.empty(); }

 private:
  struct Entry {
    uint64_t seq = 0;
    uint64_t bytes = 0;
    std::optional<Alert> alert;  // memory entries, and the cached front of disk ones
  };
  Spool() = default;
  std::string PathOf(uint64_t seq) const;
  void DropFront();

  std::string dir_;
  uint64_t max_bytes_ = 0;
  size_t max_items_ = 0;
  uint64_t total_bytes_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t corrupt_dropped_ = 0;
  std::deque<Entry> entries_;
};

// "<kind>-<16 hex digits of a hash of the target>": stable across restarts, and
// reveals nothing of the URL's secret.
std::string SpoolSubdirName(const std::string& kind, const std::string& target);

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_SRC_SPOOL_H_
