// Alerts as JSON for `lockstep compare --json`, `--alerts-file` JSON lines and the HTML
// report: the one encoder of lockstep/alerting/alert_json.h (the same fields as the
// collector's jsonl sink and webhooks), written into a JsonOut or a string.
//
// JsonlAlertFile is a small synchronous writer used by `lockstep compare`, where every
// alert must land in the file exactly once and in order (the Dispatcher's jsonl sink
// dedups with a cooldown, which is right for a live collector and wrong for a report).
// Single-threaded.
#ifndef LOCKSTEP_COLLECTOR_DETECT_ALERT_JSON_H_
#define LOCKSTEP_COLLECTOR_DETECT_ALERT_JSON_H_

#include <cstdio>
#include <string>

#include "lockstep/alerting/alert.h"
#include "lockstep/common/status.h"

namespace lockstep::collector {

class JsonOut;

void WriteAlertJson(const alerting::Alert& a, JsonOut* j);
std::string AlertToJson(const alerting::Alert& a);

class JsonlAlertFile {
 public:
  // Creates/truncates `path`; one sentence naming it on failure.
  static StatusOr<std::unique_ptr<JsonlAlertFile>> Open(const std::string& path);
  ~JsonlAlertFile();
  JsonlAlertFile(const JsonlAlertFile&) = delete;
  JsonlAlertFile& operator=(const JsonlAlertFile&) = delete;
  // Appends one line and flushes it (alerts are rare; a reader tails the file).
  bool Write(const alerting::Alert& a);

 private:
  explicit JsonlAlertFile(FILE* f) : f_(f) {}
  FILE* f_;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_DETECT_ALERT_JSON_H_
