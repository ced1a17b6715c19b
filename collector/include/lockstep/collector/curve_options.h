// The CURVE settings of the collector's ingest socket and the counts of its handshakes
// (docs/security.md): what CollectorOptions and CollectorCounters carry. The handshake
// checking itself is the collector's private CurveGuard (src/ingest/curve_guard.h).
#ifndef LOCKSTEP_COLLECTOR_CURVE_OPTIONS_H_
#define LOCKSTEP_COLLECTOR_CURVE_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::collector {

struct CurveServerOptions {
  std::string secret_key;                    // the collector's, Z85; empty = CURVE off
  std::vector<std::string> authorized_keys;  // agents' public keys (Z85); empty = any agent
};

// Why a handshake was refused. Counters are indexed by it.
enum class AuthRefusal : uint8_t {
  kNoCurve = 0,   // the peer speaks plain ZeroMQ (no CURVE key configured)
  kBadServerKey,  // the peer's idea of the collector's public key is wrong
  kUnauthorized,  // the peer's own public key is not in the authorized list
  // Any other failure. A plain peer lands here instead of kNoCurve when it notices
  // the mechanism mismatch first and hangs up (the collector then sees only EPIPE).
  kOther,
  kCount,
};

// Stable lower-case name ("no_curve", "bad_server_key", ...) for logs and /metrics.
const char* AuthRefusalName(AuthRefusal r);

struct AuthCounters {
  uint64_t admitted = 0;  // handshakes that succeeded
  uint64_t refused = 0;   // sum of refused_by
  uint64_t refused_by[static_cast<size_t>(AuthRefusal::kCount)] = {};
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_CURVE_OPTIONS_H_
