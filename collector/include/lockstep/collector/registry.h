// Registry: what the collector knows about every (run, rank) it has heard from —
// the agent's Hello, message and record counts, sequence accounting (gaps,
// duplicates), the agent's own drop counters from heartbeats, bad messages, and the
// last step and heartbeat seen.
//
// Sequence accounting is exact: each (run, rank) numbers its messages 0, 1, 2, ...;
// a jump past the next expected number counts the skipped numbers as gaps and
// remembers them (up to kMaxMissingRanges ranges), so a late arrival fills its gap
// instead of being called a duplicate; a number already seen is a duplicate. A Hello
// with another (pid, start time) than the rank's current one is a new agent session
// (the job restarted): its numbering starts over and `sessions` counts it, while the
// agent-reported drop totals carry over.
//
// The registry is rebuilt at start-up by replaying the run logs through OnMessage(),
// so its figures survive a collector restart, and a gap across the restart is
// counted like any other.
//
// Thread-safe: OnMessage/OnBad come from the ingest thread (or a replay), Snapshot
// from any thread (status line, view, tests). One mutex; nothing else is locked
// while it is held.
#ifndef LOCKSTEP_COLLECTOR_REGISTRY_H_
#define LOCKSTEP_COLLECTOR_REGISTRY_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep::wire {
struct Envelope;
}

namespace lockstep::collector {

inline constexpr size_t kMaxMissingRanges = 4096;

// Figures of one (run, rank). Plain data: a Snapshot copies them.
struct RankInfo {
  std::string run;
  uint32_t rank = 0;

  // From the latest Hello (empty until one arrives).
  bool hello_seen = false;
  std::string experiment, role, platform, device_name, framework, host, agent_version;
  uint32_t world_size = 0, pid = 0;
  int64_t start_unix_ns = 0;
  uint64_t start_step = 0;

  uint64_t messages = 0;        // accepted messages (duplicates included)
  uint64_t records = 0;         // tensor stat records + step scalar records
  uint64_t stat_records = 0;    // TensorStat entries of StepStats
  uint64_t scalar_records = 0;  // StepScalars messages
  uint64_t bytes = 0;
  uint64_t first_seq = 0;       // lowest / highest sequence number seen (this session)
  uint64_t last_seq = 0;
  uint64_t gaps = 0;            // sequence numbers never received, all sessions
  uint64_t duplicates = 0;
  uint64_t sessions = 0;        // agent sessions seen (1 normally; +1 per agent restart)
  uint64_t bad_messages = 0;    // refused messages attributable to this rank

  // From heartbeats, summed over sessions.
  uint64_t agent_records_enqueued = 0, agent_records_sent = 0, agent_records_dropped = 0;
  uint64_t agent_messages_dropped = 0, agent_errors = 0;
  uint32_t agent_queue_depth = 0;  // latest

  int64_t first_recv_unix_ns = 0, last_recv_unix_ns = 0, last_heartbeat_unix_ns = 0;
  bool has_step = false;
  uint64_t last_step = 0;  // highest step seen in stats/scalars/heartbeat/goodbye
  bool goodbye = false;    // the latest session said goodbye
  std::string goodbye_reason;

  // Bookkeeping (not figures).
  uint64_t next_seq = 0;
  bool any_seq = false;
  std::vector<std::pair<uint64_t, uint64_t>> missing;  // [lo, hi) ranges, sorted
  uint64_t hb_base_enq = 0, hb_base_sent = 0, hb_base_drop = 0, hb_base_mdrop = 0,
           hb_base_err = 0;  // totals of earlier sessions
};

struct RegistryTotals {
  uint64_t runs = 0, ranks = 0, messages = 0, records = 0, gaps = 0, duplicates = 0,
           agent_records_dropped = 0, bad_messages = 0;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // A verified envelope (CheckEnvelope passed) of `bytes` bytes received at
  // `recv_unix_ns`.
  void OnMessage(const wire::Envelope& env, int64_t recv_unix_ns, size_t bytes);
  // A refused message that could be attributed to (run, rank).
  void OnBad(std::string_view run, uint32_t rank);

  // Copies, sorted by (run, rank).
  std::vector<RankInfo> Snapshot() const;
  // One rank, or false.
  bool Get(std::string_view run, uint32_t rank, RankInfo* out) const;
  RegistryTotals Totals() const;

 private:
  RankInfo& Rank(std::string_view run, uint32_t rank);  // mu_ held
  static void CountSeq(RankInfo& r, uint64_t seq);

  mutable std::mutex mu_;
  // std::less<> lets a string_view find a run without building a string.
  std::map<std::string, std::map<uint32_t, RankInfo>, std::less<>> runs_;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_REGISTRY_H_
