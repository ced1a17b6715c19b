// Url: the parts of an http(s) URL the HTTP client needs. Parsed once at start-up
// (Dispatcher::Create) so a malformed URL is reported before any alert exists.
#ifndef LOCKSTEP_ALERTING_SRC_URL_H_
#define LOCKSTEP_ALERTING_SRC_URL_H_

#include <cstdint>
#include <string>

#include "lockstep/common/status.h"

namespace lockstep::alerting {

struct Url {
  bool https = false;
  std::string host;      // without brackets for IPv6
  uint16_t port = 0;     // filled with 80/443 when absent
  std::string target;    // path + "?" + query, at least "/"
  std::string userinfo;  // "user:pass" (becomes Basic auth), usually ""
  std::string HostHeader() const;
};

// `what` names the URL in the error sentence (e.g. "webhook URL of sink slack-0").
StatusOr<Url> ParseUrl(const std::string& url, const std::string& what);

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_SRC_URL_H_
