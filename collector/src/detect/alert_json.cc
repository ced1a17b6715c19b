#include "detect/alert_json.h"

#include <memory>

#include "lockstep/common/json_out.h"

namespace lockstep::collector {

void WriteAlertJson(const alerting::Alert& a, JsonOut* j) {
  j->BeginObject();
  j->Key("id").Str(a.id);
  j->Key("rule").Str(a.rule);
  j->Key("severity").Str(alerting::SeverityName(a.severity));
  j->Key("experiment").Str(a.experiment);
  j->Key("runs").BeginArray();
  for (const auto& r : a.runs) j->Str(r);
  j->EndArray();
  j->Key("run").Str(a.runs.empty() ? "" : a.runs.back());
  j->Key("step").Uint(a.step);
  j->Key("rank").Uint(a.rank);
  j->Key("tensor").Str(a.tensor);
  j->Key("kind").Str(a.kind);
  j->Key("baseline_value").Double(a.baseline_value);
  j->Key("candidate_value").Double(a.candidate_value);
  j->Key("metric").Str(a.metric);
  j->Key("error").Double(a.error);
  j->Key("threshold").Double(a.threshold);
  j->Key("first_seen_unix_ns").Int(a.first_seen_unix_ns);
  j->Key("repeat_count").Uint(a.repeat_count);
  j->Key("message").Str(a.message);
  j->Key("incident").Str(a.incident);
  if (!a.cause.empty()) j->Key("cause").Str(a.cause);
  j->EndObject();
}

std::string AlertToJson(const alerting::Alert& a) {
  std::string s;
  JsonOut j(&s);
  WriteAlertJson(a, &j);
  return s;
}

StatusOr<std::unique_ptr<JsonlAlertFile>> JsonlAlertFile::Open(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return Status::InvalidArgument("cannot write the alerts file '" + path +
                                   "'; check that its directory exists and is writable");
  }
  return std::unique_ptr<JsonlAlertFile>(new JsonlAlertFile(f));
}

JsonlAlertFile::~JsonlAlertFile() {
  if (f_) std::fclose(f_);
}

bool JsonlAlertFile::Write(const alerting::Alert& a) {
  std::string line = AlertToJson(a);
  line.push_back('\n');
  const bool ok = std::fwrite(line.data(), 1, line.size(), f_) == line.size();
  return std::fflush(f_) == 0 && ok;
}

}  // namespace lockstep::collector
