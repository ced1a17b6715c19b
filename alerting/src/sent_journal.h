// SentJournal: the alerts one sink has already handled, kept on disk so that a
// restarted collector, which replays its run logs through the detectors and so derives
// the same alerts again, does not send them twice (docs/alerting.md "Restarts").
//
// One line per alert the sink decided on: passed and made durable (written to its
// on-disk spool, or delivered when the spool is in memory), or suppressed (severity
// filter, dedup, rate limit). Tab-separated:
//   unix_ns  passed(0|1)  severity(0..2)  first_seen_unix_ns  dedup_key  instance_key
// A line torn by a crash (no newline) is ignored. Appended with write() and no fsync:
// it survives a crash of the process, not a power loss (as the run logs between fsyncs).
//
// Threads: single owner (the sink's worker thread).
#ifndef LOCKSTEP_ALERTING_SRC_SENT_JOURNAL_H_
#define LOCKSTEP_ALERTING_SRC_SENT_JOURNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "lockstep/alerting/alert.h"
#include "lockstep/common/status.h"

namespace lockstep::alerting {

// What identifies one alert instance across a restart: its id (dedup key @ step), the
// run(s), the rank and the severity (a per-run rule can fire for the baseline and the
// candidate at the same step and tensor; a drift can turn critical at the same step).
std::string InstanceKey(const Alert& a);

class SentJournal {
 public:
  struct Entry {
    int64_t unix_ns = 0;  // when the sink decided
    bool passed = false;
    Severity severity = Severity::kInfo;
    int64_t first_seen_unix_ns = 0;
    std::string dedup_key;
  };
  // Reads `path` (missing = empty) and opens it for appending; creates its directory.
  static StatusOr<std::unique_ptr<SentJournal>> Open(const std::string& path);
  ~SentJournal();
  SentJournal(const SentJournal&) = delete;
  SentJournal& operator=(const SentJournal&) = delete;

  bool Contains(const std::string& instance_key) const { return keys_.count(instance_key) != 0; }
  // Appends one line. An I/O error is returned (the caller warns, rate-limited); the
  // key is remembered in memory either way.
  Status Record(const Alert& a, bool passed, int64_t now_unix_ns);
  // The passed entries read at Open, oldest first (to seed the dedup cooldown).
  const std::vector<Entry>& passed_at_open() const { return passed_at_open_; }
  size_t size() const { return keys_.size(); }
  const std::string& path() const { return path_; }

 private:
  SentJournal() = default;
  std::string path_;
  int fd_ = -1;
  std::unordered_set<std::string> keys_;
  std::vector<Entry> passed_at_open_;
};

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_SRC_SENT_JOURNAL_H_
