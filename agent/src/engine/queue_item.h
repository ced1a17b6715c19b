// QueueItem: one fixed-size slot of the agent's preallocated queue, and the queue type.
//
// Producers (any training thread) fill an item and try_enqueue it; the sender thread
// (single consumer) drains them. Items are trivially copyable, so moodycamel moves them
// with a plain copy and never allocates for them.
#ifndef LOCKSTEP_AGENT_ENGINE_QUEUE_ITEM_H_
#define LOCKSTEP_AGENT_ENGINE_QUEUE_ITEM_H_

#include <concurrentqueue/concurrentqueue.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "lockstep/agent/types.h"

namespace lockstep::engine {

enum class ItemType : uint8_t {
  kStats = 0,      // one tensor's statistics (stats, step, micro_step, tensor_id, order)
  kScalars = 1,    // run-level scalars of `step`
  kEndStep = 2,    // `step` is over: ship what is held for it
  kDirectory = 3,  // a tensor was registered: ship the directory delta soon
};

struct QueueItem {
  ItemType type = ItemType::kStats;
  uint32_t micro_step = 0;
  uint32_t tensor_id = 0;
  uint32_t order = 0;
  uint64_t step = 0;
  StepScalars scalars;
  TensorStats stats;  // last: only its valid sketch/hist prefix is written by producers
};
static_assert(std::is_trivially_copyable_v<QueueItem>, "queue items are copied, never allocated");

// Queue geometry. A producer (explicit, with a ProducerToken) takes blocks from the
// preallocated pool and may hold at most EXPLICIT_INITIAL_INDEX_SIZE blocks before it
// would have to grow its block index — which allocates, so try_enqueue refuses instead.
// Hence the largest queue capacity is kBlockSize * kIndexSize items.
struct QueueTraits : public moodycamel::ConcurrentQueueDefaultTraits {
  static const size_t BLOCK_SIZE = 64;
  static const size_t EXPLICIT_INITIAL_INDEX_SIZE = 1024;
  static const size_t IMPLICIT_INITIAL_INDEX_SIZE = 32;
};
inline constexpr size_t kMaxQueueCapacity = QueueTraits::BLOCK_SIZE * QueueTraits::EXPLICIT_INITIAL_INDEX_SIZE;

using Queue = moodycamel::ConcurrentQueue<QueueItem, QueueTraits>;

}  // namespace lockstep::engine

#endif  // LOCKSTEP_AGENT_ENGINE_QUEUE_ITEM_H_
