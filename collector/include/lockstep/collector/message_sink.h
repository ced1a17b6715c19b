// MessageSink: whoever consumes verified messages — the aligner live, or a replay of
// run logs (restart, --baseline, `lockstep compare`). The same interface for both, so
// live and offline analysis run the same code.
#ifndef LOCKSTEP_COLLECTOR_MESSAGE_SINK_H_
#define LOCKSTEP_COLLECTOR_MESSAGE_SINK_H_

#include <cstdint>

namespace lockstep::wire {
struct Envelope;
}

namespace lockstep::collector {

class MessageSink {
 public:
  virtual ~MessageSink() = default;
  // `env` was verified (flatbuffers Verifier, schema major, valid run id) and, live,
  // already appended to the run log. It is valid only during the call: copy what you
  // keep. Called from one thread (the ingest thread live; the caller's thread on
  // replay); must not block for long.
  virtual void OnMessage(const wire::Envelope& env, int64_t recv_unix_ns) = 0;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_MESSAGE_SINK_H_
