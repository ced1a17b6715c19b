// Retention: keeps a long run's log bounded by thinning its closed segments in the
// background (docs/runlog.md "Segments and retention").
//
// The rule, per closed segment of a run (log_format.h "Segments"):
//   - a segment whose steps are all at least `retain_steps` behind the run's top step
//     (the window) is thinned once. The top: for a run of an experiment with pairs, the
//     last step the live analysis compared in all of them that still compare (`pairs`),
//     so no step is thinned before a comparing pair compared it (even when one run is far
//     ahead and read back from its log) and the runs of a pair are thinned alike; when
//     every pair of the experiment has stopped comparing, the newest step of their runs
//     (each run of the experiment takes its experiment's top, ahead of it or behind). A pair has stopped (stalled) when its runs wrote more than 2 x retain_steps
//     steps past the newest step they had when its compared step last moved (counted on
//     the newest step in the closed segments of either run, from this object's first
//     pass): a dead or finished run's partner is bounded again, while a slow pair that
//     still compares holds its window. One that compares again holds it again from its
//     new step; what was thinned meanwhile it compares on the scalars alone. For a
//     baseline not yet paired, no top (a late candidate compares against its log from
//     the first step); for any other run, its newest step in its closed segments. A
//     segment thinned: of its
//     StepStats messages (the tensor statistics) it keeps those of every `thin_every`-th
//     step (step % thin_every == 0) and those of steps in an incident neighbourhood, and
//     hollows the others (the same envelope and step, no statistics: the sequence
//     numbers stay whole); every other message (Hello, directory, StepScalars with the
//     loss, lr and grad norm, StepEnd, heartbeats, control answers) is kept, so every
//     step is still there with its scalars;
//   - when the data dir's run logs use more than `max_disk_bytes`, segments are thinned
//     oldest first (by their last write) whatever the window, until they fit; when
//     nothing is left to thin, one "max_disk" alert (again once they fit and outgrow it);
//   - the incident neighbourhoods: each alert keeps steps [step - incident_margin_steps,
//     step + incident_margin_steps] in full in every run of its experiment (both runs of
//     a pair alike, so a kept step is compared whole); an incident that keeps alerting
//     keeps every step until margin steps after its last alert. They are appended to
//     "<data-dir>/retention.keep" (one "FIRST LAST EXPERIMENT" line each) when the alert
//     is raised, long before its steps leave the window, and read at each compaction,
//     so a restarted collector honours them too.
//
// Crash safety: a segment is thinned into "<segment>.thin" beside it, which is
// fdatasync-ed and then renamed over the segment (atomic), then the directory is
// fsync-ed. Killed at any moment, the segment is the old one or the whole new one; a
// leftover ".thin" file is removed at the next pass. A thinned segment ends with a
// thinning note (LogReader::thinned()) that readers report and that marks it as done.
//
// A failed compaction (a full disk) leaves the segment as it was, removes its partial
// ".thin" file and raises one "compaction_failed" alert through `on_alert`; it is
// retried at a later pass. Nothing here throws or stops the collector.
//
// Threads: KeepSteps() from any thread (an alert's); CompactOnce() from one thread at a
// time (the retention thread, or a test's with the thread not started);
// Start()/Shutdown() from the owner. Lock order: mu_ is a leaf.
#ifndef LOCKSTEP_COLLECTOR_RUNLOG_RETENTION_H_
#define LOCKSTEP_COLLECTOR_RUNLOG_RETENTION_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "lockstep/common/status.h"
#include "lockstep/common/thread_annotations.h"

namespace lockstep::collector {

// One (baseline, candidate) pair of the live analysis (run ids: their logs' names).
struct PairProgress {
  std::string baseline, candidate;
  uint64_t compared = 0;  // the last step it compared
};

struct RetentionOptions {
  std::string data_dir;
  uint64_t retain_steps = 2000;  // the window: every step of the last N in full
  uint64_t thin_every = 100;     // outside it, every K-th step in full
  uint64_t max_disk_bytes = 0;   // 0 = no limit
  uint64_t incident_margin_steps = 200;
  int64_t interval_ms = 2000;  // between passes of the retention thread
  // The pairs of `experiment` the live analysis has compared steps of, each with the
  // last step it compared; empty when none. Called on the retention thread. Empty
  // function: every run is taken as unpaired.
  std::function<std::vector<PairProgress>(const std::string& experiment)> pairs;
  // (metric, message) of a problem: "compaction_failed", "max_disk". Called on the
  // retention thread; must not block.
  std::function<void(const std::string&, const std::string&)> on_alert;
};

// What retention did since it was made; /metrics shows them (docs/metrics.md
// "Retention"). A copy, taken under the retention's lock.
struct RetentionCounters {
  uint64_t passes = 0;
  uint64_t segments_thinned = 0;
  uint64_t bytes_before = 0, bytes_after = 0;  // of the thinned segments
  uint64_t bytes_reclaimed = 0;  // the sum over them of before - after (when smaller)
  uint64_t messages_dropped = 0;  // StepStats messages hollowed
  uint64_t failures = 0;          // segments a pass could not thin (compaction_failed)
  double seconds = 0;       // spent thinning (reading, writing, syncing)
  double pass_seconds = 0;  // spent in passes, the scan of the data dir included
  // As of the end of the last pass: the bytes of the data dir's run logs, and whether
  // they were over max_disk_bytes then (with nothing left to thin, unless a failure
  // ended the pass).
  uint64_t log_bytes = 0;
  bool over_max_disk = false;
  uint64_t stalled_pairs = 0;  // pairs left out of the window's top (stopped comparing)
};

class Retention {
 public:
  explicit Retention(RetentionOptions options);
  ~Retention();  // Shutdown()
  Retention(const Retention&) = delete;
  Retention& operator=(const Retention&) = delete;

  // Keeps steps first..last of the runs of `experiment` in full (an incident's
  // neighbourhood). Appends to retention.keep unless the ranges already noted cover it
  // (this collector's, and those in the file when it was made: a restart's replayed
  // alerts add nothing). Never blocks on anything but one small write.
  void KeepSteps(const std::string& experiment, uint64_t first, uint64_t last) EXCLUDES(mu_);

  // One pass over the data dir: thins what the rule says. The first error that stopped
  // a segment's thinning (the pass goes on with the others), OK otherwise.
  Status CompactOnce();

  void Start();     // the retention thread ("ls-retention"), a pass every interval_ms
  void Shutdown();  // stops and joins it; a pass in progress finishes its segment
  RetentionCounters counters() const EXCLUDES(mu_);
  // Per experiment, the steps its incident neighbourhoods keep in full (the union of
  // its ranges in retention.keep, read at construction and kept since); any thread.
  std::vector<std::pair<std::string, uint64_t>> IncidentSteps() const EXCLUDES(mu_);
  const RetentionOptions& options() const { return opt_; }

 private:
  struct SegmentInfo {
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    uint64_t first_step = 0, max_step = 0;
    bool has_steps = false;
    bool thinned = false;
    bool baseline = false;   // a Hello of role baseline is in it
    std::string experiment;  // its first Hello's
  };
  // Reads the segment's steps and whether it carries a thinning note (cached by size
  // and mtime).
  StatusOr<SegmentInfo> Inspect(const std::string& path);
  Status Thin(const std::string& experiment, const std::string& path, uint64_t* saved);
  std::vector<std::pair<uint64_t, uint64_t>> KeepRanges(const std::string& experiment);
  // The top of the window of `experiment`'s runs from its pairs (the rule above), given
  // each run's newest step; false when it has no pair. Counts its stalled pairs.
  bool PairTop(const std::string& experiment, const std::map<std::string, uint64_t>& newest,
               uint64_t* top, uint64_t* stalled);
  void Loop();

  // A pair's compared step when it last moved, and its runs' newest step then.
  struct PairWatch {
    uint64_t compared = 0, lead = 0;
    bool stalled = false;
  };

  RetentionOptions opt_;
  std::map<std::string, SegmentInfo> info_;  // the pass's thread only
  // By (experiment, baseline, candidate); the pass's thread only.
  std::map<std::tuple<std::string, std::string, std::string>, PairWatch> watch_;
  bool over_disk_alerted_ = false;           // the pass's thread only

  mutable Mutex mu_;
  // Per experiment, the ranges of retention.keep merged: sorted, disjoint, not adjacent.
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> noted_ GUARDED_BY(mu_);
  RetentionCounters counters_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RUNLOG_RETENTION_H_
