#include "cli/alerting_flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace lockstep::cli {
namespace {

using alerting::AlertingOptions;
using alerting::SinkKindInfo;
using alerting::SinkOptions;

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000.0)));
}

// "env:NAME" -> the variable's value; anything else as is.
StatusOr<std::string> Resolve(const std::string& value, const std::string& what) {
  if (value.rfind("env:", 0) != 0) return value;
  std::string name = value.substr(4);
  const char* v = name.empty() ? nullptr : std::getenv(name.c_str());
  if (v == nullptr || *v == '\0')
    return Status::InvalidArgument(what + " names environment variable '" + name +
                                   "', which is not set: export it or give the value directly");
  return std::string(v);
}

StatusOr<double> ParseNumber(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(x))
    return Status::InvalidArgument(what + " expects a number, got '" + text + "'");
  return x;
}

// Fields every flag-built sink shares.
SinkOptions Common(const AlertingFlags& f, alerting::Severity min) {
  SinkOptions s;
  s.min_severity = min;
  s.rate_per_min = f.rate_per_min;
  s.burst = static_cast<int>(f.burst);
  s.max_retries = static_cast<int>(f.retries);
  s.backoff_base = std::chrono::milliseconds(f.backoff_ms);
  s.backoff_max = Ms(f.backoff_max_s);
  s.request_timeout = Ms(f.timeout_s);
  s.connect_timeout = Ms(f.connect_timeout_s);
  s.ca_file = f.ca_file;
  return s;
}

// The formats --webhook-format accepts, the kinds --webhook-secret and --webhook-token
// apply to: asked of the registry of sink kinds, so a new kind needs no edit here.
std::string WebhookFormats(const char* sep) {
  return alerting::ListSinkKinds([](const SinkKindInfo& k) { return k.webhook_format; }, sep, sep);
}
std::string SigningFormats() {
  return alerting::ListSinkKinds(
      [](const SinkKindInfo& k) { return k.webhook_format && k.signs; }, ", ", " and ");
}
std::string TokenFormats() {
  return alerting::ListSinkKinds(
      [](const SinkKindInfo& k) { return k.webhook_format && k.bearer_token; }, ", ", " and ");
}

// The keys --alert-sink knows, as its error lists them.
constexpr const char* kSinkKeys =
    "kind, url, path, name, min-severity, secret, token, ca-file, msg-type, generator-url, "
    "rate-per-min, burst, retries, timeout-s, connect-timeout-s, cooldown-s";

// A sink spec as messages may show it: URLs redacted (scheme and host kept), secrets
// and tokens hidden, every other value as given.
std::string RedactSpec(const std::string& spec) {
  std::string out;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string kv = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (pos > 0) out += ',';
    pos = comma == std::string::npos ? spec.size() + 1 : comma + 1;
    size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      out += alerting::RedactUrl(kv);  // not key=value: show no more than a URL's parts
      continue;
    }
    std::string k = kv.substr(0, eq), v = kv.substr(eq + 1), key = k;
    for (char& c : key) c = c == '_' ? '-' : c;
    while (!key.empty() && key.front() == ' ') key.erase(0, 1);
    if (v.rfind("env:", 0) != 0) {
      if (key == "url") v = alerting::RedactUrl(v);
      else if (key == "secret" || key == "token") v = "***";
    }
    out += k + "=" + v;
  }
  return out;
}

// --alert-sink "kind=feishu,url=env:FEISHU_URL,secret=env:FEISHU_SECRET,min-severity=critical"
Status ParseSinkSpec(const std::string& spec, SinkOptions* s) {
  std::string who = "--alert-sink '" + RedactSpec(spec) + "'";
  bool has_kind = false;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string kv = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? spec.size() + 1 : comma + 1;
    while (!kv.empty() && kv.front() == ' ') kv.erase(0, 1);
    while (!kv.empty() && kv.back() == ' ') kv.pop_back();
    if (kv.empty()) continue;
    size_t eq = kv.find('=');
    if (eq == std::string::npos)
      return Status::InvalidArgument(who + ": expected key=value, got '" + kv.substr(0, 20) + "'");
    std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    for (char& c : k) if (c == '_') c = '-';
    std::string what = who + " key " + k;
    if (k == "kind" || k == "format") {
      auto kind = alerting::ParseSinkKind(v);
      if (!kind.ok()) return kind.status();
      s->kind = *kind;
      has_kind = true;
    } else if (k == "url" || k == "path") {
      auto r = Resolve(v, what);
      if (!r.ok()) return r.status();
      s->target = *r;
    } else if (k == "name") {
      s->name = v;
    } else if (k == "min-severity") {
      auto sev = alerting::ParseSeverity(v);
      if (!sev.ok()) return sev.status();
      s->min_severity = *sev;
    } else if (k == "secret" || k == "token") {
      auto r = Resolve(v, what);
      if (!r.ok()) return r.status();
      (k == "secret" ? s->secret : s->token) = *r;
    } else if (k == "ca-file") {
      s->ca_file = v;
    } else if (k == "msg-type") {
      if (v != "text" && v != "interactive")
        return Status::InvalidArgument(what + " must be text or interactive");
      s->feishu_text = v == "text";
    } else if (k == "generator-url") {
      s->generator_url = v;
    } else if (k == "rate-per-min" || k == "burst" || k == "retries" || k == "timeout-s" ||
               k == "connect-timeout-s" || k == "cooldown-s") {
      auto x = ParseNumber(v, what);
      if (!x.ok()) return x.status();
      if (*x < 0) return Status::InvalidArgument(what + " must not be negative, got '" + v + "'");
      if (*x > 1e9) return Status::InvalidArgument(what + " is too large, got '" + v + "'");
      if (k == "rate-per-min") s->rate_per_min = *x;
      else if (k == "burst") s->burst = static_cast<int>(*x);
      else if (k == "retries") s->max_retries = static_cast<int>(*x);
      else if (k == "timeout-s") s->request_timeout = Ms(*x);
      else if (k == "connect-timeout-s") s->connect_timeout = Ms(*x);
      else s->cooldown = Ms(*x);
    } else {
      return Status::InvalidArgument(who + ": unknown key '" + k + "' (known: " + kSinkKeys + ")");
    }
  }
  if (!has_kind) return Status::InvalidArgument(who + " has no kind=...: say which format it is");
  return Status::OK();
}

}  // namespace

void RegisterAlertingFlags(FlagSet* f, AlertingFlags* v) {
  f->StringList("webhook", &v->webhooks,
                "send alerts to this webhook URL (or env:VAR); format from --webhook-format", "URL");
  f->StringList("webhook-format", &v->webhook_formats,
                WebhookFormats("|") + ": one for all --webhook URLs, or one per URL in order (default generic)",
                "FORMAT");
  f->String("webhook-secret", &v->webhook_secret,
            "signing secret (or env:VAR) for " + SigningFormats() + " webhooks", "SECRET");
  f->String("webhook-token", &v->webhook_token,
            "bearer token (or env:VAR) sent to " + TokenFormats() + " webhooks", "TOKEN");
  f->String("feishu-msg-type", &v->feishu_msg_type, "Feishu/Lark message: interactive or text", "TYPE");
  f->StringList("alertmanager", &v->alertmanagers,
                "Prometheus Alertmanager base URL (POSTs to URL/api/v2/alerts)", "URL");
  f->String("alert-generator-url", &v->generator_url,
            "generatorURL sent to Alertmanager (a link back to this collector)", "URL");
  f->StringList("alert-sink", &v->sinks,
                "a fully configured sink: \"kind=K,url=U[,min-severity=S,secret=..,token=..,"
                "ca-file=..,rate-per-min=..,burst=..,retries=..,timeout-s=..,cooldown-s=..]\"",
                "SPEC");
  f->String("alerts-file", &v->alerts_file, "append every alert as a JSON line to this file", "PATH");
  f->Bool("alert-log", &v->log, "also write every alert to the collector's log");
  f->String("alert-min-severity", &v->min_severity,
            "send only alerts at least this severe: info|warning|critical", "SEVERITY");
  f->String("alert-ca-file", &v->ca_file,
            "PEM CA certificate trusted for HTTPS sinks, besides the system store", "FILE");
  f->String("alert-spool-dir", &v->spool_dir,
            "where undelivered alerts wait across restarts (default: DATA_DIR/alert-spool)", "DIR");
  f->Int("alert-spool-max-mb", &v->spool_max_mb, "spool size cap per sink; oldest dropped beyond it", "MB");
  f->Double("alert-cooldown-s", &v->cooldown_s,
            "suppress repeats of the same (rule, experiment, run, tensor, kind, rank, micro step) for this long (0 = off)", "SECONDS");
  f->Double("alert-rate-per-min", &v->rate_per_min, "per-sink rate limit (0 = off)", "N");
  f->Int("alert-burst", &v->burst, "per-sink burst allowed by the rate limit", "N");
  f->Int("alert-retries", &v->retries, "retries before an alert counts as spooled (it is still retried)", "N");
  f->Int("alert-backoff-ms", &v->backoff_ms, "first retry delay; doubles per retry, with jitter", "MS");
  f->Double("alert-backoff-max-s", &v->backoff_max_s, "longest retry delay", "SECONDS");
  f->Double("alert-timeout-s", &v->timeout_s, "HTTP request timeout (TLS, send, answer)", "SECONDS");
  f->Double("alert-connect-timeout-s", &v->connect_timeout_s, "HTTP connect timeout (DNS + TCP)", "SECONDS");
  f->Bool("incidents", &v->incidents,
          "webhook, chat and Alertmanager sinks notify per incident (opened, escalated, digest, "
          "resolved), not per alert; --no-incidents sends every alert");
  f->Double("incident-digest-interval-s", &v->incident_digest_interval_s,
            "at most one digest per incident this often while it lasts (0 = no digests)", "SECONDS");
  f->Double("incident-resolve-s", &v->incident_resolve_s,
            "an incident no alert joined for this long is resolved (0 = never)", "SECONDS");
}

StatusOr<AlertingOptions> BuildAlertingOptions(const AlertingFlags& f,
                                               const std::string& default_spool_dir) {
  auto min = alerting::ParseSeverity(f.min_severity);
  if (!min.ok()) return Status::InvalidArgument("--alert-min-severity: " + min.status().message());
  if (f.timeout_s <= 0 || f.connect_timeout_s <= 0)
    return Status::InvalidArgument("--alert-timeout-s and --alert-connect-timeout-s must be positive");
  // Ranges: a negative rate or count is a mistake, not "off"; huge values would overflow
  // the millisecond durations they become.
  struct Range {
    const char* flag;
    double value, lo, hi;
  };
  for (const Range& r : {Range{"--alert-timeout-s", f.timeout_s, 0, 86400},
                         Range{"--alert-connect-timeout-s", f.connect_timeout_s, 0, 86400},
                         Range{"--alert-cooldown-s", f.cooldown_s, 0, 30 * 86400.0},
                         Range{"--alert-rate-per-min", f.rate_per_min, 0, 1e6},
                         Range{"--alert-burst", static_cast<double>(f.burst), 0, 1e6},
                         Range{"--alert-retries", static_cast<double>(f.retries), 0, 100},
                         Range{"--alert-backoff-ms", static_cast<double>(f.backoff_ms), 1, 86400e3},
                         Range{"--alert-backoff-max-s", f.backoff_max_s, 0, 86400},
                         Range{"--alert-spool-max-mb", static_cast<double>(f.spool_max_mb), 1, 1 << 20}}) {
    if (!(r.value >= r.lo && r.value <= r.hi)) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "%s %.17g is out of range: give a number from %g to %g", r.flag, r.value,
                    r.lo, r.hi);
      return Status::InvalidArgument(buf);
    }
  }
  if (f.feishu_msg_type != "interactive" && f.feishu_msg_type != "text")
    return Status::InvalidArgument("--feishu-msg-type must be interactive or text, got '" +
                                   f.feishu_msg_type + "'");
  if (f.webhook_formats.size() > 1 && f.webhook_formats.size() != f.webhooks.size())
    return Status::InvalidArgument(
        "--webhook-format was given " + std::to_string(f.webhook_formats.size()) + " times for " +
        std::to_string(f.webhooks.size()) + " --webhook URLs: give one format for all, or one per URL");

  AlertingOptions o;
  o.spool_dir = f.spool_dir.empty() ? default_spool_dir : f.spool_dir;
  o.spool_max_bytes = static_cast<uint64_t>(f.spool_max_mb) << 20;
  o.dedup_cooldown = Ms(f.cooldown_s);
  if (f.incident_digest_interval_s < 0)
    return Status::InvalidArgument("--incident-digest-interval-s must not be negative (0 = no digests)");
  if (f.incident_resolve_s < 0)
    return Status::InvalidArgument("--incident-resolve-s must not be negative (0 = incidents never resolve)");
  o.group_incidents = f.incidents;
  o.incident_digest_interval = Ms(f.incident_digest_interval_s);
  o.incident_resolve_after = Ms(f.incident_resolve_s);
  auto secret = Resolve(f.webhook_secret, "--webhook-secret");
  if (!secret.ok()) return secret.status();
  auto token = Resolve(f.webhook_token, "--webhook-token");
  if (!token.ok()) return token.status();

  for (size_t i = 0; i < f.webhooks.size(); ++i) {
    SinkOptions s = Common(f, *min);
    std::string fmt = f.webhook_formats.empty() ? "generic"
                      : f.webhook_formats.size() == 1 ? f.webhook_formats[0] : f.webhook_formats[i];
    const SinkKindInfo* kind = alerting::FindSinkKind(fmt);  // or an alias: lark, json, wechat
    if (kind == nullptr || !kind->webhook_format)
      return Status::InvalidArgument("--webhook-format '" + fmt + "' is not a webhook format: use one of " +
                                     WebhookFormats(", ") + " (alertmanager: --alertmanager URL)");
    s.kind = kind->name;
    auto url = Resolve(f.webhooks[i], "--webhook");
    if (!url.ok()) return url.status();
    s.target = *url;
    if (kind->signs) s.secret = *secret;
    if (kind->bearer_token) s.token = *token;
    s.feishu_text = f.feishu_msg_type == "text";
    o.sinks.push_back(std::move(s));
  }
  for (const auto& am : f.alertmanagers) {
    SinkOptions s = Common(f, *min);
    s.kind = "alertmanager";
    auto url = Resolve(am, "--alertmanager");
    if (!url.ok()) return url.status();
    s.target = *url;
    s.generator_url = f.generator_url;
    o.sinks.push_back(std::move(s));
  }
  for (const auto& spec : f.sinks) {
    SinkOptions s = Common(f, *min);
    LOCKSTEP_RETURN_IF_ERROR(ParseSinkSpec(spec, &s));
    o.sinks.push_back(std::move(s));
  }
  if (!f.alerts_file.empty()) {
    SinkOptions s = Common(f, *min);
    s.kind = "jsonl";
    s.target = f.alerts_file;
    s.rate_per_min = 0;  // a local file keeps every alert
    o.sinks.push_back(std::move(s));
  }
  if (f.log) {
    SinkOptions s = Common(f, *min);
    s.kind = "log";
    s.rate_per_min = 0;
    o.sinks.push_back(std::move(s));
  }
  LOCKSTEP_RETURN_IF_ERROR(alerting::ValidateOptions(o));
  return o;
}

}  // namespace lockstep::cli
