// WireEncoder: builds the agent's Envelope messages (schema/lockstep.fbs).
//
// One FlatBufferBuilder, reused with Clear(), so a warm encoder does not allocate.
// Sender thread only. Each Encode*() returns a view of the finished message that stays
// valid until the next Encode*() call.
#ifndef LOCKSTEP_AGENT_ENGINE_WIRE_ENCODER_H_
#define LOCKSTEP_AGENT_ENGINE_WIRE_ENCODER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor_registry.h"
#include "lockstep/agent/agent.h"
#include "lockstep/schema/lockstep_generated.h"
#include "transport/buffer_pool.h"

namespace lockstep::engine {

struct Bytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// A finished message whose block the caller now owns; it goes back with
// BufferPool::ReleaseCallback(data, block).
struct OwnedBytes {
  uint8_t* data = nullptr;
  size_t size = 0;
  uint8_t* block = nullptr;
};

struct HeartbeatValues {
  uint64_t records_enqueued = 0, records_sent = 0, records_dropped = 0, messages_dropped = 0;
  uint32_t queue_depth = 0;
  uint64_t errors = 0, last_step = 0;
};

class WireEncoder {
 public:
  // With a pool, the builder's blocks come from it (initial_bytes each: size it to the
  // largest usual message so a batch is built without regrowing) and Detach() works.
  WireEncoder(std::string run_id, uint32_t rank, BufferPool* pool = nullptr,
              size_t initial_bytes = 64 * 1024);
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
  Bytes Fingerprint(const std::vector<std::pair<std::string, std::string>>& entries, uint64_t seq);
  Bytes Goodbye(const char* reason, uint64_t last_step, uint64_t seq);
  // `replay`: a capture's own replay (SelfReplay, schema minor 6), or null.
  Bytes Ack(uint64_t id, AckStatus status, uint64_t step, const std::string& detail, uint64_t seq,
            const SelfReplay* replay = nullptr);
  // `micro` holds the records per micro step (may be empty).
  Bytes StepEnd(uint64_t step, uint64_t records, const std::vector<uint32_t>& micro, uint64_t seq);
  Bytes Sampling(const lockstep::Sampling& s, uint16_t sketch_k, uint8_t hist_bins, uint64_t seq);
  // The rank of every later message (Envelope.rank).
  void set_rank(uint32_t rank) { rank_ = rank; }

  // Hands the last finished message's block to the caller (the builder takes a fresh
  // one from the pool for the next message). Only with a pool.
  bool can_detach() const { return allocator_ != nullptr; }
  OwnedBytes Detach();

 private:
  Bytes Finish(wire::Body type, flatbuffers::Offset<void> body, uint64_t seq);

  std::string run_id_;
  uint32_t rank_;
  uint64_t session_;  // random, never 0: Envelope.session
  std::unique_ptr<PooledAllocator> allocator_;  // before fbb_: outlives it
  flatbuffers::FlatBufferBuilder fbb_;
};

}  // namespace lockstep::engine

#endif  // LOCKSTEP_AGENT_ENGINE_WIRE_ENCODER_H_
