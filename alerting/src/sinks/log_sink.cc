// The log sink: one spdlog line per alert, at the level of its severity
// (docs/alerting.md "Sinks and message formats"). Local: it cannot fail, never spools.
#include <spdlog/spdlog.h>

#include "sink_type.h"

namespace lockstep::alerting {
namespace {

// One human line: the title, the message, then key=value pairs.
std::string AlertToLogLine(const Alert& a) {
  std::string s = AlertTitle(a) + ": " + a.message;
  if (!a.incident.empty()) s += " incident=" + a.incident;
  if (!a.tensor.empty()) s += " tensor=" + a.tensor;
  if (!a.kind.empty()) s += " kind=" + a.kind;
  s += " step=" + std::to_string(a.step) + " rank=" + std::to_string(a.rank);
  if (a.micro_step) s += " micro_step=" + std::to_string(a.micro_step);
  if (!a.runs.empty()) s += " runs=" + JoinRuns(a, ",");
  if (!a.metric.empty())
    s += " " + a.metric + "=" + FormatNumber(a.error) + " threshold=" + FormatNumber(a.threshold);
  if (a.repeat_count > 1) s += " repeat=" + std::to_string(a.repeat_count);
  return s;
}

class LogTransport final : public Transport {
 public:
  AttemptResult Deliver(const Alert& alert) override {
    auto level = alert.severity == Severity::kCritical  ? spdlog::level::err
                 : alert.severity == Severity::kWarning ? spdlog::level::warn
                                                        : spdlog::level::info;
    spdlog::log(level, "alert: {}", AlertToLogLine(alert));
    AttemptResult r;
    r.ok = true;
    r.detail = "logged";
    return r;
  }
};

StatusOr<std::unique_ptr<Transport>> Open(const SinkOptions&, const std::string&) {
  return std::unique_ptr<Transport>(new LogTransport());
}

}  // namespace

extern const SinkType kLogSink{.name = "log", .open = Open};

}  // namespace lockstep::alerting
