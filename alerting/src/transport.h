// Transport: delivers one alert once to one sink — a log line, a line in a JSONL
// file, or one HTTP(S) POST in the sink's format — and says whether it worked and,
// if not, whether trying again can help. Retries, backoff and spooling are the
// worker's job (sink_worker.h); alert-test uses a Transport directly.
// Threads: Deliver() from one thread at a time; Abort() from any thread.
#ifndef LOCKSTEP_ALERTING_SRC_TRANSPORT_H_
#define LOCKSTEP_ALERTING_SRC_TRANSPORT_H_

#include <fstream>
#include <memory>
#include <mutex>
#include <string>

#include "http_client.h"
#include "lockstep/alerting/alert.h"
#include "lockstep/alerting/options.h"
#include "lockstep/common/status.h"
#include "url.h"

namespace lockstep::alerting {

struct AttemptResult {
  bool ok = false;
  bool retryable = false;
  std::string detail;  // "HTTP 200", "connecting to http://h:1 failed: Connection refused", ...
};

class Transport {
 public:
  // `display_name` names the sink in messages. Fails on a bad URL, CA file or path.
  static StatusOr<std::unique_ptr<Transport>> Create(const SinkOptions& sink,
                                                     const std::string& display_name);
  AttemptResult Deliver(const Alert& alert);
  void Abort() noexcept;

 private:
  Transport() = default;
  SinkOptions sink_;
  std::string name_;
  Url url_;
  std::unique_ptr<HttpClient> http_;
  std::ofstream file_;  // jsonl
};

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_SRC_TRANSPORT_H_
