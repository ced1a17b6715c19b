// AgentImpl: the engine behind lockstep::Agent (agent.h documents the contract).
//
// Producers (Record*/EndStep, any thread) copy into a preallocated moodycamel queue with
// a ProducerToken per (thread, agent) and try_enqueue only, so after a thread's first
// call nothing allocates, locks or blocks. One sender thread (engine/sender.h) drains
// the queue and owns the transport. Flush/Close (any thread) wait on SharedState::cv
// with a deadline and never hang.
#ifndef LOCKSTEP_AGENT_ENGINE_AGENT_IMPL_H_
#define LOCKSTEP_AGENT_ENGINE_AGENT_IMPL_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/sender.h"
#include "engine/shared_state.h"
#include "lockstep/agent/agent.h"

namespace lockstep::engine {

class AgentImpl final : public Agent {
 public:
  // Options must be validated already. Starts the sender thread (last).
  AgentImpl(const AgentOptions& options, std::unique_ptr<Transport> transport);
  ~AgentImpl() override;

  using Agent::RegisterTensor;
  uint32_t RegisterTensor(const std::string& name, TensorKind kind, DType dtype,
                          const std::vector<int64_t>& shape, uint32_t order,
                          const std::string& module_type) noexcept override;
  bool RecordStats(uint64_t step, uint32_t micro_step, uint32_t tensor_id, uint32_t order,
                   const TensorStats& stats) noexcept override;
  bool RecordScalars(uint64_t step, const StepScalars& scalars) noexcept override;
  bool SetFingerprint(std::vector<std::pair<std::string, std::string>> entries) noexcept override;
  bool SetSampling(const Sampling& sampling) noexcept override;
  bool EndStep(uint64_t step) noexcept override;
  bool SetIdentity(uint32_t rank, uint32_t world_size) noexcept override;
  bool Flush(std::chrono::milliseconds timeout) noexcept override;
  bool Close(std::chrono::milliseconds timeout) noexcept override;
  AgentCounters Counters() const noexcept override;
  std::string DeliveryProblem() const noexcept override;
  const AgentOptions& options() const noexcept override { return options_; }
  bool HasRequests() const noexcept override {
    return shared_.control.requests_waiting.load(std::memory_order_relaxed);
  }
  std::vector<ControlRequest> TakeRequests() noexcept override;
  bool Acknowledge(uint64_t id, AckStatus status, uint64_t step, const std::string& detail) noexcept override;
  bool AcknowledgeReplay(uint64_t id, uint64_t step, const std::string& detail,
                         const SelfReplay& replay) noexcept override;

 private:
  // Queues one answer for the sender thread (Acknowledge, AcknowledgeReplay).
  bool Answer(uint64_t id, AckStatus status, uint64_t step, const std::string& detail,
              std::shared_ptr<const SelfReplay> replay) noexcept;
  // The calling thread's slot (token and counters) for this agent; nullptr if none
  // could be made.
  ProducerSlot* Slot() noexcept;
  bool EnqueueOther(QueueItem& item) noexcept;
  bool WaitDone(uint64_t target, std::chrono::steady_clock::time_point deadline) noexcept;

  const AgentOptions options_;
  const uint64_t id_;  // process-unique, never reused: keys the thread-local token cache
  // A producer wakes the sender after this many records (a message's worth, and at most
  // an eighth of the queue so a burst never fills it before the sender is up).
  const uint32_t wake_every_;
  SharedState shared_;
  std::atomic<bool> closed_{false};

  std::mutex tokens_mu_;  // serializes shared_.slots.Add (taken once per producer thread)

  std::unique_ptr<Sender> sender_;
  std::thread thread_;  // last: started after everything it touches exists
};

}  // namespace lockstep::engine

#endif  // LOCKSTEP_AGENT_ENGINE_AGENT_IMPL_H_
