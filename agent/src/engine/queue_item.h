// QueueItem: one fixed-size slot of the agent's preallocated queue, and the queue type.
//
// Producers (any training thread) fill an item and try_enqueue it; the sender thread
// (single consumer) drains them. Copying an item never allocates.
#ifndef LOCKSTEP_AGENT_ENGINE_QUEUE_ITEM_H_
#define LOCKSTEP_AGENT_ENGINE_QUEUE_ITEM_H_

#include <concurrentqueue/concurrentqueue.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "lockstep/agent/types.h"

namespace lockstep::engine {

enum class ItemType : uint8_t {
  kStats = 0,      // one tensor's statistics (stats, step, micro_step, tensor_id, order)
  kScalars = 1,    // run-level scalars of `step`
  kEndStep = 2,    // `step` is over: ship what is held for it, then its StepEnd
  kDirectory = 3,  // a tensor was registered: ship the directory delta soon
  kIdentity = 4,   // from now on: rank = tensor_id, world_size = order (SetIdentity)
};

struct QueueItem {
  ItemType type = ItemType::kStats;
  uint32_t micro_step = 0;
  uint32_t tensor_id = 0;
  uint32_t order = 0;
  uint64_t step = 0;
  StepScalars scalars;
  TensorStats stats;  // last: only its valid sketch/hist prefix is ever copied

  QueueItem() = default;
  // A copy (and so every move moodycamel makes, in and out of the slot) carries only
  // the valid part of the sketch and histogram: ~330 bytes for the default sketch_k = 32
  // instead of the slot's ~1.3 KiB, which is what bounds the pipe's throughput.
  QueueItem(const QueueItem& o) noexcept { CopyFrom(o); }
  QueueItem& operator=(const QueueItem& o) noexcept {
    CopyFrom(o);
    return *this;
  }
  ~QueueItem() = default;

  // Copies `from`'s fixed fields and its first sketch_k / hist_bins entries.
  static void CopyStats(const TensorStats& from, TensorStats* to) noexcept {
    static_assert(std::is_trivially_copyable_v<TensorStats>);
    std::memcpy(static_cast<void*>(to), &from, offsetof(TensorStats, sketch));
    size_t k = from.sketch_k < kMaxSketchK ? from.sketch_k : kMaxSketchK;
    std::memcpy(to->sketch, from.sketch, k * sizeof(float));
    size_t bins = from.hist_bins < kHistBins ? from.hist_bins : kHistBins;
    std::memcpy(to->hist, from.hist, bins * sizeof(uint32_t));
  }

 private:
  void CopyFrom(const QueueItem& o) noexcept {
    type = o.type;
    micro_step = o.micro_step;
    tensor_id = o.tensor_id;
    order = o.order;
    step = o.step;
    scalars = o.scalars;
    CopyStats(o.stats, &stats);
  }
};
static_assert(std::is_nothrow_copy_constructible_v<QueueItem>, "moodycamel moves items without allocating");

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
static_assert(kMaxQueueCapacity == lockstep::kMaxQueueCapacity, "AgentOptions' limit (agent.h) is the queue's geometry");

using Queue = moodycamel::ConcurrentQueue<QueueItem, QueueTraits>;

}  // namespace lockstep::engine

#endif  // LOCKSTEP_AGENT_ENGINE_QUEUE_ITEM_H_
