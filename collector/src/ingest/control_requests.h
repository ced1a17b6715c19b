// ControlRequests: the collector's open requests to agents and their answers
// (lockstep/collector/control.h; docs/design.md "The control channel").
//
// Add() may be called from any thread (the analyzer's, when a first divergence asks
// for a zoom); the ingest thread, which owns the control socket, asks Due() for the
// frames to publish now and gives the agents' answers to OnAnswer(). A request is
// published at once, again every `republish_ns` until settled, and at once again when
// a new agent subscribes (a late joiner: ZeroMQ's PUB drops what was sent before it
// came). Settled: every rank of its run answered with a final status (the world size
// from the registry; 1 when unknown), or `expire_ns` passed. A few requests a run: one
// mutex, no hot path.
#ifndef LOCKSTEP_COLLECTOR_INGEST_CONTROL_REQUESTS_H_
#define LOCKSTEP_COLLECTOR_INGEST_CONTROL_REQUESTS_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "lockstep/collector/control.h"

namespace lockstep::wire {
struct ControlAck;
}

namespace lockstep::collector {

class ControlRequests {
 public:
  // `world_size(run)`: the ranks a run has (0: unknown); called on the ingest thread.
  ControlRequests(int64_t republish_ns, int64_t expire_ns, std::function<uint32_t(const std::string&)> world_size);

  // Any thread. The request's id (unique in this collector: a random start, then +1,
  // so a restarted collector's ids do not repeat what agents remember).
  uint64_t Add(ControlRequestSpec spec, int64_t now_ns);

  // Ingest thread: the encoded ControlRequest frames due at `now_ns` (`subscribed`: an
  // agent subscribed since the last call; every open request goes out again).
  std::vector<std::string> Due(int64_t now_ns, bool subscribed);

  // Ingest thread: an agent's answer, from run `run` rank `rank` (whose messages say
  // `schema_minor`). True, with the request as it now stands in `*now`, when it
  // answered one of this session's requests.
  bool OnAnswer(const std::string& run, uint32_t rank, const wire::ControlAck& ack, ControlRequestState* now,
                uint16_t schema_minor = 0);

  // Any thread: every request of this session, oldest first.
  std::vector<ControlRequestState> Snapshot() const;

  // Encodes one request as the control socket carries it (tests read it back).
  static std::string Encode(uint64_t id, const ControlRequestSpec& spec, int64_t now_ns);

  // The capture's own replay an answer carries (ControlAck.replay), or nullopt. Also
  // read by the offline pipeline from the run logs (detect/compare_gate.h LogScan).
  static std::optional<SelfReplayResult> SelfReplayOf(const wire::ControlAck& ack);

 private:
  struct Entry {
    ControlRequestState state;
    int64_t next_ns = 0;  // next publication
  };
  const int64_t republish_ns_, expire_ns_;
  std::function<uint32_t(const std::string&)> world_size_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // guarded by mu_
  uint64_t next_id_;            // guarded by mu_
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_INGEST_CONTROL_REQUESTS_H_
