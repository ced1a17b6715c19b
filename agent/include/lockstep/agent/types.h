// Value types of the agent's public API. Plain structs: no zmq, flatbuffers or spdlog
// types, so training code (and the Python binding) can include them freely.
#ifndef LOCKSTEP_AGENT_TYPES_H_
#define LOCKSTEP_AGENT_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/common/wire.h"

namespace lockstep {

// Values match schema/lockstep.fbs (wire::Role, wire::TensorKind, wire::DType).
enum class Role : uint8_t { kUnknown = 0, kBaseline = 1, kCandidate = 2, kSolo = 3 };
enum class TensorKind : uint8_t {
  kAct = 0, kActGrad = 1, kParamGrad = 2, kParam = 3, kOptim = 4, kLoss = 5, kInput = 6, kActIn = 7,
  kGradReduced = 8
};
enum class DType : uint8_t {
  kUnknown = 0, kF32 = 1, kF16 = 2, kBF16 = 3, kF64 = 4,
  kI8 = 5, kU8 = 6, kI16 = 7, kI32 = 8, kI64 = 9, kBool = 10,
  kF8E4M3 = 11, kF8E5M2 = 12
};

// Statistics of one tensor (docs/design.md "Statistics of one tensor"). Fixed size so the
// hot path copies it into a preallocated queue slot without allocating.
// NaN/Inf are excluded from min..absmax and counted instead; when no finite value
// exists, min..absmax are NaN.
constexpr uint8_t kStatRepeat = 1;  // TensorStats::flags (schema StatFlags::kRepeat)
// The batched device path computed it (schema StatFlags::kDevice; RecordPackedRows sets it).
constexpr uint8_t kStatDevice = 4;

struct TensorStats {
  uint64_t numel = 0;
  double min = 0, max = 0, mean = 0, std = 0, l2 = 0, absmax = 0;
  uint64_t nan_count = 0, inf_count = 0, zero_count = 0;
  uint64_t sat_count = 0;        // finite values with |x| >= max finite of limit_dtype
  uint64_t subnormal_count = 0;  // non-zero values with |x| < min normal of limit_dtype
  DType limit_dtype = DType::kUnknown;  // own dtype if low precision; for fp32: kF16
  uint16_t sketch_k = 0;         // valid entries in sketch[]
  uint8_t hist_bins = 0;         // valid entries in hist[] (0 or kHistBins)
  // kStatRepeat: the same tensor as the record just before it on this thread, under
  // another name (the wire's StatFlags; the collector shows the two as one row).
  uint8_t flags = 0;
  float sketch[kMaxSketchK];     // count-sketch (docs/statistics.md)
  uint32_t hist[kHistBins];      // log2-magnitude histogram
};

// Run-level scalars of one step. A NaN field is "not given" unless its bit is set in
// `given`: then it is a real NaN (a loss that blew up), sent and shown as NaN.
struct StepScalars {
  static constexpr uint8_t kLossGiven = 1, kLrGiven = 2, kGradNormGiven = 4, kLossScaleGiven = 8;
  double loss = std::numeric_limits<double>::quiet_NaN();
  double lr = std::numeric_limits<double>::quiet_NaN();
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  double loss_scale = std::numeric_limits<double>::quiet_NaN();
  double step_time_s = std::numeric_limits<double>::quiet_NaN();
  uint32_t micro_steps = 1;
  uint64_t samples = 0;
  uint8_t given = 0;  // k*Given bits; a non-NaN field counts as given without its bit
};

// Counters, all monotonic since Create(). Read with relaxed ordering: a snapshot is
// approximate while records are in flight.
struct AgentCounters {
  uint64_t records_enqueued = 0;  // stats records accepted by RecordStats()
  uint64_t records_sent = 0;      // handed to the socket
  uint64_t records_dropped = 0;   // stats records lost: queue full or closed, or socket at its HWM
  uint64_t messages_sent = 0;
  uint64_t messages_dropped = 0;  // messages the socket refused (HWM)
  uint64_t errors = 0;            // internal errors caught and counted
  uint64_t queue_depth = 0;       // approximate items waiting
  uint64_t reconnects = 0;        // connections established after the first
  uint64_t other_dropped = 0;     // scalars / end-step items refused (queue full or closed)
  uint64_t handshakes = 0;        // connections a collector accepted (ZeroMQ handshakes)
  uint64_t handshake_failures = 0;  // refused handshakes: not a collector's ingest port, CURVE keys
  bool delivery_problem = false;  // Agent::DeliveryProblem() is set
  uint64_t requests_received = 0;  // control requests for this agent taken (each id once)
  uint64_t requests_ignored = 0;   // control requests with an action this agent does not know
  uint64_t requests_bad = 0;       // control frames that failed verification
};

// A request from the collector on the control channel (wire ControlRequest), as the
// job reads it (Agent::TakeRequests): act on `action` about `target` at `step`.
struct ControlRequest {
  uint64_t id = 0;
  std::string action;  // "zoom", "capture"
  std::string target;  // a module or row name
  uint64_t step = 0;
  uint32_t steps = 0;
};

// The answer to a request (wire AckStatus).
enum class AckStatus : uint8_t { kReceived = 0, kDone = 1, kRefused = 2, kIgnored = 3 };

// A capture replayed by the run that made it (wire SelfReplay, schema minor 6): what one
// run alone can know of its op against float64 (Agent::AcknowledgeReplay).
struct SelfReplay {
  std::string file, row;
  std::string dtype;     // the output's ("float32")
  std::string coarsest;  // the coarsest floating dtype among the op's tensors
  double max_rel_error = 0;
  double ulps = 0;       // in ULPs of dtype
  uint32_t width = 1;
  std::string settings_digest, inputs_digest, output_digest;
  std::vector<std::pair<std::string, std::string>> settings, precision;
  std::string error;     // why it could not replay ("" when it did)
};

// The sampling the job chose (wire Sampling): known only once it says what it watches,
// which is after Create() (the Hello carries AgentOptions' values).
struct Sampling {
  uint32_t every = 1;                 // statistics at steps with step % every == 0
  std::string include_regex, exclude_regex;  // module-name regexes; empty = all
  std::vector<TensorKind> kinds;      // the kinds recorded
};

// The largest values AgentOptions (agent.h) accepts: the one definition, which the Python
// package reads too (lockstep._core.AGENT_LIMITS). The queue's is fixed by its
// preallocated geometry (engine/queue_item.h asserts that they agree).
inline constexpr size_t kMaxQueueCapacity = 65536;
inline constexpr size_t kMaxRecordsPerMessage = 8192;

}  // namespace lockstep

#endif  // LOCKSTEP_AGENT_TYPES_H_
