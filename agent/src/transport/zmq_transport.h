// ZmqTransport: the agent's ZeroMQ PUSH socket (docs/design.md "Rules for the agent").
//
// PUSH, connect (never bind), ZMQ_SNDHWM = send_hwm, ZMQ_IMMEDIATE off so messages
// queue (up to the HWM) before the collector is up, every send with ZMQ_DONTWAIT, a
// bounded ZMQ_LINGER applied at Close(). Optional CURVE when the collector's public key
// is given. A socket monitor (inproc PAIR, read by the owner thread in
// TakeConnectEvents) reports ZMQ_EVENT_CONNECTED and the handshake's outcome (a peer
// that is not a PULL socket, e.g. the collector's view PUB port, fails the handshake).
//
// With a control endpoint, a SUB socket in the same context connects to the collector's
// control XPUB (same CURVE client settings) and the owner thread reads it with
// TakeControlFrame(); a collector without a control socket just never answers the
// connect, which costs nothing.
//
// Threads: Create() may run on any thread; afterwards only the sender thread calls it
// (the hand-over is the std::thread start). Owns its own zmq context, so Close() does
// not wait for anybody else's sockets.
#ifndef LOCKSTEP_AGENT_TRANSPORT_ZMQ_TRANSPORT_H_
#define LOCKSTEP_AGENT_TRANSPORT_ZMQ_TRANSPORT_H_

#include <memory>
#include <string>

#include "lockstep/common/status.h"
#include "transport/transport.h"

namespace lockstep {

struct ZmqTransportOptions {
  std::string endpoint;  // e.g. tcp://127.0.0.1:6200, ipc:///tmp/x, inproc://x
  int send_hwm = 1000;
  // CURVE (Z85, 40 characters each): when server_key is set the socket is a CURVE
  // client; an empty key pair is replaced by a fresh ephemeral one.
  std::string curve_server_key, curve_public_key, curve_secret_key;
  // The collector's control socket (XPUB): a SUB socket connects there, subscribed to
  // everything, with the same CURVE settings. Empty: none.
  std::string control_endpoint;
};

class ZmqTransport final : public Transport {
 public:
  // Fails with one sentence naming the endpoint (or key) and what is wrong with it.
  static StatusOr<std::unique_ptr<ZmqTransport>> Create(const ZmqTransportOptions& options);
  ~ZmqTransport() override;
  ZmqTransport(const ZmqTransport&) = delete;
  ZmqTransport& operator=(const ZmqTransport&) = delete;

  SendResult Send(const uint8_t* data, size_t size) noexcept override;
  // Zero-copy (zmq_msg_init_data): ZeroMQ's I/O thread calls `release` once sent.
  SendResult SendOwned(uint8_t* data, size_t size, ReleaseFn release, void* hint) noexcept override;
  int TakeConnectEvents() noexcept override;
  bool TakeControlFrame(std::string* frame, size_t max_bytes) noexcept override;
  PeerStatus Peer() const noexcept override { return peer_; }
  void Close(std::chrono::milliseconds linger) noexcept override;

 private:
  ZmqTransport() = default;
  void* ctx_ = nullptr;
  void* socket_ = nullptr;
  void* monitor_ = nullptr;  // PAIR connected to the socket's monitor endpoint
  void* control_ = nullptr;  // SUB connected to the collector's control socket, or null
  PeerStatus peer_{.known = true};
  bool handshake_pending_ = false;  // connected, handshake not finished yet
};

}  // namespace lockstep

#endif  // LOCKSTEP_AGENT_TRANSPORT_ZMQ_TRANSPORT_H_
