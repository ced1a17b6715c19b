// FakeTransport for the agent's tests: records every message it is offered, and can be
// told to refuse (would-block) some, to hold the sender inside Send() until released,
// and to report connection events. The test keeps a shared_ptr to the state; the agent
// owns the transport. All state is guarded by one mutex (the sender thread writes, the
// test thread reads).
#ifndef LOCKSTEP_TESTS_AGENT_FAKE_TRANSPORT_H_
#define LOCKSTEP_TESTS_AGENT_FAKE_TRANSPORT_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "flatbuffers/flatbuffers.h"
#include "lockstep/schema/lockstep_generated.h"
#include "transport/transport.h"

namespace lockstep::testing {

struct FakeMessage {
  std::vector<uint8_t> bytes;
  bool accepted = false;
  const wire::Envelope* env() const { return wire::GetEnvelope(bytes.data()); }
  wire::Body type() const { return env()->body_type(); }
  size_t records() const {
    auto* s = env()->body_as_StepStats();
    return s && s->stats() ? s->stats()->size() : 0;
  }
};

struct FakeState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<FakeMessage> messages;  // every Send(), accepted or not
  // Decides per offered message (0-based offer index, decoded envelope) whether it is
  // accepted; a refused one is answered kWouldBlock, like a socket at its HWM.
  std::function<bool(size_t offer, const wire::Envelope& env)> accept =
      [](size_t, const wire::Envelope&) { return true; };
  bool gate_open = true;      // false: Send() waits until opened
  bool in_send = false;       // the sender is waiting at the gate
  int pending_connects = 0;   // returned (and cleared) by TakeConnectEvents
  bool closed = false;
  // true: a zero-copy message (SendOwned) is accepted but its block is kept, as ZeroMQ
  // keeps a queued message while no collector is listening, until ReleaseHeld().
  bool hold_owned = false;
  struct Held {
    void* data;
    size_t size;
    void (*release)(void*, void*);
    void* hint;
  };
  std::vector<Held> held;
  size_t max_held_bytes = 0;  // the most bytes held at once

  size_t HeldBytes() {
    std::lock_guard<std::mutex> l(mu);
    size_t n = 0;
    for (const Held& h : held) n += h.size;
    return n;
  }

  void ReleaseHeld() {
    std::vector<Held> h;
    {
      std::lock_guard<std::mutex> l(mu);
      h.swap(held);
      hold_owned = false;  // from now on the peer takes everything at once
    }
    for (const Held& x : h) x.release(x.data, x.hint);
  }

  void OpenGate() {
    std::lock_guard<std::mutex> l(mu);
    gate_open = true;
    cv.notify_all();
  }
  void AddConnects(int n) {
    std::lock_guard<std::mutex> l(mu);
    pending_connects += n;
  }
  std::vector<FakeMessage> Snapshot() {
    std::lock_guard<std::mutex> l(mu);
    return messages;
  }
  // Polls (no sleep-wait on threads: a condition variable with a deadline) until pred
  // holds over the messages seen so far.
  bool WaitFor(const std::function<bool(const std::vector<FakeMessage>&)>& pred,
               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, timeout, [&] { return pred(messages); });
  }
  bool WaitInSend(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, timeout, [&] { return in_send; });
  }
};

class FakeTransport final : public Transport {
 public:
  explicit FakeTransport(std::shared_ptr<FakeState> s) : s_(std::move(s)) {}

  SendResult Send(const uint8_t* data, size_t size) noexcept override {
    std::unique_lock<std::mutex> l(s_->mu);
    s_->in_send = true;
    s_->cv.notify_all();
    s_->cv.wait(l, [&] { return s_->gate_open; });
    s_->in_send = false;
    FakeMessage m;
    m.bytes.assign(data, data + size);
    m.accepted = !s_->closed && s_->accept(s_->messages.size(), *m.env());
    bool ok = m.accepted;
    s_->messages.push_back(std::move(m));
    s_->cv.notify_all();
    return ok ? SendResult::kSent : SendResult::kWouldBlock;
  }
  SendResult SendOwned(uint8_t* data, size_t size, ReleaseFn release, void* hint) noexcept override {
    {
      std::lock_guard<std::mutex> l(s_->mu);
      if (s_->hold_owned && !s_->closed) {
        FakeMessage m;
        m.bytes.assign(data, data + size);
        m.accepted = true;
        s_->messages.push_back(std::move(m));
        s_->held.push_back({data, size, release, hint});
        size_t bytes = 0;
        for (const auto& h : s_->held) bytes += h.size;
        if (bytes > s_->max_held_bytes) s_->max_held_bytes = bytes;
        s_->cv.notify_all();
        return SendResult::kSent;
      }
    }
    return Transport::SendOwned(data, size, release, hint);
  }
  int TakeConnectEvents() noexcept override {
    std::lock_guard<std::mutex> l(s_->mu);
    int n = s_->pending_connects;
    s_->pending_connects = 0;
    return n;
  }
  void Close(std::chrono::milliseconds) noexcept override {
    {
      std::lock_guard<std::mutex> l(s_->mu);
      s_->closed = true;
      s_->cv.notify_all();
    }
    s_->ReleaseHeld();  // a closed socket frees what it still queues
  }

 private:
  std::shared_ptr<FakeState> s_;
};

inline bool Verify(const std::vector<uint8_t>& bytes) {
  flatbuffers::Verifier v(bytes.data(), bytes.size());
  return wire::VerifyEnvelopeBuffer(v);
}

}  // namespace lockstep::testing

#endif  // LOCKSTEP_TESTS_AGENT_FAKE_TRANSPORT_H_
