#include "detect/alert_json.h"

#include <memory>

#include "lockstep/alerting/alert_json.h"
#include "lockstep/common/json_out.h"

namespace lockstep::collector {

// One encoder for every file of alerts (lockstep/alerting/alert_json.h); 0 for "now":
// offline output does not depend on the clock.
void WriteAlertJson(const alerting::Alert& a, JsonOut* j) { j->Raw(alerting::AlertToJson(a, 0)); }

std::string AlertToJson(const alerting::Alert& a) { return alerting::AlertToJson(a, 0); }

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
