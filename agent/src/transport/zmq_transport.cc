#include "transport/zmq_transport.h"

#include <zmq.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "transport/handoff_annotations.h"

namespace lockstep {
namespace {

bool IsZ85Key(const std::string& k) { return k.size() == 40; }

Status SetInt(void* s, int option, int value, const char* what) {
  if (zmq_setsockopt(s, option, &value, sizeof value) != 0) {
    return Status::Internal(std::string("could not set ZeroMQ option ") + what + ": " +
                            zmq_strerror(zmq_errno()));
  }
  return Status::OK();
}

Status SetKey(void* s, int option, const std::string& key, const char* what) {
  if (!IsZ85Key(key)) {
    return Status::InvalidArgument(std::string("the CURVE ") + what +
                                   " must be a 40-character Z85 key (see zmq_curve_keypair)");
  }
  if (zmq_setsockopt(s, option, key.data(), key.size()) != 0) {
    return Status::InvalidArgument(std::string("the CURVE ") + what + " was refused by ZeroMQ: " +
                                   zmq_strerror(zmq_errno()));
  }
  return Status::OK();
}

Status SetCurveClient(void* s, const std::string& server, const std::string& pub, const std::string& sec) {
  LOCKSTEP_RETURN_IF_ERROR(SetKey(s, ZMQ_CURVE_SERVERKEY, server, "server (collector) public key"));
  LOCKSTEP_RETURN_IF_ERROR(SetKey(s, ZMQ_CURVE_PUBLICKEY, pub, "agent public key"));
  return SetKey(s, ZMQ_CURVE_SECRETKEY, sec, "agent secret key");
}

}  // namespace

StatusOr<std::unique_ptr<ZmqTransport>> ZmqTransport::Create(const ZmqTransportOptions& o) {
  if (o.endpoint.empty()) {
    return Status::InvalidArgument("the agent endpoint is empty; give the collector's address, e.g. tcp://127.0.0.1:6200");
  }
  if (o.send_hwm < 0) {
    return Status::InvalidArgument("send_hwm must be >= 0 (0 means unlimited)");
  }
  std::unique_ptr<ZmqTransport> t(new ZmqTransport());
  std::string curve_pub, curve_sec;  // the pair the data socket uses, for the control one
  t->ctx_ = zmq_ctx_new();
  if (t->ctx_ == nullptr) return Status::Internal("could not create a ZeroMQ context");
  t->socket_ = zmq_socket(t->ctx_, ZMQ_PUSH);
  if (t->socket_ == nullptr) return Status::Internal("could not create a ZeroMQ PUSH socket");
  LOCKSTEP_RETURN_IF_ERROR(SetInt(t->socket_, ZMQ_SNDHWM, o.send_hwm, "ZMQ_SNDHWM"));
  LOCKSTEP_RETURN_IF_ERROR(SetInt(t->socket_, ZMQ_IMMEDIATE, 0, "ZMQ_IMMEDIATE"));
  // Until Close() sets the real budget, never let a forgotten message hold the context.
  LOCKSTEP_RETURN_IF_ERROR(SetInt(t->socket_, ZMQ_LINGER, 0, "ZMQ_LINGER"));
  // Reconnect quickly after a collector restart, but back off if it stays away.
  LOCKSTEP_RETURN_IF_ERROR(SetInt(t->socket_, ZMQ_RECONNECT_IVL, 100, "ZMQ_RECONNECT_IVL"));
  LOCKSTEP_RETURN_IF_ERROR(SetInt(t->socket_, ZMQ_RECONNECT_IVL_MAX, 2000, "ZMQ_RECONNECT_IVL_MAX"));

  if (!o.curve_server_key.empty()) {
    std::string pub = o.curve_public_key, sec = o.curve_secret_key;
    if (pub.empty() != sec.empty()) {
      return Status::InvalidArgument(
          "give both the agent's CURVE public and secret key, or neither (an ephemeral pair is made)");
    }
    if (pub.empty()) {
      char p[41], s[41];
      if (zmq_curve_keypair(p, s) != 0) {
        return Status::Internal("could not make a CURVE key pair: ZeroMQ was built without CURVE");
      }
      pub.assign(p, 40);
      sec.assign(s, 40);
    }
    LOCKSTEP_RETURN_IF_ERROR(SetCurveClient(t->socket_, o.curve_server_key, pub, sec));
    curve_pub = pub;
    curve_sec = sec;
  }

  if (!o.control_endpoint.empty()) {
    // Requests are few and idempotent (published again until answered): a small queue,
    // and nothing kept at close.
    t->control_ = zmq_socket(t->ctx_, ZMQ_SUB);
    if (t->control_ == nullptr) return Status::Internal("could not create the agent's control socket");
    LOCKSTEP_RETURN_IF_ERROR(SetInt(t->control_, ZMQ_RCVHWM, 64, "ZMQ_RCVHWM"));
    LOCKSTEP_RETURN_IF_ERROR(SetInt(t->control_, ZMQ_LINGER, 0, "ZMQ_LINGER"));
    LOCKSTEP_RETURN_IF_ERROR(SetInt(t->control_, ZMQ_RECONNECT_IVL, 100, "ZMQ_RECONNECT_IVL"));
    LOCKSTEP_RETURN_IF_ERROR(SetInt(t->control_, ZMQ_RECONNECT_IVL_MAX, 2000, "ZMQ_RECONNECT_IVL_MAX"));
    if (!curve_pub.empty()) {
      LOCKSTEP_RETURN_IF_ERROR(SetCurveClient(t->control_, o.curve_server_key, curve_pub, curve_sec));
    }
    if (zmq_setsockopt(t->control_, ZMQ_SUBSCRIBE, "", 0) != 0 ||
        zmq_connect(t->control_, o.control_endpoint.c_str()) != 0) {
      int err = zmq_errno();
      return Status::InvalidArgument("the control endpoint (control_endpoint) '" + o.control_endpoint +
                                     "' is not usable (" + zmq_strerror(err) +
                                     "); give transport://address:port, e.g. tcp://127.0.0.1:6202, or 'off'");
    }
  }

  // The monitor is set up before connect so the first connection is seen too. The
  // context is ours alone, so a fixed inproc name cannot collide.
  const char* kMonitor = "inproc://lockstep-agent-monitor";
  constexpr int kEvents = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                          ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                          ZMQ_EVENT_DISCONNECTED;
  if (zmq_socket_monitor(t->socket_, kMonitor, kEvents) != 0) {
    return Status::Internal(std::string("could not monitor the agent socket: ") + zmq_strerror(zmq_errno()));
  }
  t->monitor_ = zmq_socket(t->ctx_, ZMQ_PAIR);
  if (t->monitor_ == nullptr || zmq_connect(t->monitor_, kMonitor) != 0) {
    return Status::Internal("could not connect to the agent socket's monitor");
  }
  LOCKSTEP_RETURN_IF_ERROR(SetInt(t->monitor_, ZMQ_LINGER, 0, "ZMQ_LINGER"));

  if (zmq_connect(t->socket_, o.endpoint.c_str()) != 0) {
    int err = zmq_errno();
    return Status::InvalidArgument("the agent endpoint '" + o.endpoint + "' is not usable (" +
                                   zmq_strerror(err) +
                                   "); give transport://address:port, e.g. tcp://127.0.0.1:6200");
  }
  return t;
}

ZmqTransport::~ZmqTransport() { Close(std::chrono::milliseconds(0)); }

Transport::SendResult ZmqTransport::Send(const uint8_t* data, size_t size) noexcept {
  if (socket_ == nullptr) return SendResult::kError;
  if (zmq_send(socket_, data, size, ZMQ_DONTWAIT) >= 0) return SendResult::kSent;
  int err = zmq_errno();
  if (err == EAGAIN) return SendResult::kWouldBlock;
  if (err == EINTR) return SendResult::kWouldBlock;  // a signal: treat like a full socket
  return SendResult::kError;
}

Transport::SendResult ZmqTransport::SendOwned(uint8_t* data, size_t size, ReleaseFn release,
                                              void* hint) noexcept {
  zmq_msg_t msg;
  if (socket_ == nullptr || zmq_msg_init_data(&msg, data, size, release, hint) != 0) {
    release(data, hint);
    return SendResult::kError;
  }
  HandOffToZmq(hint);  // `release(data, hint)` may run on ZeroMQ's I/O thread from here on
  if (zmq_msg_send(&msg, socket_, ZMQ_DONTWAIT) >= 0) return SendResult::kSent;
  int err = zmq_errno();
  zmq_msg_close(&msg);  // still ours after a refused send: this calls `release`
  if (err == EAGAIN || err == EINTR) return SendResult::kWouldBlock;
  return SendResult::kError;
}

int ZmqTransport::TakeConnectEvents() noexcept {
  if (monitor_ == nullptr) return 0;
  int connects = 0;
  // Each event is two frames: [u16 event, u32 value] and the peer address.
  for (;;) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, monitor_, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&msg);
      break;
    }
    if (zmq_msg_size(&msg) >= 2) {
      uint16_t event;
      std::memcpy(&event, zmq_msg_data(&msg), sizeof event);
      switch (event) {
        case ZMQ_EVENT_CONNECTED:
          ++connects;
          ++peer_.connects;
          handshake_pending_ = true;
          break;
        case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
          ++peer_.handshakes_ok;
          handshake_pending_ = false;
          break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
          ++peer_.handshakes_failed;
          handshake_pending_ = false;
          break;
        case ZMQ_EVENT_DISCONNECTED:
          // Dropped before its handshake completed: the peer refused us.
          if (handshake_pending_) ++peer_.handshakes_failed;
          handshake_pending_ = false;
          break;
        default:
          break;
      }
    }
    bool more = zmq_msg_more(&msg);
    zmq_msg_close(&msg);
    while (more) {  // drain the address frame
      zmq_msg_t part;
      zmq_msg_init(&part);
      if (zmq_msg_recv(&part, monitor_, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&part);
        break;
      }
      more = zmq_msg_more(&part);
      zmq_msg_close(&part);
    }
  }
  return connects;
}

bool ZmqTransport::TakeControlFrame(std::string* frame, size_t max_bytes) noexcept {
  if (control_ == nullptr) return false;
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  if (zmq_msg_recv(&msg, control_, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&msg);
    return false;
  }
  // A request is one frame: anything larger than `max_bytes`, or a multi-part
  // message (whose other parts are drained), comes back empty for the caller to count.
  bool keep = zmq_msg_size(&msg) <= max_bytes && !zmq_msg_more(&msg);
  bool more = zmq_msg_more(&msg);
  frame->clear();
  if (keep) {
    try {
      frame->assign(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    } catch (...) {
      frame->clear();
    }
  }
  zmq_msg_close(&msg);
  while (more) {
    zmq_msg_t part;
    zmq_msg_init(&part);
    more = zmq_msg_recv(&part, control_, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&part);
    zmq_msg_close(&part);
  }
  return true;
}

void ZmqTransport::Close(std::chrono::milliseconds linger) noexcept {
  if (ctx_ == nullptr) return;
  if (control_ != nullptr) {
    zmq_close(control_);
    control_ = nullptr;
  }
  if (socket_ != nullptr) {
    zmq_socket_monitor(socket_, nullptr, 0);
    int ms = linger.count() < 0 ? 0 : static_cast<int>(linger.count());
    zmq_setsockopt(socket_, ZMQ_LINGER, &ms, sizeof ms);
    zmq_close(socket_);
    socket_ = nullptr;
  }
  if (monitor_ != nullptr) {
    zmq_close(monitor_);
    monitor_ = nullptr;
  }
  // Blocks at most the linger set above: every socket of this context is closed.
  zmq_ctx_term(ctx_);
  ctx_ = nullptr;
}

}  // namespace lockstep
