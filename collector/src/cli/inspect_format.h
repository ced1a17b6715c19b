// JSON renderings of run-log contents, shared by `lockstep inspect` and tests.
// docs/runlog.md lists every field.
//
// InspectFormatter renders one record per line. It remembers each (run, rank)'s
// tensor directory as it goes, so a StepStats record names its tensors ("name",
// "kind", "dtype", "shape") when their TensorDirectory entry came earlier in the log.
// Single-threaded.
#ifndef LOCKSTEP_COLLECTOR_CLI_INSPECT_FORMAT_H_
#define LOCKSTEP_COLLECTOR_CLI_INSPECT_FORMAT_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "lockstep/collector/registry.h"

namespace lockstep::wire {
struct Envelope;
}

namespace lockstep::collector {

class InspectFormatter {
 public:
  // Appends one JSON object (no newline) for a verified envelope.
  void Record(const wire::Envelope& env, int64_t recv_unix_ns, uint64_t offset, uint32_t bytes,
              std::string* out);

 private:
  struct Tensor {
    std::string name;
    uint8_t kind = 0, dtype = 0;
    std::vector<int64_t> shape;
  };
  std::map<std::tuple<std::string, uint32_t, uint32_t>, Tensor> directory_;
};

// Appends the --summary object of one (run, rank) (no newline).
void RankSummaryJson(const RankInfo& r, std::string* out);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_CLI_INSPECT_FORMAT_H_
