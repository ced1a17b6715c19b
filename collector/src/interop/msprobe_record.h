// One dump.json record of msprobe, read from the stream into a small tree: tensors
// (with their statistics), other values, lists and dicts. One entry's record at a time,
// so its size is that of one call's arguments, never the file's.
// Pure data and one reader function; one thread.
#ifndef LOCKSTEP_COLLECTOR_INTEROP_MSPROBE_RECORD_H_
#define LOCKSTEP_COLLECTOR_INTEROP_MSPROBE_RECORD_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "interop/json_stream.h"
#include "lockstep/common/status.h"

namespace lockstep::collector::msprobe {

// {"type": "torch.Tensor", "dtype": ..., "shape": [...], "Max", "Min", "Mean", "Norm",
// "requires_grad", "data_name"?}
struct Tensor {
  std::string dtype;              // "torch.float32"
  std::vector<int64_t> shape;
  double max = NAN, min = NAN, mean = NAN, norm = NAN;
  bool has_stats = false;         // any of Max/Min/Mean/Norm was a number
  bool requires_grad = false;
  std::string data_name;          // task tensor: the file in dump_tensor_data/
  uint64_t numel() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= d > 0 ? static_cast<uint64_t>(d) : 0;
    return n;
  }
};

struct Value {
  enum class Type : uint8_t { kNone, kTensor, kOther, kList, kDict };
  Type type = Type::kNone;
  Tensor tensor;                                  // kTensor
  std::vector<std::pair<std::string, Value>> items;  // kList (keys empty), kDict

  const Value* Find(const std::string& key) const {
    for (const auto& [k, v] : items) {
      if (k == key) return &v;
    }
    return nullptr;
  }
};

// Reads the value whose first token `first` was just returned by `js`.
Status ReadValue(JsonStream* js, JsonStream::Token first, Value* out);

}  // namespace lockstep::collector::msprobe

#endif  // LOCKSTEP_COLLECTOR_INTEROP_MSPROBE_RECORD_H_
