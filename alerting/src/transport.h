// Transport: delivers one alert once to one sink — a log line, a line in a JSONL
// file, or one HTTP(S) POST in the sink's format — and says whether it worked and,
// if not, whether trying again can help. Retries, backoff and spooling are the
// worker's job (sink_worker.h); alert-test uses a Transport directly.
// Each local kind has its own (sinks/log_sink.cc, sinks/jsonl_sink.cc); every HTTP kind
// shares one (transport.cc), which POSTs the kind's payload (sink_type.h).
// Threads: Deliver() from one thread at a time; Abort() from any thread.
#ifndef LOCKSTEP_ALERTING_SRC_TRANSPORT_H_
#define LOCKSTEP_ALERTING_SRC_TRANSPORT_H_

#include <memory>
#include <string>

#include "lockstep/alerting/alert.h"
#include "lockstep/alerting/options.h"
#include "lockstep/common/status.h"

namespace lockstep::alerting {

struct AttemptResult {
  bool ok = false;
  bool retryable = false;
  std::string detail;  // "HTTP 200", "connecting to http://h:1 failed: Connection refused", ...
};

class Transport {
 public:
  // The transport of `sink`'s kind; `display_name` names the sink in messages. Fails on
  // a bad URL, CA file or path.
  static StatusOr<std::unique_ptr<Transport>> Create(const SinkOptions& sink,
                                                     const std::string& display_name);
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  virtual AttemptResult Deliver(const Alert& alert) = 0;
  // Ends a request in flight (HTTP); a local transport has none.
  virtual void Abort() noexcept {}

 protected:
  Transport() = default;
};

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_SRC_TRANSPORT_H_
