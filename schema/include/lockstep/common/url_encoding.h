// Percent-encoding for URL query components (RFC 3986): one implementation for the
// places that build or read a query string (the live report's links and its
// ?experiment= parameter, the collector's POST /zoom, the DingTalk sink's signed
// webhook URL).
#ifndef LOCKSTEP_COMMON_URL_ENCODING_H_
#define LOCKSTEP_COMMON_URL_ENCODING_H_

#include <string>
#include <string_view>

namespace lockstep {

// `s` with every byte but the unreserved ones (A-Z a-z 0-9 - _ . ~) written as %XX
// (upper-case hex): safe as a query value or a path segment.
inline std::string UrlEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
                            c == '~';
    if (unreserved) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// A query component decoded: %XX (either case) is the byte, '+' a space (what browsers
// send for forms); a '%' not followed by two hex digits stays as it is.
inline std::string UrlDecode(std::string_view s) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The value of `key` in a query string ("a=1&b=2", without the '?'), decoded; "" when
// absent.
inline std::string QueryValue(std::string_view query, std::string_view key) {
  while (!query.empty()) {
    const size_t amp = query.find('&');
    std::string_view kv = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos || kv.substr(0, eq) != key) continue;
    return UrlDecode(kv.substr(eq + 1));
  }
  return "";
}

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_URL_ENCODING_H_
