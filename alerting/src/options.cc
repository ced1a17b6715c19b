#include "lockstep/alerting/options.h"

#include <cctype>
#include <filesystem>

#include "url.h"

namespace lockstep::alerting {

const char* SinkKindName(SinkKind k) {
  switch (k) {
    case SinkKind::kLog: return "log";
    case SinkKind::kJsonl: return "jsonl";
    case SinkKind::kWebhook: return "webhook";
    case SinkKind::kSlack: return "slack";
    case SinkKind::kFeishu: return "feishu";
    case SinkKind::kDingTalk: return "dingtalk";
    case SinkKind::kWeCom: return "wecom";
    case SinkKind::kAlertmanager: return "alertmanager";
  }
  return "unknown";
}

StatusOr<SinkKind> ParseSinkKind(const std::string& name) {
  if (name == "log") return SinkKind::kLog;
  if (name == "jsonl" || name == "file") return SinkKind::kJsonl;
  if (name == "webhook" || name == "generic" || name == "json") return SinkKind::kWebhook;
  if (name == "slack") return SinkKind::kSlack;
  if (name == "feishu" || name == "lark") return SinkKind::kFeishu;
  if (name == "dingtalk") return SinkKind::kDingTalk;
  if (name == "wecom" || name == "wechat" || name == "wxwork") return SinkKind::kWeCom;
  if (name == "alertmanager") return SinkKind::kAlertmanager;
  return Status::InvalidArgument(
      "unknown alert sink format '" + name +
      "': use one of generic, slack, feishu, dingtalk, wecom, alertmanager, jsonl, log");
}

StatusOr<Severity> ParseSeverity(const std::string& name) {
  if (name == "info") return Severity::kInfo;
  if (name == "warning" || name == "warn") return Severity::kWarning;
  if (name == "critical" || name == "crit") return Severity::kCritical;
  return Status::InvalidArgument("unknown alert severity '" + name +
                                 "': use info, warning or critical");
}

bool IsHttpKind(SinkKind k) { return k != SinkKind::kLog && k != SinkKind::kJsonl; }

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
    std::string who = "alert sink " + (s.name.empty() ? std::string(SinkKindName(s.kind)) + "-" +
                                                            std::to_string(i)
                                                      : s.name);
    if (IsHttpKind(s.kind)) {
      if (s.target.empty())
        return Status::InvalidArgument(who + " has no URL: give the " +
                                       std::string(SinkKindName(s.kind)) + " URL");
      auto u = ParseUrl(s.target, "URL of " + who);
      if (!u.ok()) return u.status();
    } else if (s.kind == SinkKind::kJsonl && s.target.empty()) {
      return Status::InvalidArgument(who + " has no file path: give --alerts-file PATH");
    }
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
    if (!s.secret.empty() && s.kind != SinkKind::kFeishu && s.kind != SinkKind::kDingTalk)
      return Status::InvalidArgument(who + ": a signing secret only applies to feishu and dingtalk sinks");
  }
  if (o.queue_capacity == 0) return Status::InvalidArgument("alert queue capacity must be at least 1");
  if (!o.spool_dir.empty() && o.spool_max_bytes < 4096)
    return Status::InvalidArgument("alert spool size cap must be at least 4096 bytes");
  return Status::OK();
}

}  // namespace lockstep::alerting
