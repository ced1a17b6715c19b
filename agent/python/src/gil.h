// When the host statistics calls let other Python threads run: shared by the Agent's
// bindings (bind_agent_host.cc) and the recorder (py_recorder.cc), which call the same
// kernel.
#ifndef LOCKSTEP_AGENT_PYTHON_GIL_H_
#define LOCKSTEP_AGENT_PYTHON_GIL_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace lockstep::python {

// Records of fewer elements keep the GIL. On a small tensor (most of a convnet's:
// BatchNorm's 64-512-element gradients) the kernel takes ~1 us, and releasing the GIL
// there buys nothing: it costs ~0.1 us alone, and when another Python thread waits for
// the GIL (a data loader's), taking it back can wait for that thread's switch interval.
// From 64 Ki elements (~15 us of kernel at 4.5 GB/s) the other threads may run meanwhile.
inline constexpr uint64_t kReleaseGilElems = uint64_t{1} << 16;

// The element count of a view with these sizes, for that rule.
inline uint64_t NumelOf(const std::vector<int64_t>& sizes) {
  uint64_t n = 1;
  for (int64_t s : sizes) n *= s > 0 ? static_cast<uint64_t>(s) : 0;
  return n;
}

// Releases the GIL for the scope only when `release`.
class MaybeReleaseGil {
 public:
  explicit MaybeReleaseGil(bool release) {
    if (release) release_.emplace();
  }

 private:
  std::optional<pybind11::gil_scoped_release> release_;
};

}  // namespace lockstep::python

#endif  // LOCKSTEP_AGENT_PYTHON_GIL_H_
