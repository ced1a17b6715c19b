#include "engine/tensor_registry.h"

namespace lockstep::engine {

uint32_t TensorRegistry::Register(const std::string& name, TensorKind kind, DType dtype,
                                  const std::vector<int64_t>& shape, uint32_t order, bool* added,
                                  const std::string& module_type) {
  *added = false;
  if (name.empty() || name.size() > kMaxTensorNameLength) return kInvalidId;
  MutexLock lock(&mu_);
  auto key = std::make_pair(name, kind);
  auto it = ids_.find(key);
  if (it != ids_.end()) return it->second;
  if (entries_.size() >= kInvalidId) return kInvalidId;
  uint32_t id = static_cast<uint32_t>(entries_.size());
  entries_.push_back(TensorEntry{id, name, kind, dtype, shape, order,
                                 module_type.substr(0, kMaxTensorNameLength)});
  ids_.emplace(std::move(key), id);
  size_.store(id + 1, std::memory_order_release);
  *added = true;
  return id;
}

void TensorRegistry::ForEach(uint32_t from, uint32_t to,
                             const std::function<void(const TensorEntry&)>& fn) const {
  MutexLock lock(&mu_);
  for (uint32_t i = from; i < to && i < entries_.size(); ++i) fn(entries_[i]);
}

}  // namespace lockstep::engine
