#include "ingest/curve_guard.h"

#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include "ingest/curve_keys.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/thread_name.h"

namespace lockstep::collector {
namespace {

// Per context: the one ZAP endpoint libzmq asks (RFC 27).
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
// The collector owns its context, so a fixed inproc name cannot collide.
constexpr const char* kMonitorEndpoint = "inproc://lockstep-ingest-monitor";
constexpr int kEvents = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                        ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
// A refused agent retries every 0.1-2 s; one line per reason per 10 s is plenty.
constexpr int64_t kLogEveryNs = 10'000'000'000;

std::string Why(AuthRefusal r) {
  switch (r) {
    case AuthRefusal::kNoCurve:
      return "the peer does not use CURVE (give the agent the collector's public key: "
             "LOCKSTEP_CURVE_SERVER_KEY)";
    case AuthRefusal::kBadServerKey:
      return "the peer holds a wrong collector public key (compare it with the collector's .pub file)";
    case AuthRefusal::kUnauthorized: return "the agent's public key is not in --curve-authorized-keys";
    case AuthRefusal::kOther:
    case AuthRefusal::kCount: break;
  }
  return "the CURVE handshake failed";
}

}  // namespace

const char* AuthRefusalName(AuthRefusal r) {
  switch (r) {
    case AuthRefusal::kNoCurve: return "no_curve";
    case AuthRefusal::kBadServerKey: return "bad_server_key";
    case AuthRefusal::kUnauthorized: return "unauthorized_key";
    case AuthRefusal::kOther: return "other";
    case AuthRefusal::kCount: break;
  }
  return "unknown";
}

StatusOr<std::unique_ptr<CurveGuard>> CurveGuard::Create(zmq::context_t& ctx, zmq::socket_t& socket,
                                                         const CurveServerOptions& o) {
  if (!IsZ85Key(o.secret_key))
    return Status::InvalidArgument("the collector's CURVE secret key is not a 40-character Z85 key");
  std::unique_ptr<CurveGuard> g(new CurveGuard());
  char pub[41];
  if (zmq_curve_public(pub, o.secret_key.c_str()) != 0)
    return Status::Internal("cannot use CURVE: this ZeroMQ was built without it");
  g->public_key_.assign(pub, 40);
  for (const auto& k : o.authorized_keys) {
    if (!IsZ85Key(k)) return Status::InvalidArgument("an authorized agent key is not a 40-character Z85 key");
    g->authorized_.insert(k);
  }
  try {
    // The ZAP handler is bound before the ingest socket binds, so no handshake can
    // happen without it.
    g->zap_ = zmq::socket_t(ctx, zmq::socket_type::rep);
    g->zap_.set(zmq::sockopt::linger, 0);
    g->zap_.bind(kZapEndpoint);
    socket.set(zmq::sockopt::curve_server, true);
    socket.set(zmq::sockopt::curve_secretkey, o.secret_key);
    socket.set(zmq::sockopt::zap_domain, "lockstep");
    if (zmq_socket_monitor(socket.handle(), kMonitorEndpoint, kEvents) != 0)
      throw zmq::error_t();
    g->monitor_ = zmq::socket_t(ctx, zmq::socket_type::pair);
    g->monitor_.set(zmq::sockopt::linger, 0);
    g->monitor_.connect(kMonitorEndpoint);
  } catch (const zmq::error_t& e) {
    return Status::Internal(std::string("cannot set up CURVE on the ingest socket: ") + e.what());
  }
  return g;
}

CurveGuard::~CurveGuard() { Stop(); }

void CurveGuard::Start() {
  if (running_) return;
  running_ = true;
  // The sockets were made on the controlling thread; the thread start is the full
  // barrier ZeroMQ asks for when a socket changes threads.
  thread_ = std::thread([this] {
    SetCurrentThreadName("ls-zap");
    Run();
  });
}

void CurveGuard::Stop() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
  zap_.close();
  monitor_.close();
}

AuthCounters CurveGuard::counters() const {
  AuthCounters c;
  c.admitted = admitted_.load(std::memory_order_relaxed);
  for (size_t i = 0; i < static_cast<size_t>(AuthRefusal::kCount); ++i) {
    c.refused_by[i] = refused_by_[i].load(std::memory_order_relaxed);
    c.refused += c.refused_by[i];
  }
  return c;
}

void CurveGuard::Run() {
  zmq::pollitem_t items[] = {{zap_.handle(), 0, ZMQ_POLLIN, 0}, {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
  while (!stop_.load(std::memory_order_acquire)) {
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(100));
      if (items[0].revents & ZMQ_POLLIN) AnswerZap();
      if (items[1].revents & ZMQ_POLLIN) ReadMonitor();
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      if (e.num() != EINTR) spdlog::error("CURVE guard: {}", e.what());
    }
  }
}

// RFC 27 request: version, request id, domain, address, routing id, mechanism, then
// the mechanism's credentials (CURVE: the client's 32-byte public key). A reply is
// always sent — libzmq holds the handshake until it gets one.
void CurveGuard::AnswerZap() {
  std::vector<zmq::message_t> req;
  if (!zmq::recv_multipart(zap_, std::back_inserter(req), zmq::recv_flags::dontwait)) return;
  std::string status = "400", text = "refused", user;
  if (req.size() >= 7 && req[0].to_string_view() == "1.0" && req[5].to_string_view() == "CURVE" &&
      req[6].size() == 32) {
    char z85[41];
    zmq_z85_encode(z85, static_cast<const uint8_t*>(req[6].data()), 32);
    std::string key(z85, 40);
    if (authorized_.empty() || authorized_.count(key) != 0) {
      status = "200";
      text = "OK";
      user = key;
    } else {
      text = "agent key not authorized";
      last_refused_key_ = KeyFingerprint(key) + " from " + req[3].to_string();
    }
  } else if (req.size() >= 6) {
    text = "CURVE required";
  }
  std::string request_id = req.size() >= 2 ? req[1].to_string() : "";
  std::array<zmq::const_buffer, 6> reply = {zmq::str_buffer("1.0"), zmq::buffer(request_id), zmq::buffer(status),
                                            zmq::buffer(text), zmq::buffer(user), zmq::const_buffer()};
  zmq::send_multipart(zap_, reply);
}

// Each event is two frames: [u16 event, u32 value] and the endpoint (the bound one:
// libzmq does not name the peer here, which is why AnswerZap remembers it).
void CurveGuard::ReadMonitor() {
  std::vector<zmq::message_t> ev;
  while (zmq::recv_multipart(monitor_, std::back_inserter(ev), zmq::recv_flags::dontwait)) {
    if (ev.size() >= 1 && ev[0].size() >= 6) {
      uint16_t event;
      uint32_t value;
      std::memcpy(&event, ev[0].data(), 2);
      std::memcpy(&value, static_cast<const char*>(ev[0].data()) + 2, 4);
      std::string where = ev.size() >= 2 ? ev[1].to_string() : "";
      if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        admitted_.fetch_add(1, std::memory_order_relaxed);
      } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        CountRefusal(AuthRefusal::kUnauthorized, last_refused_key_.empty() ? where : last_refused_key_);
      } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
        AuthRefusal r = value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ? AuthRefusal::kNoCurve
                        : value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC  ? AuthRefusal::kBadServerKey
                                                                          : AuthRefusal::kOther;
        CountRefusal(r, r == AuthRefusal::kOther ? fmt::format("{}, ZeroMQ protocol error {:#x}", where, value) : where);
      } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
        // Typically a plain peer that saw the mismatch first and hung up (EPIPE).
        CountRefusal(AuthRefusal::kOther, fmt::format("{} ({} during the handshake: a peer without CURVE?)", where,
                                                      zmq_strerror(static_cast<int>(value))));
      }
    }
    ev.clear();
  }
}

void CurveGuard::CountRefusal(AuthRefusal r, const std::string& where) {
  size_t i = static_cast<size_t>(r);
  uint64_t total = refused_by_[i].fetch_add(1, std::memory_order_relaxed) + 1;
  int64_t now = MonotonicNowNs();
  if (last_log_ns_[i] != 0 && now - last_log_ns_[i] < kLogEveryNs) {
    ++held_[i];
    return;
  }
  spdlog::warn("refused a connection on {}: {} ({}: {} so far{})", where, Why(r), AuthRefusalName(r), total,
               held_[i] ? ", " + std::to_string(held_[i]) + " not logged" : "");
  last_log_ns_[i] = now;
  held_[i] = 0;
}

}  // namespace lockstep::collector
