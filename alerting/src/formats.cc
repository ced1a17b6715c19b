#include "formats.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "sink_type.h"

namespace lockstep::alerting {
namespace {

using nlohmann::json;

std::string Base64(const unsigned char* data, size_t n) {
  std::string out(4 * ((n + 2) / 3) + 1, '\0');
  int len = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), data, static_cast<int>(n));
  out.resize(len);
  return out;
}

}  // namespace

std::string DumpJson(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string FormatNumber(double v) {
  if (std::isnan(v)) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string JoinRuns(const Alert& a, const char* sep) {
  std::string s;
  for (size_t i = 0; i < a.runs.size(); ++i) s += (i ? sep : "") + a.runs[i];
  return s;
}

std::string AlertTitle(const Alert& a) {
  std::string t = "[" + std::string(SeverityName(a.severity)) + "] lockstep ";
  if (!a.notification.empty()) t += "incident " + a.notification + ": ";
  t += a.rule;
  if (!a.experiment.empty()) t += " in " + a.experiment;
  return t;
}

// Markdown lines shared by Slack (mrkdwn: *bold*), Feishu, DingTalk, WeCom (**bold**).
std::string AlertDetails(const Alert& a, const std::string& b) {
  std::string s = a.message + "\n";
  if (!a.tensor.empty())
    s += b + "tensor" + b + ": " + a.tensor + (a.kind.empty() ? "" : " (" + a.kind + ")") + "\n";
  s += b + "step" + b + ": " + std::to_string(a.step) +
       (a.micro_step ? " (micro step " + std::to_string(a.micro_step) + ")" : std::string()) + "  " + b + "rank" +
       b + ": " + std::to_string(a.rank) + "\n";
  if (!a.runs.empty()) s += b + "runs" + b + ": " + JoinRuns(a, " vs ") + "\n";
  if (!a.metric.empty())
    s += b + a.metric + b + ": " + FormatNumber(a.error) + " (threshold " +
         FormatNumber(a.threshold) + ")\n";
  if (!std::isnan(a.baseline_value) || !std::isnan(a.candidate_value))
    s += b + "baseline" + b + ": " + FormatNumber(a.baseline_value) + "  " + b + "candidate" + b +
         ": " + FormatNumber(a.candidate_value) + "\n";
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

std::string HmacSha256Base64(const std::string& key, const std::string& msg) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), md, &md_len);
  return Base64(md, md_len);
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

Payload FormatAlert(const SinkOptions& sink, const Alert& a, int64_t now_unix_ms) {
  const SinkType& type = SinkTypeOf(sink.kind);
  if (type.format) return type.format(sink, a, now_unix_ms);
  return Payload{AlertToJson(a, now_unix_ms), ""};
}

ReplyVerdict JudgeReply(const std::string& kind, int status, const std::string& body) {
  ReplyVerdict v;
  v.detail = "HTTP " + std::to_string(status);
  std::string snippet = body.substr(0, 200);
  if (status >= 200 && status < 300) {
    v.ok = true;
    if (const SinkType& type = SinkTypeOf(kind); type.judge_body) type.judge_body(body, &v);
    return v;
  }
  // 408 (timeout) and 429 (too many requests) pass with time, and so do 5xx; any
  // other 4xx (bad URL, token, payload) will fail the same way every time.
  v.retryable = status == 408 || status == 429 || status >= 500;
  if (!snippet.empty()) v.detail += ": " + snippet;
  return v;
}

void ReadBotErrorCode(const std::string& body, std::initializer_list<const char*> code_keys,
                      std::initializer_list<const char*> msg_keys, ReplyVerdict* v) {
  json j = json::parse(body, nullptr, false);
  if (!j.is_object()) return;
  auto first_present = [&](std::initializer_list<const char*> keys) {
    for (const char* k : keys)
      if (j.contains(k)) return k;
    return *(keys.end() - 1);
  };
  const char* code_key = first_present(code_keys);
  const char* msg_key = first_present(msg_keys);
  if (!j.contains(code_key) || !j[code_key].is_number_integer() || j[code_key].get<int64_t>() == 0) return;
  int64_t code = j[code_key].get<int64_t>();
  v->ok = false;
  // Frequency limits (Feishu 9499/11232/11233, DingTalk 130101, WeCom 45009,
  // WeCom -1 "system busy") pass with time; anything else is configuration.
  v->retryable = code == 9499 || code == 11232 || code == 11233 || code == 130101 ||
                 code == 45009 || code == -1;
  std::string msg = j.contains(msg_key) && j[msg_key].is_string() ? j[msg_key].get<std::string>() : "";
  v->detail += " error code " + std::to_string(code) + (msg.empty() ? "" : ": " + msg);
}

}  // namespace lockstep::alerting
