// Where the control channel (collector -> agents) lives, derived from the ingest
// endpoint when nobody says otherwise, so that a user configures one address and both
// sides agree on the second (docs/design.md "The control channel").
//
//   tcp://HOST:PORT  ->  tcp://HOST:PORT+2   (6200 -> 6202; 6201 is the view feed)
//   ipc://PATH       ->  ipc://PATH.control
//   inproc://NAME    ->  inproc://NAME.control
//
// Anything else (a wildcard port, a port past 65533, another transport) has no derived
// control endpoint: "" (the control channel is off unless one is given).
#ifndef LOCKSTEP_COMMON_CONTROL_ENDPOINT_H_
#define LOCKSTEP_COMMON_CONTROL_ENDPOINT_H_

#include <string>
#include <string_view>

namespace lockstep {

inline std::string ControlEndpointFor(std::string_view ingest) {
  constexpr std::string_view kTcp = "tcp://";
  if (ingest.substr(0, kTcp.size()) == kTcp) {
    const size_t colon = ingest.rfind(':');
    if (colon == std::string_view::npos || colon < kTcp.size()) return {};
    std::string_view port = ingest.substr(colon + 1);
    if (port.empty() || port.size() > 5) return {};
    unsigned value = 0;
    for (char c : port) {
      if (c < '0' || c > '9') return {};
      value = value * 10 + static_cast<unsigned>(c - '0');
    }
    if (value == 0 || value > 65533) return {};
    return std::string(ingest.substr(0, colon + 1)) + std::to_string(value + 2);
  }
  for (std::string_view scheme : {std::string_view("ipc://"), std::string_view("inproc://")}) {
    if (ingest.size() > scheme.size() && ingest.substr(0, scheme.size()) == scheme) {
      return std::string(ingest) + ".control";
    }
  }
  return {};
}

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_CONTROL_ENDPOINT_H_
