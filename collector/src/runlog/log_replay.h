// ReplayLogs: feeds every run log of a data dir to a MessageSink in the order the
// collector received the messages — the logs merged by their records' receive times —
// so that a restarted `lockstep collect` rebuilds its analysis (roles, tensor
// directories, open and waiting steps, pairs, detector state) from the logs, which are
// the truth (docs/runlog.md "Restart").
//
// `tick(recv_unix_ns)` is called whenever the replayed time has advanced by `tick_ns`
// since the last call, as the live collector's timer would have (idle step close).
// Records that fail verification are skipped and counted. Run before the collector's
// ingest thread starts; the logs must not be written meanwhile (Collector::Create has
// already cut torn tails).
//
// Threads: the caller's; sink and tick run on it.
#ifndef LOCKSTEP_COLLECTOR_RUNLOG_LOG_REPLAY_H_
#define LOCKSTEP_COLLECTOR_RUNLOG_LOG_REPLAY_H_

#include <cstdint>
#include <functional>
#include <string>

#include "lockstep/collector/message_sink.h"
#include "lockstep/common/status.h"

namespace lockstep::collector {

struct ReplayStats {
  uint64_t runs = 0;
  uint64_t messages = 0;
  uint64_t skipped = 0;  // records that did not verify, or logs that could not be opened
  int64_t last_recv_unix_ns = 0;
};

StatusOr<ReplayStats> ReplayLogs(const std::string& data_dir, MessageSink* sink,
                                 const std::function<void(int64_t)>& tick,
                                 int64_t tick_ns = 10'000'000);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RUNLOG_LOG_REPLAY_H_
