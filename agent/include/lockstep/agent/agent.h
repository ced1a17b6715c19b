// lockstep::Agent — the C++ core that a training process uses to ship statistics.
//
// Three layers (like OpenTelemetry's api / sdk / exporter): this noexcept API; the
// engine (preallocated queue, batching; agent/src/engine) and the transport (the
// ZeroMQ PUSH socket, owned by one sender thread; agent/src/transport).
//
// Threads: Record*() and EndStep() may be called from any thread (a moodycamel queue
// with a producer token per calling thread); they never block, never allocate after
// warm-up, never lock, never throw. RegisterTensor() allocates and takes a mutex
// (once per tensor: that is warm-up). Flush()/Close() may be called from any thread.
//
// Overflow: a full queue refuses the newest record and counts it (records_dropped);
// the counts travel to the collector in heartbeats.
#ifndef LOCKSTEP_AGENT_AGENT_H_
#define LOCKSTEP_AGENT_AGENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/agent/types.h"
#include "lockstep/common/status.h"

namespace lockstep {

struct AgentOptions {
  std::string endpoint = "tcp://127.0.0.1:6200";  // collector's PULL endpoint
  std::string run;                                 // run id (IsValidRunId)
  std::string experiment;
  Role role = Role::kSolo;
  std::string platform = "cpu";   // "cuda", "npu", "cpu", ...
  std::string device_name;
  std::string framework;          // e.g. "torch 1.13.1"
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // The rank may still change (a process made the agent before its process group
  // existed): nothing is sent — no Hello, no heartbeat — until SetIdentity(), the first
  // record / scalars / EndStep, or Close(), so a provisional rank never reaches the wire.
  bool identity_pending = false;
  uint64_t start_step = 0;
  // When the queue is full the newest record is refused and counted: the one overflow
  // policy, since the agent never blocks training.
  size_t queue_capacity = 16384;  // records; preallocated (1..kMaxQueueCapacity, ~1.3 KiB each)
  int send_hwm = 1000;            // messages buffered in ZeroMQ while no collector
  // Memory for statistics messages ZeroMQ has not written yet (no collector, a slow
  // one): past it the sender waits, records wait in the queue, and past the queue's
  // capacity they are dropped and counted. 0 = bounded by send_hwm only. At least
  // twice the largest message (max_records_per_message records).
  size_t send_buffer_bytes = size_t{32} << 20;
  int sketch_k = kDefaultSketchK;  // 0..kMaxSketchK
  int hist_bins = kHistBins;       // 0 or kHistBins
  uint32_t every = 1;              // informational: sampling period, sent in Hello
  std::string include_regex, exclude_regex;  // informational, sent in Hello (see SetSampling)
  std::chrono::milliseconds heartbeat_interval{1000};
  size_t max_records_per_message = 1024;  // 1..kMaxRecordsPerMessage records per StepStats message
  // A partly filled batch ships at the latest this long after its first record (EndStep
  // and a full batch ship at once).
  std::chrono::milliseconds batch_linger{5};
  // No collector has taken the connection (ZeroMQ handshake) this long after Create():
  // DeliveryProblem() says so, once, naming the endpoint. 0 = never.
  std::chrono::milliseconds delivery_warn_after{5000};
  // Optional ZeroMQ CURVE: the collector's public key and this agent's key pair (Z85).
  std::string curve_server_key, curve_public_key, curve_secret_key;
  // The collector's control socket (docs/design.md "The control channel"): a SUB
  // socket connects there, with the CURVE settings above, and the sender thread takes
  // the requests addressed to this run and rank (TakeRequests). Empty: no control
  // channel. ControlEndpointFor(endpoint) (lockstep/common/control_endpoint.h) gives
  // the address a collector derives from its --listen.
  std::string control_endpoint;
};

class Transport;  // agent/src/transport: the socket behind the sender thread

class Agent {
 public:
  // Validates options and starts the sender thread. Fails (never throws) on a bad
  // run id, endpoint or option, with a one-line message.
  static StatusOr<std::unique_ptr<Agent>> Create(const AgentOptions& options);
  // For tests: the same, with an injected transport instead of ZeroMQ.
  static StatusOr<std::unique_ptr<Agent>> CreateWithTransport(const AgentOptions& options,
                                                              std::unique_ptr<Transport> t);

  virtual ~Agent() = default;  // implementations Close() with a short timeout
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Declares a tensor and returns its id (stable for this agent). Calling it again
  // with the same (name, kind) returns the same id. `order` is its execution order
  // index within a step. Returns UINT32_MAX on error (counted).
  uint32_t RegisterTensor(const std::string& name, TensorKind kind, DType dtype,
                          const std::vector<int64_t>& shape, uint32_t order) noexcept {
    return RegisterTensor(name, kind, dtype, shape, order, std::string());
  }
  // The same, with the type of the module the tensor belongs to (e.g. "Conv2d"; sent
  // as TensorInfo.module_type, so messages can name "features.0 (Conv2d)"). The first
  // registration of (name, kind) sets it.
  virtual uint32_t RegisterTensor(const std::string& name, TensorKind kind, DType dtype,
                                  const std::vector<int64_t>& shape, uint32_t order,
                                  const std::string& module_type) noexcept = 0;

  // Hands one record to the queue. false = dropped (queue full or closed), counted.
  // `order` is the record's execution order index within the step.
  virtual bool RecordStats(uint64_t step, uint32_t micro_step, uint32_t tensor_id,
                           uint32_t order, const TensorStats& stats) noexcept = 0;
  virtual bool RecordScalars(uint64_t step, const StepScalars& scalars) noexcept = 0;
  // The run fingerprint (schema RunFingerprint): key/value pairs, replacing any given
  // before. Sent once, before the next statistics message, and again after every
  // reconnection. Allocates and takes a mutex (a once-per-run call). false on error.
  virtual bool SetFingerprint(std::vector<std::pair<std::string, std::string>> entries) noexcept = 0;
  // The sampling (wire Sampling), replacing any given before. Sent once, before the
  // next statistics message, and again after every reconnection. Allocates and takes a
  // mutex (a once-per-watch call). false on error (counted).
  virtual bool SetSampling(const Sampling& sampling) noexcept = 0;
  // Marks the end of a step: the sender ships what it holds for that step, then a
  // StepEnd with the number of records it put on the wire for it (per micro step). The
  // collector closes the step when the StepEnd arrives, so call it once per step, after
  // the step's last Record*() (a step never ended is closed only by the next ones
  // piling up, a Goodbye or the collector's idle timeout).
  virtual bool EndStep(uint64_t step) noexcept = 0;

  // Sets the (rank, world_size) of everything enqueued after the call (the process
  // group became known after Create()), and ends identity_pending. When the rank
  // changes after messages went out under the old one, the new rank starts its own
  // sequence (seq from 0) with a Hello and the full directory. false = invalid
  // (rank >= world_size) or refused (queue full, closed), counted.
  virtual bool SetIdentity(uint32_t rank, uint32_t world_size) noexcept = 0;

  // Waits until everything enqueued before the call is on the wire (handed to the
  // socket) or dropped. Returns false on timeout.
  virtual bool Flush(std::chrono::milliseconds timeout) noexcept = 0;
  // Flushes, sends Goodbye, stops the sender thread and closes the socket, waiting at
  // most `timeout` in all (ZMQ_LINGER included). Idempotent.
  virtual bool Close(std::chrono::milliseconds timeout) noexcept = 0;

  virtual AgentCounters Counters() const noexcept = 0;
  // Empty while delivery looks fine; else one sentence (naming the endpoint) saying
  // that nothing reached a collector within delivery_warn_after and the likely cause.
  // Set once by the sender thread and never cleared. Cheap (a relaxed load when empty).
  virtual std::string DeliveryProblem() const noexcept { return {}; }
  virtual const AgentOptions& options() const noexcept = 0;

  // The control channel (AgentOptions::control_endpoint). Whether requests wait: one
  // relaxed load, so a job can ask at every step for free.
  virtual bool HasRequests() const noexcept { return false; }
  // The requests taken off the control socket since the last call, each id once, in
  // arrival order (the sender thread has already acknowledged them as received).
  virtual std::vector<ControlRequest> TakeRequests() noexcept { return {}; }
  // Tells the collector what became of request `id` (done at `step`, refused, ignored)
  // and `detail` (what was done, or why not; at most 1 KiB kept). Sent by the sender
  // thread within a few milliseconds. false when closed or too many answers wait (64).
  virtual bool Acknowledge(uint64_t /*id*/, AckStatus /*status*/, uint64_t /*step*/,
                           const std::string& /*detail*/) noexcept {
    return false;
  }
  // A capture request's second `done` answer, carrying the job's replay of its own
  // capture (`replay`; strings and lists cut to the wire's caps). Any thread (the
  // capture's writer thread calls it); the same queue and refusals as Acknowledge.
  virtual bool AcknowledgeReplay(uint64_t /*id*/, uint64_t /*step*/, const std::string& /*detail*/,
                                 const SelfReplay& /*replay*/) noexcept {
    return false;
  }

 protected:
  Agent() = default;
};

}  // namespace lockstep

#endif  // LOCKSTEP_AGENT_AGENT_H_
