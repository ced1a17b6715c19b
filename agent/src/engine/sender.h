// Sender: the body of the agent's one sender thread. It owns the transport and the wire
// encoder, drains the queue in bulk, batches a step's records into StepStats messages,
// and sends Hello / RunFingerprint / Sampling / TensorDirectory / StepScalars / StepEnd /
// Heartbeat / Goodbye.
//
// Rules it keeps (docs/design.md "The wire"):
// - Hello first, and every directory entry before any stats message that could use it;
//   both again after each reconnection (the collector may have restarted).
// - with identity_pending, nothing at all until SetIdentity or the first record,
//   scalars, EndStep or Close; a rank changed later starts its own seq with a Hello;
// - seq per (run, rank) starts at 0 and advances only for messages the socket accepted;
//   a refused message is counted as dropped with its records and does not consume one.
// - EndStep ships the step's pending batch, then its StepEnd with the count of the
//   step's records the socket accepted (so the StepEnd follows every record of it);
// - A batch ships on EndStep, when full (max_records_per_message), when the step or the
//   sketch/histogram width changes, after batch_linger, and when a Flush waits for it.
//
// Thread: Run() is the thread entry and the only caller of everything private here.
#ifndef LOCKSTEP_AGENT_ENGINE_SENDER_H_
#define LOCKSTEP_AGENT_ENGINE_SENDER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/shared_state.h"
#include "engine/wire_encoder.h"
#include "lockstep/agent/agent.h"
#include "transport/buffer_pool.h"
#include "transport/transport.h"

namespace lockstep::engine {

class Sender {
 public:
  Sender(const AgentOptions& options, SharedState* shared, std::unique_ptr<Transport> transport,
         int64_t start_unix_ns);
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  // Thread entry. Returns after Close() asked it to stop (shared->stop) and it has
  // drained the queue, sent Goodbye and closed the transport. Never throws.
  void Run() noexcept;

 private:
  using Clock = std::chrono::steady_clock;

  // The output "iterator" handed to try_dequeue_bulk: each item moodycamel moves out
  // of its slot goes straight to Process(), so a record is read once, from the slot,
  // instead of being copied into a staging vector and read again from there.
  class ProcessEach {
   public:
    ProcessEach(Sender* sender, Clock::time_point now) : sender_(sender), now_(now) {}
    ProcessEach& operator*() noexcept { return *this; }
    ProcessEach& operator++() noexcept { return *this; }
    ProcessEach& operator++(int) noexcept { return *this; }
    ProcessEach& operator=(QueueItem&& item) noexcept {
      sender_->ProcessNoThrow(item, now_);
      return *this;
    }

   private:
    Sender* sender_;
    Clock::time_point now_;
  };

  void Loop();
  void Finish() noexcept;
  // Process() for the dequeue path, which must not throw (moodycamel would lose the
  // rest of the bulk): an exception is counted and the item is lost.
  void ProcessNoThrow(const QueueItem& item, Clock::time_point now) noexcept;
  void Process(const QueueItem& item, Clock::time_point now);
  void AddRecord(const QueueItem& item, Clock::time_point now);
  void ShipBatch();
  // Counts a shipped batch's records under its step (for the step's StepEnd).
  void CountShipped();
  void SendStepEnd(uint64_t step);
  // Waits until a message of `bytes` fits in the send buffer (true), or until Close()'s
  // deadline is near (false).
  bool WaitForSendBuffer(size_t bytes);
  bool SendMessage(Bytes bytes, uint64_t records);
  void EnsurePreamble();
  void PollConnections();
  // The control channel: takes the requests published for this run and rank (each id
  // once), answers "received" (or "ignored" for an unknown action), and puts the job's
  // answers (Agent::Acknowledge) on the wire.
  void PollControl();
  void TakeRequest(const std::string& frame);
  // Once, delivery_warn_after past the start with no handshake: publishes the sentence
  // Agent::DeliveryProblem() returns (the Python package turns it into a warning).
  void CheckDelivery(Clock::time_point now);
  void SendHeartbeat();
  void SetIdentity(uint32_t rank, uint32_t world_size);
  void PublishDone();

  // Const but for rank and world_size, which SetIdentity (kIdentity) changes.
  AgentOptions options_;
  SharedState* const shared_;
  // Before transport_ and encoder_: destroyed after both, since a block handed to the
  // transport comes back to it as late as the transport's Close().
  std::unique_ptr<BufferPool> pool_;
  std::unique_ptr<Transport> transport_;
  const int64_t start_unix_ns_;
  WireEncoder encoder_;
  moodycamel::ConsumerToken consumer_;

  // The batch being built (one step, one sketch/hist width).
  std::vector<wire::TensorStat> batch_stats_;
  std::vector<float> batch_sketch_;
  std::vector<uint32_t> batch_hist_;
  uint64_t batch_step_ = 0;
  uint16_t batch_k_ = 0;
  uint8_t batch_bins_ = 0;
  Clock::time_point batch_deadline_;

  // Records put on the wire per step not yet ended (a few: steps end in order), with
  // their per-micro-step counts; the oldest is forgotten past kMaxCountedSteps.
  struct StepCount {
    uint64_t step = 0;
    uint64_t records = 0;
    std::vector<uint32_t> micro;
    bool micro_overflow = false;  // a micro step >= kMaxCountedMicroSteps
  };
  std::vector<StepCount> step_counts_;

  uint64_t seq_ = 0;
  bool hello_pending_ = true;
  uint32_t fingerprint_sent_ = 0;  // SharedState::fingerprint_version on the wire
  uint32_t sampling_sent_ = 0;     // SharedState::sampling_version on the wire
  bool holding_ = false;  // identity_pending: nothing goes out until the rank is known
  uint32_t directory_sent_ = 0;  // registry entries [0, directory_sent_) are on the wire
  uint64_t connects_ = 0;
  uint64_t last_step_ = 0;
  uint64_t dequeued_ = 0;
  uint64_t published_done_ = 0;
  Clock::time_point next_heartbeat_;
  Clock::time_point next_connect_poll_;
  Clock::time_point started_;
  bool delivery_checked_ = false;
  std::string control_frame_;            // reused for every control frame
  std::vector<uint64_t> seen_requests_;  // the last request ids taken, oldest first
};

}  // namespace lockstep::engine

#endif  // LOCKSTEP_AGENT_ENGINE_SENDER_H_
