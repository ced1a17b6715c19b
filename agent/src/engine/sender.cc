#include "engine/sender.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>

#include "lockstep/common/clock.h"
#include "lockstep/common/wire.h"
#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::engine {
namespace {

constexpr size_t kBulk = 256;               // items per dequeue: amortizes the queue's costs
constexpr uint32_t kDirectoryChunk = 512;   // entries per TensorDirectory (names <= 1 KiB each)
constexpr auto kConnectPollEvery = std::chrono::milliseconds(5);
constexpr auto kMaxSleep = std::chrono::milliseconds(10);  // also bounds a missed wake-up
constexpr int kMaxRestarts = 1000;  // exceptions the loop survives before giving up
// Messages at least this large go out zero-copy in a pooled block; smaller ones
// (heartbeats, scalars, small batches) are copied by ZeroMQ and the builder keeps its
// block, so a socket full of small messages never pins a pool block each.
constexpr size_t kZeroCopyMinBytes = 32 * 1024;
// Blocks kept for reuse: at least this many, and as many as the send buffer holds,
// so a burst up to the budget re-faults no fresh memory the next time.
constexpr size_t kMinPoolBlocks = 16;
constexpr size_t kMaxPoolBlocks = 4096;
// A batch waits for room in the send buffer in slices this long, sending heartbeats
// and watching for Close() in between.
constexpr auto kRoomWait = std::chrono::milliseconds(20);
// Steps whose records are counted for their StepEnd at once (steps end in order; more
// than one is open only while a device step's records are handed over late).
constexpr size_t kMaxCountedSteps = 16;
// The control channel: frames read per poll, the largest taken, the request ids
// remembered (a request is published again until answered: each is acted on once),
// and the actions this agent knows (others are answered "ignored").
constexpr int kControlFramesPerPoll = 16;
constexpr size_t kMaxControlFrameBytes = 8 * 1024;
constexpr size_t kRememberedRequests = 256;
bool KnownAction(std::string_view a) { return a == "zoom" || a == "capture" || a == "sample"; }

std::string_view Sv(const flatbuffers::String* s) {
  return s == nullptr ? std::string_view() : std::string_view(s->c_str(), s->size());
}

// The builder's first block: a full batch at the configured sketch/histogram width
// plus room for the envelope, so a batch is built without regrowing.
size_t InitialBuilderBytes(const AgentOptions& o) {
  size_t per_record = sizeof(wire::TensorStat) +
                      static_cast<size_t>(std::clamp(o.sketch_k, 0, kMaxSketchK)) * sizeof(float) +
                      static_cast<size_t>(std::clamp(o.hist_bins, 0, kHistBins)) * sizeof(uint32_t);
  return std::max<size_t>(64 * 1024, o.max_records_per_message * per_record + 4096);
}

size_t PoolBlocks(const AgentOptions& o) {
  if (o.send_buffer_bytes == 0) return kMinPoolBlocks;
  return std::clamp(o.send_buffer_bytes / InitialBuilderBytes(o), kMinPoolBlocks, kMaxPoolBlocks);
}

}  // namespace

Sender::Sender(const AgentOptions& options, SharedState* shared,
               std::unique_ptr<Transport> transport, int64_t start_unix_ns)
    : options_(options),
      shared_(shared),
      pool_(std::make_unique<BufferPool>(
          PoolBlocks(options), options.send_buffer_bytes == 0 ? SIZE_MAX : options.send_buffer_bytes)),
      transport_(std::move(transport)),
      start_unix_ns_(start_unix_ns),
      encoder_(options.run, options.rank, pool_.get(), InitialBuilderBytes(options)),
      consumer_(shared->queue) {
  batch_stats_.reserve(options.max_records_per_message);
  batch_sketch_.reserve(options.max_records_per_message * kMaxSketchK);
  batch_hist_.reserve(options.max_records_per_message * kHistBins);
  last_step_ = options.start_step;
  holding_ = options.identity_pending;
}

void Sender::Run() noexcept {
  // The one try/catch of this thread: an exception (bad_alloc in the encoder, say) is
  // counted and the loop resumes; the training job never sees it.
  for (int restarts = 0; restarts < kMaxRestarts; ++restarts) {
    try {
      Loop();
      break;
    } catch (...) {
      shared_->sender.errors.fetch_add(1, std::memory_order_relaxed);
    }
  }
  Finish();
}

void Sender::Loop() {
  auto now = Clock::now();
  next_heartbeat_ = now + options_.heartbeat_interval;
  next_connect_poll_ = now;
  if (started_ == Clock::time_point()) started_ = now;
  EnsurePreamble();
  for (;;) {
    now = Clock::now();
    size_t n = shared_->queue.try_dequeue_bulk(consumer_, ProcessEach(this, now), kBulk);
    dequeued_ += n;

    if (now >= next_connect_poll_) {
      PollConnections();
      PollControl();
      CheckDelivery(now);
      next_connect_poll_ = now + kConnectPollEvery;
    }
    if (!batch_stats_.empty() && now >= batch_deadline_) ShipBatch();
    if (now >= next_heartbeat_) {
      SendHeartbeat();
      next_heartbeat_ = now + options_.heartbeat_interval;
    }
    if (n > 0) continue;  // keep draining before anything that waits

    // The queue looked empty.
    if (shared_->flush_target.load(std::memory_order_acquire) > published_done_) {
      ShipBatch();
      PublishDone();
    }
    if (shared_->stop.load(std::memory_order_acquire)) {
      // Items enqueued before stop was set are visible now (stop is stored after them
      // by the closing thread, and producers refuse once closed); one more pass to be sure.
      if (shared_->queue.size_approx() == 0) return;
      continue;
    }
    auto wake_at = std::min(next_heartbeat_, now + kMaxSleep);
    if (!batch_stats_.empty()) wake_at = std::min(wake_at, batch_deadline_);
    auto wait_us = std::chrono::duration_cast<std::chrono::microseconds>(wake_at - now).count();
    if (wait_us <= 0) continue;
    shared_->sender_sleeping.store(true, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);  // narrows (not closes) the missed wake-up window
    if (shared_->queue.size_approx() == 0 && !shared_->stop.load(std::memory_order_relaxed) &&
        shared_->flush_target.load(std::memory_order_relaxed) <= published_done_) {
      shared_->wake.wait(wait_us);
    }
    shared_->sender_sleeping.store(false, std::memory_order_relaxed);
  }
}

void Sender::Finish() noexcept {
  holding_ = false;
  try {
    ShipBatch();
    SendHeartbeat();
    SendMessage(encoder_.Goodbye("close", last_step_, seq_), 0);
  } catch (...) {
    shared_->sender.errors.fetch_add(1, std::memory_order_relaxed);
  }
  batch_stats_.clear();
  int64_t deadline = shared_->close_deadline_ns.load(std::memory_order_acquire);
  int64_t now_ns = MonotonicNowNs();  // close_deadline_ns is steady_clock too
  // Three quarters of what is left, so Close() sees this thread exit before its deadline.
  auto linger = std::chrono::milliseconds(std::max<int64_t>(0, (deadline - now_ns) / 1000000 * 3 / 4));
  transport_->Close(linger);
  MutexLock lock(&shared_->mu);
  shared_->items_done = dequeued_;
  shared_->exited = true;
  shared_->cv.notify_all();
}

void Sender::ProcessNoThrow(const QueueItem& item, Clock::time_point now) noexcept {
  try {
    Process(item, now);
  } catch (...) {
    shared_->sender.errors.fetch_add(1, std::memory_order_relaxed);
  }
}

void Sender::Process(const QueueItem& item, Clock::time_point now) {
  if (holding_ && item.type != ItemType::kDirectory && item.type != ItemType::kIdentity) {
    holding_ = false;  // data before the rank was settled: it goes out as it is
    EnsurePreamble();
  }
  switch (item.type) {
    case ItemType::kStats:
      AddRecord(item, now);
      break;
    case ItemType::kScalars:
      // A step's scalars follow its statistics on the wire: the collector takes the
      // scalars as the sign that the step is complete (Monitor.step() records the
      // scalars after the step's last tensor), so the pending batch goes first.
      if (!batch_stats_.empty() && batch_step_ <= item.step) ShipBatch();
      EnsurePreamble();
      SendMessage(encoder_.Scalars(item.step, item.scalars, seq_), 0);
      last_step_ = std::max(last_step_, item.step);
      break;
    case ItemType::kEndStep:
      if (!batch_stats_.empty() && batch_step_ <= item.step) ShipBatch();
      SendStepEnd(item.step);
      last_step_ = std::max(last_step_, item.step);
      shared_->sender.last_step.store(last_step_, std::memory_order_relaxed);
      break;
    case ItemType::kDirectory:
      EnsurePreamble();
      break;
    case ItemType::kIdentity:
      SetIdentity(item.tensor_id, item.order);
      break;
  }
}

void Sender::SetIdentity(uint32_t rank, uint32_t world_size) {
  ShipBatch();  // what was recorded before the call goes out under the old identity
  const bool sent = !holding_ && (seq_ > 0 || !hello_pending_);
  holding_ = false;
  if (sent && rank != options_.rank) {
    // The old rank's messages are out: the new rank is another (run, rank) stream to
    // the collector, with its own seq from 0, its Hello, fingerprint and full directory.
    seq_ = 0;
    hello_pending_ = true;
    fingerprint_sent_ = 0;
    sampling_sent_ = 0;
    directory_sent_ = 0;
  } else if (sent && world_size != options_.world_size) {
    hello_pending_ = true;  // the same stream: its Hello corrected
  }
  options_.rank = rank;
  options_.world_size = world_size;
  encoder_.set_rank(rank);
  EnsurePreamble();
}

void Sender::AddRecord(const QueueItem& item, Clock::time_point now) {
  const TensorStats& s = item.stats;
  uint16_t k = std::min<uint16_t>(s.sketch_k, kMaxSketchK);
  uint8_t bins = std::min<uint8_t>(s.hist_bins, kHistBins);
  if (!batch_stats_.empty() && (item.step != batch_step_ || k != batch_k_ || bins != batch_bins_)) {
    ShipBatch();
  }
  if (batch_stats_.empty()) {
    batch_step_ = item.step;
    batch_k_ = k;
    batch_bins_ = bins;
    batch_deadline_ = now + options_.batch_linger;
  }
  batch_stats_.emplace_back(item.tensor_id, item.micro_step, item.order,
                            static_cast<wire::DType>(s.limit_dtype), s.flags, 0, s.numel, s.min, s.max,
                            s.mean, s.std, s.l2, s.absmax, s.nan_count, s.inf_count, s.zero_count,
                            s.sat_count, s.subnormal_count);
  batch_sketch_.insert(batch_sketch_.end(), s.sketch, s.sketch + k);
  batch_hist_.insert(batch_hist_.end(), s.hist, s.hist + bins);
  if (batch_stats_.size() >= options_.max_records_per_message) ShipBatch();
}

void Sender::ShipBatch() {
  if (batch_stats_.empty()) return;
  EnsurePreamble();
  const size_t n = batch_stats_.size();
  const size_t bytes = n * sizeof(wire::TensorStat) + batch_sketch_.size() * sizeof(float) +
                       batch_hist_.size() * sizeof(uint32_t);
  if (bytes < kZeroCopyMinBytes || WaitForSendBuffer(bytes)) {
    if (SendMessage(encoder_.Stats(batch_step_, batch_stats_.data(), n, batch_k_, batch_sketch_.data(),
                                   batch_bins_, batch_hist_.data(), seq_),
                    n)) {
      CountShipped();
    }
  } else {
    // Closing, and the collector never took what ZeroMQ holds: this batch is lost,
    // counted like a message refused at the HWM.
    auto& c = shared_->sender;
    c.messages_dropped.fetch_add(1, std::memory_order_relaxed);
    c.records_dropped.fetch_add(n, std::memory_order_relaxed);
  }
  batch_stats_.clear();
  batch_sketch_.clear();
  batch_hist_.clear();
}

void Sender::CountShipped() {
  auto it = std::find_if(step_counts_.begin(), step_counts_.end(),
                         [&](const StepCount& c) { return c.step == batch_step_; });
  if (it == step_counts_.end()) {
    if (step_counts_.size() >= kMaxCountedSteps) {
      step_counts_.erase(std::min_element(step_counts_.begin(), step_counts_.end(),
                                          [](const StepCount& a, const StepCount& b) { return a.step < b.step; }));
    }
    step_counts_.push_back(StepCount{batch_step_, 0, {}, false});
    it = step_counts_.end() - 1;
  }
  it->records += batch_stats_.size();
  for (const wire::TensorStat& s : batch_stats_) {
    const uint32_t m = s.micro_step();
    if (m >= kMaxCountedMicroSteps) {
      it->micro_overflow = true;
      continue;
    }
    if (m >= it->micro.size()) it->micro.resize(m + 1, 0);
    ++it->micro[m];
  }
}

void Sender::SendStepEnd(uint64_t step) {
  uint64_t records = 0;
  std::vector<uint32_t> micro;
  auto it = std::find_if(step_counts_.begin(), step_counts_.end(),
                         [&](const StepCount& c) { return c.step == step; });
  if (it != step_counts_.end()) {
    records = it->records;
    if (!it->micro_overflow) micro = std::move(it->micro);
    step_counts_.erase(it);
  }
  EnsurePreamble();
  SendMessage(encoder_.StepEnd(step, records, micro, seq_), 0);
}

bool Sender::WaitForSendBuffer(size_t bytes) {
  // The messages ZeroMQ still holds (no collector, a slow one) fill the send buffer.
  // Wait for them to go out rather than grow the training process's memory; records
  // pile up in the queue meanwhile, and past its capacity the producers drop (and
  // count) them. Heartbeats go on; Close() bounds the wait by its deadline, keeping the
  // last of its time for the final heartbeat, Goodbye and linger.
  for (;;) {
    auto now = Clock::now();
    auto until = now + kRoomWait;
    if (shared_->stop.load(std::memory_order_acquire)) {
      const auto deadline = Clock::time_point(std::chrono::duration_cast<Clock::duration>(
          std::chrono::nanoseconds(shared_->close_deadline_ns.load(std::memory_order_acquire))));
      const auto give_up = deadline - std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(
                                          shared_->close_reserve_ns.load(std::memory_order_relaxed)));
      if (now >= give_up) return pool_->WaitForRoom(bytes, now);  // one last look
      until = std::min(until, give_up);
    }
    if (pool_->WaitForRoom(bytes, until)) return true;
    now = Clock::now();
    if (now >= next_heartbeat_) {
      SendHeartbeat();
      next_heartbeat_ = now + options_.heartbeat_interval;
    }
  }
}

bool Sender::SendMessage(Bytes bytes, uint64_t records) {
  auto& c = shared_->sender;
  Transport::SendResult r = Transport::SendResult::kError;
  if (bytes.size <= kMaxMessageBytes) {
    // `bytes` is always the encoder's last message (every caller passes an Encode*()
    // result straight in), so its block can be detached and handed over.
    if (bytes.size >= kZeroCopyMinBytes && encoder_.can_detach()) {
      OwnedBytes owned = encoder_.Detach();
      r = transport_->SendOwned(owned.data, owned.size, &BufferPool::ReleaseCallback, owned.block);
    } else {
      r = transport_->Send(bytes.data, bytes.size);
    }
  }
  if (r == Transport::SendResult::kSent) {
    ++seq_;
    c.messages_sent.fetch_add(1, std::memory_order_relaxed);
    c.records_sent.fetch_add(records, std::memory_order_relaxed);
    return true;
  }
  if (r == Transport::SendResult::kError) c.errors.fetch_add(1, std::memory_order_relaxed);
  c.messages_dropped.fetch_add(1, std::memory_order_relaxed);
  c.records_dropped.fetch_add(records, std::memory_order_relaxed);
  return false;
}

void Sender::EnsurePreamble() {
  if (holding_) return;
  if (hello_pending_) {
    if (!SendMessage(encoder_.Hello(options_, start_unix_ns_, seq_), 0)) return;
    hello_pending_ = false;
  }
  const uint32_t fp_version = shared_->fingerprint_version.load(std::memory_order_acquire);
  if (fingerprint_sent_ != fp_version) {
    std::vector<std::pair<std::string, std::string>> entries;
    {
      MutexLock lock(&shared_->fingerprint_mu);
      entries = shared_->fingerprint;
    }
    if (!SendMessage(encoder_.Fingerprint(entries, seq_), 0)) return;
    fingerprint_sent_ = fp_version;
  }
  const uint32_t sampling_version = shared_->sampling_version.load(std::memory_order_acquire);
  if (sampling_sent_ != sampling_version) {
    lockstep::Sampling sampling;
    {
      MutexLock lock(&shared_->fingerprint_mu);
      sampling = shared_->sampling;
    }
    if (!SendMessage(encoder_.Sampling(sampling, static_cast<uint16_t>(options_.sketch_k),
                                       static_cast<uint8_t>(options_.hist_bins), seq_),
                     0)) {
      return;
    }
    sampling_sent_ = sampling_version;
  }
  uint32_t registered = shared_->registry.size();
  while (directory_sent_ < registered) {
    uint32_t to = std::min(registered, directory_sent_ + kDirectoryChunk);
    if (!SendMessage(encoder_.Directory(shared_->registry, directory_sent_, to, seq_), 0)) return;
    directory_sent_ = to;
  }
}

void Sender::PollConnections() {
  int events = transport_->TakeConnectEvents();
  if (events <= 0) return;
  uint64_t before = connects_;
  connects_ += static_cast<uint64_t>(events);
  // The first connection ever is the one Hello was queued for; each later one may be a
  // restarted collector that has forgotten this run's Hello and directory.
  uint64_t reconnects = connects_ - std::max<uint64_t>(before, 1);
  if (reconnects == 0) return;
  shared_->sender.reconnects.fetch_add(reconnects, std::memory_order_relaxed);
  hello_pending_ = true;
  fingerprint_sent_ = 0;
  sampling_sent_ = 0;
  directory_sent_ = 0;
  EnsurePreamble();
}

void Sender::PollControl() {
  std::string& frame = control_frame_;
  for (int i = 0; i < kControlFramesPerPoll && transport_->TakeControlFrame(&frame, kMaxControlFrameBytes); ++i) {
    TakeRequest(frame);
  }
  if (!shared_->control.answers_waiting.load(std::memory_order_acquire)) return;
  std::vector<ControlMailbox::Answer> answers;
  {
    MutexLock lock(&shared_->control.mu);
    answers.swap(shared_->control.answers);
    shared_->control.answers_waiting.store(false, std::memory_order_relaxed);
  }
  if (holding_) return;  // no rank yet: nothing may go out (an answer needs a request first anyway)
  EnsurePreamble();
  for (const auto& a : answers) SendMessage(encoder_.Ack(a.id, a.status, a.step, a.detail, seq_, a.replay.get()), 0);
}

void Sender::TakeRequest(const std::string& frame) {
  auto& c = shared_->sender;
  const auto* data = reinterpret_cast<const uint8_t*>(frame.data());
  // std::string's buffer is aligned for any scalar (operator new), as the verifier wants.
  flatbuffers::Verifier verifier(data, frame.size());
  if (frame.empty() || !verifier.VerifyBuffer<wire::ControlRequest>(nullptr)) {
    c.requests_bad.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const auto* r = flatbuffers::GetRoot<wire::ControlRequest>(data);
  if (r->schema_major() != kSchemaMajor) {
    c.requests_bad.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Addressed to someone else: not ours to answer.
  if ((r->experiment() != nullptr && r->experiment()->size() > 0 && Sv(r->experiment()) != options_.experiment) ||
      (r->run_id() != nullptr && r->run_id()->size() > 0 && Sv(r->run_id()) != options_.run) ||
      (r->rank() >= 0 && static_cast<uint32_t>(r->rank()) != options_.rank)) {
    return;
  }
  const uint64_t id = r->id();
  if (std::find(seen_requests_.begin(), seen_requests_.end(), id) != seen_requests_.end()) return;
  if (seen_requests_.size() >= kRememberedRequests) seen_requests_.erase(seen_requests_.begin());
  seen_requests_.push_back(id);
  const std::string_view action = Sv(r->action());
  if (!KnownAction(action)) {
    c.requests_ignored.fetch_add(1, std::memory_order_relaxed);
    if (!holding_) {
      EnsurePreamble();
      std::string detail = "this agent does not know the action '" +
                           std::string(action.substr(0, 64)) + "'";
      SendMessage(encoder_.Ack(id, AckStatus::kIgnored, 0, detail, seq_), 0);
    }
    return;
  }
  ControlRequest req;
  req.id = id;
  req.action.assign(action);
  req.target.assign(Sv(r->target()).substr(0, kMaxTensorNameLength));
  req.step = r->step();
  req.steps = r->steps();
  bool taken = false;
  {
    MutexLock lock(&shared_->control.mu);
    if (shared_->control.requests.size() < ControlMailbox::kMaxWaiting) {
      shared_->control.requests.push_back(std::move(req));
      shared_->control.requests_waiting.store(true, std::memory_order_release);
      taken = true;
    }
  }
  if (!taken) {
    // The job has not read the last 64: forget the id, so a later publication is taken.
    seen_requests_.pop_back();
    c.requests_bad.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  c.requests_received.fetch_add(1, std::memory_order_relaxed);
  if (!holding_) {
    EnsurePreamble();
    SendMessage(encoder_.Ack(id, AckStatus::kReceived, 0, std::string(), seq_), 0);
  }
}

void Sender::CheckDelivery(Clock::time_point now) {
  const Transport::PeerStatus peer = transport_->Peer();
  shared_->sender.handshakes.store(peer.handshakes_ok, std::memory_order_relaxed);
  shared_->sender.handshake_failures.store(peer.handshakes_failed, std::memory_order_relaxed);
  if (delivery_checked_ || !peer.known || options_.delivery_warn_after.count() <= 0) return;
  if (peer.handshakes_ok > 0) {
    delivery_checked_ = true;  // a collector took the connection: nothing to say, ever
    return;
  }
  if (now - started_ < options_.delivery_warn_after) return;
  delivery_checked_ = true;
  const double secs = std::chrono::duration<double>(options_.delivery_warn_after).count();
  char after[32];
  std::snprintf(after, sizeof after, "%.3g s", secs);
  const std::string& ep = options_.endpoint;
  std::string msg;
  if (peer.handshakes_failed > 0) {
    msg = "nothing reached a collector at " + ep + " in " + after + ": the peer there refused the ZeroMQ handshake (" +
          std::to_string(peer.handshakes_failed) + (peer.handshakes_failed == 1 ? " time" : " times") +
          "), so it is not a collector's ingest port (the view feed, --view-listen, is 6201; ingest, "
          "--listen, is 6200) or the CURVE keys do not match; fix endpoint= or LOCKSTEP_ENDPOINT. The job goes on; "
          "lockstep keeps retrying";
  } else if (peer.connects > 0) {
    msg = "nothing reached a collector at " + ep + " in " + after +
          ": a connection was made but no handshake completed; is 'lockstep collect' listening there? "
          "The job goes on; lockstep keeps retrying";
  } else {
    msg = "nothing reached a collector at " + ep + " in " + after +
          ": no connection could be made (is 'lockstep collect --listen " + ep +
          "' running? check endpoint= or LOCKSTEP_ENDPOINT). The job goes on; lockstep keeps retrying";
  }
  {
    MutexLock lock(&shared_->mu);
    shared_->delivery_message = std::move(msg);
  }
  shared_->delivery_problem.store(true, std::memory_order_release);
}

void Sender::SendHeartbeat() {
  const auto& p = shared_->producer;
  const auto& s = shared_->sender;
  if (holding_) return;
  HeartbeatValues h;
  h.records_enqueued = shared_->slots.Sum(p, &ProducerCounters::records_enqueued);
  h.records_sent = s.records_sent.load(std::memory_order_relaxed);
  h.records_dropped = shared_->slots.Sum(p, &ProducerCounters::records_refused) +
                      s.records_dropped.load(std::memory_order_relaxed);
  h.messages_dropped = s.messages_dropped.load(std::memory_order_relaxed);
  h.queue_depth = static_cast<uint32_t>(shared_->queue.size_approx());
  h.errors = p.errors.load(std::memory_order_relaxed) + s.errors.load(std::memory_order_relaxed);
  h.last_step = last_step_;
  EnsurePreamble();
  SendMessage(encoder_.Heartbeat(h, seq_), 0);
}

void Sender::PublishDone() {
  uint64_t done = dequeued_ - batch_stats_.size();
  if (done == published_done_) return;
  published_done_ = done;
  MutexLock lock(&shared_->mu);
  shared_->items_done = done;
  shared_->cv.notify_all();
}

}  // namespace lockstep::engine
