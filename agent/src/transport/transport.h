// Transport: the socket behind the agent's sender thread.
//
// The engine hands it finished messages; it never blocks (a full socket answers
// kWouldBlock at once, and the engine drops and counts the message). Owned and called
// by the sender thread only, from its first call to Close(); it may be built on another
// thread before that thread starts (the thread start is the hand-over barrier).
// Implementations: ZmqTransport (zmq_transport.h); tests inject fakes.
#ifndef LOCKSTEP_AGENT_TRANSPORT_TRANSPORT_H_
#define LOCKSTEP_AGENT_TRANSPORT_TRANSPORT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace lockstep {

class Transport {
 public:
  enum class SendResult : uint8_t {
    kSent,        // the socket took the message (it will go out when a peer is there)
    kWouldBlock,  // the socket is at its high-water mark: the message was not taken
    kError,       // anything else; the message was not taken
  };

  virtual ~Transport() = default;

  // Hands one complete message to the socket without waiting.
  virtual SendResult Send(const uint8_t* data, size_t size) noexcept = 0;

  // Like Send(), but hands over `data` itself instead of a copy: `release(data, hint)`
  // is called exactly once when the transport is done with it — maybe on another thread
  // (ZeroMQ's I/O thread), maybe before this returns (a refused message, a copying
  // transport). The default copies through Send() and releases at once. `release`
  // starts with TakeBackFromZmq(hint) (transport/handoff_annotations.h), so TSan sees
  // the hand-over back from ZeroMQ's I/O thread.
  using ReleaseFn = void (*)(void* data, void* hint);
  virtual SendResult SendOwned(uint8_t* data, size_t size, ReleaseFn release, void* hint) noexcept {
    SendResult r = Send(data, size);
    release(data, hint);
    return r;
  }

  // How many connections to the peer were established since the last call (0 when
  // none). The engine re-sends Hello and the tensor directory on every connection
  // after the first: the peer may be a restarted collector that lost them.
  virtual int TakeConnectEvents() noexcept = 0;

  // What the transport learnt of its peer so far (updated by TakeConnectEvents()).
  // `known` false: this transport cannot tell (a test fake), and no one should warn.
  struct PeerStatus {
    bool known = false;
    uint64_t connects = 0;           // TCP/IPC connections made
    uint64_t handshakes_ok = 0;      // ZMTP handshakes completed: a collector took us
    // Refused: a HANDSHAKE_FAILED event (CURVE keys), or a connection the peer dropped
    // before any handshake completed (ZeroMQ 4.3 reports a socket-type mismatch, e.g. a
    // PUB peer, only as a disconnect).
    uint64_t handshakes_failed = 0;
  };
  virtual PeerStatus Peer() const noexcept { return {}; }

  // The next frame the collector published on the control socket, without waiting:
  // false when none is there (or there is no control socket). Frames longer than
  // `max_bytes` are dropped unread (counted by the caller as bad).
  virtual bool TakeControlFrame(std::string* /*frame*/, size_t /*max_bytes*/) noexcept { return false; }

  // Lets queued messages go out for at most `linger`, then releases the socket.
  // Idempotent; Send() after Close() returns kError.
  virtual void Close(std::chrono::milliseconds linger) noexcept = 0;

 protected:
  Transport() = default;
};

}  // namespace lockstep

#endif  // LOCKSTEP_AGENT_TRANSPORT_TRANSPORT_H_
