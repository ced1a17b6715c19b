// Prometheus Alertmanager v2: POST <base>/api/v2/alerts with a one-alert array. A
// finding is one Alertmanager alert (its labels name it, the rank included); an
// incident is one alert from opened to resolved (its labels stay; a resolution sends
// endsAt). docs/alerting.md "Incidents" and "Sinks and message formats".
#include <cctype>
#include <nlohmann/json.hpp>

#include "sink_type.h"

namespace lockstep::alerting {
namespace {

using nlohmann::json;

// "nan_or_inf" -> "LockstepNanOrInf": the alertname.
std::string CamelRule(const std::string& rule) {
  std::string out = "Lockstep";
  bool up = true;
  for (char c : rule) {
    if (c == '_' || c == '-' || c == ' ') {
      up = true;
      continue;
    }
    out += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    up = false;
  }
  return out;
}

Payload Format(const SinkOptions& sink, const Alert& a, int64_t now_unix_ms) {
  json labels = {{"alertname", CamelRule(a.rule)},
                 {"severity", SeverityName(a.severity)},
                 {"rule", a.rule},
                 {"source", "lockstep"}};
  // Alertmanager treats an empty label as absent; leave those out.
  auto put = [&](const char* k, const std::string& v) {
    if (!v.empty()) labels[k] = v;
  };
  put("experiment", a.experiment);
  put("run", JoinRuns(a, ","));
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
  json annotations = {{"summary", a.message.empty() ? AlertTitle(a) : a.message},
                      {"description", AlertDetails(a, "")},
                      {"step", std::to_string(a.step)},
                      {"rank", std::to_string(a.rank)},
                      {"micro_step", std::to_string(a.micro_step)},
                      {"dedup_key", a.DedupKey()},
                      {"repeat_count", std::to_string(a.repeat_count)}};
  if (!a.metric.empty()) annotations["metric"] = a.metric + "=" + FormatNumber(a.error);
  if (!a.notification.empty()) {
    annotations["notification"] = a.notification;
    annotations["rule"] = a.rule;
    if (!a.tensor.empty()) annotations["tensor"] = a.tensor;
  }
  int64_t first = a.first_seen_unix_ns ? a.first_seen_unix_ns : now_unix_ms * 1000000;
  json one = {{"labels", labels}, {"annotations", annotations}, {"startsAt", Rfc3339(first)}};
  if (!sink.generator_url.empty()) one["generatorURL"] = sink.generator_url;
  if (a.notification == "resolved") one["endsAt"] = Rfc3339(now_unix_ms * 1000000);
  return Payload{DumpJson(json::array({one})), ""};
}

// Accepts the base URL (http://am:9093) as well as the full API path.
std::string RequestTarget(const std::string& target) {
  size_t q = target.find('?');
  std::string path = target.substr(0, q), query = q == std::string::npos ? "" : target.substr(q);
  if (path.size() >= 14 && path.compare(path.size() - 14, 14, "/api/v2/alerts") == 0) return target;
  while (!path.empty() && path.back() == '/') path.pop_back();
  return path + "/api/v2/alerts" + query;
}

}  // namespace

extern const SinkType kAlertmanagerSink{
    .name = "alertmanager",
    .http = true,
    .bearer_token = true,
    .webhook_format = false,  // its own flag, --alertmanager, takes a base URL
    .format = Format,
    .request_target = RequestTarget};

}  // namespace lockstep::alerting
