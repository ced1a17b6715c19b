#include "url.h"

#include <cctype>
#include <cstdlib>

#include "lockstep/alerting/options.h"

namespace lockstep::alerting {

std::string Url::HostHeader() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  if ((https && port != 443) || (!https && port != 80)) h += ":" + std::to_string(port);
  return h;
}

StatusOr<Url> ParseUrl(const std::string& url, const std::string& what) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(what + " '" + RedactUrl(url) + "' is not a valid URL: " + why +
                                   " (expected e.g. https://host[:port]/path)");
  };
  Url u;
  std::string rest;
  if (url.rfind("https://", 0) == 0) {
    u.https = true;
    rest = url.substr(8);
  } else if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else {
    return bad("it must start with http:// or https://");
  }
  for (unsigned char c : url) {
    if (c <= 0x20 || c == 0x7f) return bad("it contains a space or control character");
  }
  size_t slash = rest.find_first_of("/?#");
  std::string authority = rest.substr(0, slash);
  u.target = slash == std::string::npos ? "/" : rest.substr(slash);
  if (size_t hash = u.target.find('#'); hash != std::string::npos) u.target.resize(hash);
  if (u.target.empty() || u.target[0] != '/') u.target = "/" + u.target;
  if (size_t at = authority.rfind('@'); at != std::string::npos) {
    u.userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
  }
  std::string port_text;
  if (!authority.empty() && authority[0] == '[') {
    size_t close = authority.find(']');
    if (close == std::string::npos) return bad("an IPv6 host needs a closing ']'");
    u.host = authority.substr(1, close - 1);
    std::string after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad("unexpected text after the IPv6 host");
      port_text = after.substr(1);
    }
  } else {
    size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) port_text = authority.substr(colon + 1);
  }
  if (u.host.empty()) return bad("the host is missing");
  for (char c : u.host) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
          c == ':'))
      return bad("the host contains '" + std::string(1, c) + "'");
  }
  if (!port_text.empty()) {
    char* end = nullptr;
    long p = std::strtol(port_text.c_str(), &end, 10);
    if (*end != '\0' || p < 1 || p > 65535) return bad("the port must be a number 1..65535");
    u.port = static_cast<uint16_t>(p);
  } else {
    u.port = u.https ? 443 : 80;
  }
  return u;
}

}  // namespace lockstep::alerting
