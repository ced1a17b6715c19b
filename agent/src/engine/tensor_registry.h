// TensorRegistry: the agent's tensor directory (id -> name, kind, dtype, shape, order).
//
// Register() is called from any training thread, once per tensor (warm-up: it allocates
// and takes the mutex). The sender thread reads entries with ForEach() to build
// TensorDirectory messages. size() is lock-free: a release store after an entry is
// complete, so a sender that saw a record enqueued after Register() returned also sees
// the entry (enqueue/dequeue is a release/acquire pair).
#ifndef LOCKSTEP_AGENT_ENGINE_TENSOR_REGISTRY_H_
#define LOCKSTEP_AGENT_ENGINE_TENSOR_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/agent/types.h"
#include "lockstep/common/thread_annotations.h"

namespace lockstep::engine {

struct TensorEntry {
  uint32_t id;
  std::string name;
  TensorKind kind;
  DType dtype;
  std::vector<int64_t> shape;
  uint32_t order;
  std::string module_type;  // e.g. "Conv2d"; empty when none
};

class TensorRegistry {
 public:
  static constexpr uint32_t kInvalidId = UINT32_MAX;

  // Returns the id of (name, kind), adding it when new (`*added` says which).
  // kInvalidId on a bad name (empty or longer than kMaxTensorNameLength). May throw
  // std::bad_alloc; the caller (a noexcept API) catches.
  uint32_t Register(const std::string& name, TensorKind kind, DType dtype,
                    const std::vector<int64_t>& shape, uint32_t order, bool* added,
                    const std::string& module_type = std::string()) EXCLUDES(mu_);

  uint32_t size() const noexcept { return size_.load(std::memory_order_acquire); }

  // Calls fn(entry) for ids in [from, to), under the mutex (sender thread).
  void ForEach(uint32_t from, uint32_t to, const std::function<void(const TensorEntry&)>& fn) const
      EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::map<std::pair<std::string, TensorKind>, uint32_t> ids_ GUARDED_BY(mu_);
  std::deque<TensorEntry> entries_ GUARDED_BY(mu_);  // index == id
  std::atomic<uint32_t> size_{0};
};

}  // namespace lockstep::engine

#endif  // LOCKSTEP_AGENT_ENGINE_TENSOR_REGISTRY_H_
