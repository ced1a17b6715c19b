// WireEncoder: builds the agent's Envelope messages (schema/lockstep.fbs).
//
// One FlatBufferBuilder, reused with Clear(), so a warm encoder does not allocate.
// Sender thread only. Each Encode*() returns a view of the finished message that stays
// valid until the next Encode*() call.
#ifndef LOCKSTEP_AGENT_ENGINE_WIRE_ENCODER_H_
#define LOCKSTEP_AGENT_ENGINE_WIRE_ENCODER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/tensor_registry.h"
#include "lockstep/agent/agent.h"
#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::engine {

struct Bytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

struct HeartbeatValues {
  uint64_t records_enqueued = 0, records_sent = 0, records_dropped = 0, messages_dropped = 0;
  uint32_t queue_depth = 0;
  uint64_t errors = 0, last_step = 0;
};

class WireEncoder {
 public:
  WireEncoder(std::string run_id, uint32_t rank);
  WireEncoder(const WireEncoder&) = delete;
  WireEncoder& operator=(const WireEncoder&) = delete;

  Bytes Hello(const AgentOptions& o, int64_t start_unix_ns, uint64_t seq);
  // Entries [from, to) of the registry.
  Bytes Directory(const TensorRegistry& registry, uint32_t from, uint32_t to, uint64_t seq);
  // n records; sketch holds n*sketch_k floats, hist n*hist_bins counts.
  Bytes Stats(uint64_t step, const wire::TensorStat* stats, size_t n, uint16_t sketch_k,
              const float* sketch, uint8_t hist_bins, const uint32_t* hist, uint64_t seq);
  Bytes Scalars(uint64_t step, const StepScalars& s, uint64_t seq);
  Bytes Heartbeat(const HeartbeatValues& h, uint64_t seq);
  Bytes Goodbye(const char* reason, uint64_t last_step, uint64_t seq);

 private:
  Bytes Finish(wire::Body type, flatbuffers::Offset<void> body, uint64_t seq);

  std::string run_id_;
  uint32_t rank_;
  flatbuffers::FlatBufferBuilder fbb_;
};

}  // namespace lockstep::engine

#endif  // LOCKSTEP_AGENT_ENGINE_WIRE_ENCODER_H_
