// CurveGuard: ZeroMQ CURVE on the collector's PULL socket (docs/security.md).
//
// With a key pair the ingest socket becomes a CURVE server: traffic is encrypted, and an
// agent must know the collector's public key to connect at all. With an authorized-keys
// list, a ZAP handler (RFC 27) also refuses every agent whose own public key is not
// listed. Every refused handshake — a peer without CURVE, a peer with the wrong
// collector key, an unlisted agent key — is counted by reason from the socket's
// monitor events and logged, rate-limited.
//
// Threads: Create() runs on the controlling thread before the socket binds. Start()
// starts one thread that owns the ZAP REP socket and the monitor PAIR socket (one
// owner per socket); Stop() joins it. counters() from any thread.
#ifndef LOCKSTEP_COLLECTOR_INGEST_CURVE_GUARD_H_
#define LOCKSTEP_COLLECTOR_INGEST_CURVE_GUARD_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <zmq.hpp>

#include "lockstep/collector/curve_options.h"
#include "lockstep/common/status.h"

namespace lockstep::collector {

class CurveGuard {
 public:
  // Makes `socket` a CURVE server with the given secret key and, before any bind,
  // binds the context's ZAP handler and the socket's monitor. InvalidArgument for a
  // malformed key (one sentence), Internal for a ZeroMQ failure.
  static StatusOr<std::unique_ptr<CurveGuard>> Create(zmq::context_t& ctx, zmq::socket_t& socket,
                                                      const CurveServerOptions& options);
  ~CurveGuard();  // Stop()
  CurveGuard(const CurveGuard&) = delete;
  CurveGuard& operator=(const CurveGuard&) = delete;

  void Start();
  void Stop();  // idempotent; the sockets are closed when it returns

  AuthCounters counters() const;
  const std::string& public_key() const { return public_key_; }
  bool restricts_agents() const { return !authorized_.empty(); }

 private:
  CurveGuard() = default;
  void Run();
  void AnswerZap();
  void ReadMonitor();
  void CountRefusal(AuthRefusal r, const std::string& where);

  std::string public_key_;
  std::unordered_set<std::string> authorized_;
  zmq::socket_t zap_;      // REP on inproc://zeromq.zap.01
  zmq::socket_t monitor_;  // PAIR fed by the ingest socket's monitor
  std::thread thread_;
  std::atomic<bool> stop_{false};
  bool running_ = false;

  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> refused_by_[static_cast<size_t>(AuthRefusal::kCount)] = {};
  int64_t last_log_ns_[static_cast<size_t>(AuthRefusal::kCount)] = {};  // guard thread only
  uint64_t held_[static_cast<size_t>(AuthRefusal::kCount)] = {};        // lines held back
  std::string last_refused_key_;  // set by AnswerZap for the monitor's log line
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_INGEST_CURVE_GUARD_H_
