#include "lockstep/alerting/options.h"

#include <cctype>
#include <filesystem>
#include <vector>

#include "sink_type.h"
#include "url.h"

namespace lockstep::alerting {

std::span<const SinkKindInfo> SinkKinds() {
  // Built once from the tables, which are constants: the same answer on every thread.
  static const std::vector<SinkKindInfo> kinds = [] {
    std::vector<SinkKindInfo> out;
    for (const SinkType* t : AllSinkTypes())
      out.push_back({.name = t->name,
                     .listed_as = t->listed_as ? t->listed_as : t->name,
                     .http = t->http,
                     .webhook_format = t->http && t->webhook_format,
                     .signs = t->signs,
                     .bearer_token = t->bearer_token});
    return out;
  }();
  return kinds;
}

const SinkKindInfo* FindSinkKind(const std::string& name) {
  const SinkType* t = FindSinkType(name);
  if (t == nullptr) return nullptr;
  for (const SinkKindInfo& k : SinkKinds())
    if (k.name == t->name) return &k;
  return nullptr;
}

std::string ListSinkKinds(bool (*pick)(const SinkKindInfo&), const std::string& sep,
                          const std::string& last_sep) {
  std::vector<const char*> names;
  for (const SinkKindInfo& k : SinkKinds())
    if (pick(k)) names.push_back(k.listed_as);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? last_sep : sep) + names[i];
  return out;
}

StatusOr<std::string> ParseSinkKind(const std::string& name) {
  if (const SinkType* t = FindSinkType(name)) return std::string(t->name);
  return Status::InvalidArgument("unknown alert sink format '" + name + "': use one of " +
                                 ListSinkKinds([](const SinkKindInfo&) { return true; }, ", ", ", "));
}

StatusOr<Severity> ParseSeverity(const std::string& name) {
  if (name == "info") return Severity::kInfo;
  if (name == "warning" || name == "warn") return Severity::kWarning;
  if (name == "critical" || name == "crit") return Severity::kCritical;
  return Status::InvalidArgument("unknown alert severity '" + name +
                                 "': use info, warning or critical");
}

std::string RedactSecret(const std::string& secret) {
  if (secret.empty()) return "";
  return secret.substr(0, secret.size() > 8 ? 4 : 0) + "***";
}

std::string RedactUrl(const std::string& url) {
  // The scheme and host[:port] always show, also of a malformed URL (a misspelt or
  // missing scheme, "https:/host"), so the sentence that rejects it says what to fix;
  // userinfo, long path segments and query values never show.
  size_t start = 0;
  if (size_t sep = url.find("://"); sep != std::string::npos) {
    start = sep + 3;
  } else {
    const size_t colon = url.find(':');
    const size_t first_sep = url.find_first_of("/?#");
    bool scheme = colon != std::string::npos && colon > 0 && colon < first_sep;
    for (size_t i = 0; scheme && i < colon; ++i) scheme = std::isalpha(static_cast<unsigned char>(url[i])) != 0;
    if (scheme && colon + 1 < url.size() && url[colon + 1] == '/') {
      start = colon + 1;
      while (start < url.size() && url[start] == '/') ++start;
    } else if (first_sep == std::string::npos && url.find('.') == std::string::npos) {
      return RedactSecret(url);  // no URL shape at all: perhaps a token given as a URL
    }
  }
  std::string out = url.substr(0, start);
  std::string rest = url.substr(start);
  size_t slash = rest.find_first_of("/?#");
  std::string authority = rest.substr(0, slash);
  if (size_t at = authority.rfind('@'); at != std::string::npos) {
    out += "***@";
    authority = authority.substr(at + 1);
  }
  out += authority;
  if (slash == std::string::npos) return out;
  std::string tail = rest.substr(slash);
  // Path segments longer than 16 characters are tokens in every bot URL we know
  // (Slack, Feishu); query values (DingTalk access_token, WeCom key) are redacted.
  size_t q = tail.find('?');
  std::string path = tail.substr(0, q);
  std::string seg;
  auto flush_seg = [&] {
    out += seg.size() > 16 ? seg.substr(0, 4) + "***" : seg;
    seg.clear();
  };
  for (char c : path) {
    if (c == '/') {
      flush_seg();
      out += '/';
    } else {
      seg += c;
    }
  }
  flush_seg();
  if (q == std::string::npos) return out;
  out += '?';
  std::string query = tail.substr(q + 1);
  size_t pos = 0;
  bool first = true;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    std::string kv = query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
    if (!first) out += '&';
    first = false;
    size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      out += kv;
    } else {
      out += kv.substr(0, eq + 1) + RedactSecret(kv.substr(eq + 1));
    }
    if (amp == std::string::npos) break;
    pos = amp + 1;
  }
  return out;
}

Status ValidateOptions(const AlertingOptions& o) {
  for (size_t i = 0; i < o.sinks.size(); ++i) {
    const SinkOptions& s = o.sinks[i];
    std::string who = "alert sink " + SinkDisplayName(s, i);
    if (FindSinkType(s.kind) == nullptr) {
      auto kind = ParseSinkKind(s.kind);
      return Status::InvalidArgument(who + ": " + kind.status().message());
    }
    const SinkType& type = SinkTypeOf(s.kind);
    if (type.http) {
      if (s.target.empty())
        return Status::InvalidArgument(who + " has no URL: give the " + type.name + " URL");
      auto u = ParseUrl(s.target, "URL of " + who);
      if (!u.ok()) return u.status();
    }
    if (type.validate) LOCKSTEP_RETURN_IF_ERROR(type.validate(s, who));
    if (s.connect_timeout.count() <= 0 || s.request_timeout.count() <= 0)
      return Status::InvalidArgument(who + ": timeouts must be positive");
    if (s.max_retries < 0 || s.max_retries > 100)
      return Status::InvalidArgument(who + ": retries must be between 0 and 100");
    if (s.backoff_base.count() <= 0 || s.backoff_max < s.backoff_base)
      return Status::InvalidArgument(who + ": backoff base must be positive and not above its maximum");
    if (s.rate_per_min > 0 && s.burst < 1)
      return Status::InvalidArgument(who + ": rate-limit burst must be at least 1");
    std::error_code ec;  // the overload that cannot throw (a name too long, a loop...)
    if (!s.ca_file.empty() && !std::filesystem::is_regular_file(s.ca_file, ec))
      return Status::InvalidArgument(who + ": CA file '" + s.ca_file +
                                     "' does not exist or is not a file");
    if (!s.secret.empty() && !type.signs)
      return Status::InvalidArgument(
          who + ": a signing secret only applies to " +
          ListSinkKinds([](const SinkKindInfo& k) { return k.signs; }, ", ", " and ") + " sinks");
  }
  if (o.queue_capacity == 0) return Status::InvalidArgument("alert queue capacity must be at least 1");
  if (!o.spool_dir.empty() && o.spool_max_bytes < 4096)
    return Status::InvalidArgument("alert spool size cap must be at least 4096 bytes");
  return Status::OK();
}

}  // namespace lockstep::alerting
