#include "formats.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

namespace lockstep::alerting {
namespace {

using nlohmann::json;

// Detector strings may hold any bytes; never let invalid UTF-8 throw from dump().
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string Fmt(double v) {
  if (std::isnan(v)) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string Runs(const Alert& a, const char* sep) {
  std::string s;
  for (size_t i = 0; i < a.runs.size(); ++i) s += (i ? sep : "") + a.runs[i];
  return s;
}

std::string Title(const Alert& a) {
  std::string t = "[" + std::string(SeverityName(a.severity)) + "] lockstep ";
  if (!a.notification.empty()) t += "incident " + a.notification + ": ";
  t += a.rule;
  if (!a.experiment.empty()) t += " in " + a.experiment;
  return t;
}

// Markdown lines shared by Slack (mrkdwn: *bold*), Feishu, DingTalk, WeCom (**bold**).
std::string Details(const Alert& a, const std::string& b) {
  std::string s = a.message + "\n";
  if (!a.tensor.empty())
    s += b + "tensor" + b + ": " + a.tensor + (a.kind.empty() ? "" : " (" + a.kind + ")") + "\n";
  s += b + "step" + b + ": " + std::to_string(a.step) +
       (a.micro_step ? " (micro step " + std::to_string(a.micro_step) + ")" : std::string()) + "  " + b + "rank" +
       b + ": " + std::to_string(a.rank) + "\n";
  if (!a.runs.empty()) s += b + "runs" + b + ": " + Runs(a, " vs ") + "\n";
  if (!a.metric.empty())
    s += b + a.metric + b + ": " + Fmt(a.error) + " (threshold " + Fmt(a.threshold) + ")\n";
  if (!std::isnan(a.baseline_value) || !std::isnan(a.candidate_value))
    s += b + "baseline" + b + ": " + Fmt(a.baseline_value) + "  " + b + "candidate" + b + ": " +
         Fmt(a.candidate_value) + "\n";
  if (!a.notification.empty()) {
    s += b + "incident" + b + ": " + a.incident + "  (" + std::to_string(a.incident_alerts) +
         " alert(s); every one is in the alerts file)\n";
    for (const auto& f : a.facts)
      s += "- " + b + f.rule + b + " (" + SeverityName(f.severity) + ", step " + std::to_string(f.step) + "): " +
           f.message + "\n";
    return s + b + "dedup key" + b + ": " + a.DedupKey();
  }
  s += b + "dedup key" + b + ": " + a.DedupKey();
  if (a.repeat_count > 1) s += "  (seen " + std::to_string(a.repeat_count) + " times)";
  return s;
}

std::string Base64(const unsigned char* data, size_t n) {
  std::string out(4 * ((n + 2) / 3) + 1, '\0');
  int len = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), data, static_cast<int>(n));
  out.resize(len);
  return out;
}

std::string HmacSha256Base64(const std::string& key, const std::string& msg) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), md, &md_len);
  return Base64(md, md_len);
}

std::string CamelRule(const std::string& rule) {
  std::string out = "Lockstep";
  bool up = true;
  for (char c : rule) {
    if (c == '_' || c == '-' || c == ' ') { up = true; continue; }
    out += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    up = false;
  }
  return out;
}

}  // namespace

std::string UrlEncode(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// Feishu: key = "<timestamp>\n<secret>", message empty, base64 of the HMAC-SHA256.
std::string FeishuSign(int64_t timestamp_s, const std::string& secret) {
  return HmacSha256Base64(std::to_string(timestamp_s) + "\n" + secret, "");
}

// DingTalk: key = secret, message = "<timestamp_ms>\n<secret>".
std::string DingTalkSign(int64_t timestamp_ms, const std::string& secret) {
  return HmacSha256Base64(secret, std::to_string(timestamp_ms) + "\n" + secret);
}

StatusOr<Alert> AlertFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("rule"))
    return Status::Corruption("spooled alert is not a JSON alert object");
  Alert a;
  try {
    auto str = [&](const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : ""; };
    auto num = [&](const char* k) {
      return j.contains(k) && j[k].is_number() ? j[k].get<double>() : std::nan("");
    };
    a.id = str("id");
    a.rule = str("rule");
    auto sev = ParseSeverity(str("severity"));
    a.severity = sev.ok() ? *sev : Severity::kWarning;
    a.experiment = str("experiment");
    if (j.contains("runs") && j["runs"].is_array())
      for (const auto& r : j["runs"])
        if (r.is_string()) a.runs.push_back(r.get<std::string>());
    a.step = j.value("step", uint64_t{0});
    a.rank = j.value("rank", uint32_t{0});
    a.micro_step = j.value("micro_step", uint32_t{0});
    a.tensor = str("tensor");
    a.kind = str("kind");
    a.baseline_value = num("baseline_value");
    a.candidate_value = num("candidate_value");
    a.metric = str("metric");
    a.error = num("error");
    a.threshold = num("threshold");
    a.first_seen_unix_ns = j.value("first_seen_unix_ns", int64_t{0});
    a.repeat_count = j.value("repeat_count", uint64_t{1});
    a.message = str("message");
    a.incident = str("incident");
    a.cause = str("cause");
    a.notification = str("notification");
    a.incident_alerts = j.value("incident_alerts", uint64_t{0});
    if (j.contains("facts") && j["facts"].is_array()) {
      for (const auto& fj : j["facts"]) {
        if (!fj.is_object()) continue;
        IncidentFact f;
        auto fs = [&](const char* k) { return fj.contains(k) && fj[k].is_string() ? fj[k].get<std::string>() : ""; };
        f.rule = fs("rule");
        auto fsev = ParseSeverity(fs("severity"));
        f.severity = fsev.ok() ? *fsev : Severity::kWarning;
        f.step = fj.value("step", uint64_t{0});
        f.run = fs("run");
        f.tensor = fs("tensor");
        f.kind = fs("kind");
        f.message = fs("message");
        a.facts.push_back(std::move(f));
      }
    }
  } catch (const std::exception& e) {
    return Status::Corruption(std::string("spooled alert has a field of the wrong type: ") + e.what());
  }
  return a;
}

std::string AlertToLogLine(const Alert& a) {
  std::string s = Title(a) + ": " + a.message;
  if (!a.incident.empty()) s += " incident=" + a.incident;
  if (!a.tensor.empty()) s += " tensor=" + a.tensor;
  if (!a.kind.empty()) s += " kind=" + a.kind;
  s += " step=" + std::to_string(a.step) + " rank=" + std::to_string(a.rank);
  if (a.micro_step) s += " micro_step=" + std::to_string(a.micro_step);
  if (!a.runs.empty()) s += " runs=" + Runs(a, ",");
  if (!a.metric.empty()) s += " " + a.metric + "=" + Fmt(a.error) + " threshold=" + Fmt(a.threshold);
  if (a.repeat_count > 1) s += " repeat=" + std::to_string(a.repeat_count);
  return s;
}

Payload FormatAlert(const SinkOptions& sink, const Alert& a, int64_t now_unix_ms) {
  Payload p;
  switch (sink.kind) {
    case SinkKind::kLog:
    case SinkKind::kJsonl:
    case SinkKind::kWebhook:
      p.body = AlertToJson(a, now_unix_ms);
      break;
    case SinkKind::kSlack: {
      json blocks = json::array();
      blocks.push_back({{"type", "header"}, {"text", {{"type", "plain_text"}, {"text", Title(a)}}}});
      blocks.push_back({{"type", "section"}, {"text", {{"type", "mrkdwn"}, {"text", Details(a, "*")}}}});
      p.body = Dump({{"text", Title(a) + ": " + a.message}, {"blocks", blocks}});
      break;
    }
    case SinkKind::kFeishu: {
      json j;
      if (sink.feishu_text) {
        j = {{"msg_type", "text"}, {"content", {{"text", Title(a) + "\n" + Details(a, "")}}}};
      } else {
        const char* color = a.severity == Severity::kCritical ? "red"
                            : a.severity == Severity::kWarning ? "orange" : "blue";
        j = {{"msg_type", "interactive"},
             {"card",
              {{"config", {{"wide_screen_mode", true}}},
               {"header", {{"title", {{"tag", "plain_text"}, {"content", Title(a)}}}, {"template", color}}},
               {"elements", json::array({{{"tag", "div"},
                                          {"text", {{"tag", "lark_md"}, {"content", Details(a, "**")}}}}})}}}};
      }
      if (!sink.secret.empty()) {
        int64_t ts = now_unix_ms / 1000;
        j["timestamp"] = std::to_string(ts);
        j["sign"] = FeishuSign(ts, sink.secret);
      }
      p.body = Dump(j);
      break;
    }
    case SinkKind::kDingTalk: {
      p.body = Dump({{"msgtype", "markdown"},
                     {"markdown", {{"title", Title(a)}, {"text", "### " + Title(a) + "\n\n" + Details(a, "**")}}}});
      if (!sink.secret.empty()) {
        p.query_suffix = "timestamp=" + std::to_string(now_unix_ms) +
                         "&sign=" + UrlEncode(DingTalkSign(now_unix_ms, sink.secret));
      }
      break;
    }
    case SinkKind::kWeCom: {
      const char* color = a.severity == Severity::kCritical ? "warning"
                          : a.severity == Severity::kWarning ? "comment" : "info";
      std::string content = "### <font color=\"" + std::string(color) + "\">" + Title(a) +
                            "</font>\n" + Details(a, "**");
      p.body = Dump({{"msgtype", "markdown"}, {"markdown", {{"content", content}}}});
      break;
    }
    case SinkKind::kAlertmanager: {
      json labels = {{"alertname", CamelRule(a.rule)},
                     {"severity", SeverityName(a.severity)},
                     {"rule", a.rule},
                     {"source", "lockstep"}};
      // Alertmanager treats an empty label as absent; leave those out.
      auto put = [&](const char* k, const std::string& v) { if (!v.empty()) labels[k] = v; };
      put("experiment", a.experiment);
      put("run", Runs(a, ","));
      if (a.notification.empty()) {
        put("tensor", a.tensor);
        put("kind", a.kind);
        // The rank is part of the finding's identity (the dedup key): two ranks are two
        // Alertmanager alerts, not one overwriting the other.
        labels["rank"] = std::to_string(a.rank);
      } else {
        // One incident is one Alertmanager alert: its labels stay the same from opened
        // to resolved (the tensor of each message is in the annotations).
        labels["alertname"] = "LockstepIncident";
        labels.erase("rule");
      }
      // Alertmanager groups by labels: the incident key makes one cause one group.
      put("incident", a.incident);
      json annotations = {{"summary", a.message.empty() ? Title(a) : a.message},
                          {"description", Details(a, "")},
                          {"step", std::to_string(a.step)},
                          {"rank", std::to_string(a.rank)},
                          {"micro_step", std::to_string(a.micro_step)},
                          {"dedup_key", a.DedupKey()},
                          {"repeat_count", std::to_string(a.repeat_count)}};
      if (!a.metric.empty()) annotations["metric"] = a.metric + "=" + Fmt(a.error);
      if (!a.notification.empty()) {
        annotations["notification"] = a.notification;
        annotations["rule"] = a.rule;
        if (!a.tensor.empty()) annotations["tensor"] = a.tensor;
      }
      int64_t first = a.first_seen_unix_ns ? a.first_seen_unix_ns : now_unix_ms * 1000000;
      json one = {{"labels", labels}, {"annotations", annotations}, {"startsAt", Rfc3339(first)}};
      if (!sink.generator_url.empty()) one["generatorURL"] = sink.generator_url;
      if (a.notification == "resolved") one["endsAt"] = Rfc3339(now_unix_ms * 1000000);
      p.body = Dump(json::array({one}));
      break;
    }
  }
  return p;
}

ReplyVerdict JudgeReply(SinkKind kind, int status, const std::string& body) {
  ReplyVerdict v;
  v.detail = "HTTP " + std::to_string(status);
  std::string snippet = body.substr(0, 200);
  if (status >= 200 && status < 300) {
    v.ok = true;
    if (kind == SinkKind::kFeishu || kind == SinkKind::kDingTalk || kind == SinkKind::kWeCom) {
      nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
      if (j.is_object()) {
        const char* code_key = kind == SinkKind::kFeishu ? (j.contains("code") ? "code" : "StatusCode")
                                                         : "errcode";
        const char* msg_key = kind == SinkKind::kFeishu ? (j.contains("msg") ? "msg" : "StatusMessage")
                                                        : "errmsg";
        if (j.contains(code_key) && j[code_key].is_number_integer() && j[code_key].get<int64_t>() != 0) {
          int64_t code = j[code_key].get<int64_t>();
          v.ok = false;
          // Frequency limits (Feishu 9499/11232/11233, DingTalk 130101, WeCom 45009,
          // WeCom -1 "system busy") pass with time; anything else is configuration.
          v.retryable = code == 9499 || code == 11232 || code == 11233 || code == 130101 ||
                        code == 45009 || code == -1;
          std::string msg = j.contains(msg_key) && j[msg_key].is_string() ? j[msg_key].get<std::string>() : "";
          v.detail += " error code " + std::to_string(code) + (msg.empty() ? "" : ": " + msg);
        }
      }
    }
    return v;
  }
  // 408 (timeout) and 429 (too many requests) pass with time, and so do 5xx; any
  // other 4xx (bad URL, token, payload) will fail the same way every time.
  v.retryable = status == 408 || status == 429 || status >= 500;
  if (!snippet.empty()) v.detail += ": " + snippet;
  return v;
}

}  // namespace lockstep::alerting
