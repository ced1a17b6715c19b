// AlertToJson (lockstep/alerting/alert_json.h): the one JSON encoding of an alert.
#include "lockstep/alerting/alert_json.h"

#include <cmath>
#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

#include "formats.h"

namespace lockstep::alerting {
namespace {

using nlohmann::json;

json Num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json FactsJson(const Alert& a) {
  json facts = json::array();
  for (const auto& f : a.facts)
    facts.push_back({{"rule", f.rule},
                     {"severity", SeverityName(f.severity)},
                     {"step", f.step},
                     {"run", f.run},
                     {"tensor", f.tensor},
                     {"kind", f.kind},
                     {"message", f.message}});
  return facts;
}

}  // namespace

std::string Rfc3339(int64_t unix_ns) {
  time_t secs = static_cast<time_t>(unix_ns / 1000000000);
  int ms = static_cast<int>((unix_ns / 1000000) % 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

std::string AlertToJson(const Alert& a, int64_t now_unix_ms) {
  int64_t first = a.first_seen_unix_ns ? a.first_seen_unix_ns : now_unix_ms * 1000000;
  json j = {
      {"source", "lockstep"},
      {"id", a.id},
      {"rule", a.rule},
      {"severity", SeverityName(a.severity)},
      {"experiment", a.experiment},
      {"runs", a.runs},
      {"run", a.runs.empty() ? std::string() : a.runs.back()},
      {"step", a.step},
      {"rank", a.rank},
      {"micro_step", a.micro_step},
      {"tensor", a.tensor},
      {"kind", a.kind},
      {"baseline_value", Num(a.baseline_value)},
      {"candidate_value", Num(a.candidate_value)},
      {"metric", a.metric},
      {"error", Num(a.error)},
      {"threshold", Num(a.threshold)},
      {"first_seen", Rfc3339(first)},
      {"first_seen_unix_ns", first},
      {"repeat_count", a.repeat_count},
      {"message", a.message},
      {"dedup_key", a.DedupKey()},
      {"incident", a.incident},
  };
  if (!a.cause.empty()) j["cause"] = a.cause;
  if (!a.notification.empty()) {
    j["notification"] = a.notification;
    j["incident_alerts"] = a.incident_alerts;
    j["facts"] = FactsJson(a);
  }
  // Detector strings may hold any bytes; never let invalid UTF-8 throw from dump().
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace lockstep::alerting
