// MetricsServer: a small HTTP/1.1 server for Prometheus scrapes (Boost.Beast), one
// thread, asynchronous, so a slow or stuck client never holds up another one.
//
//   GET /metrics  -> 200, Content-Type text/plain; version=0.0.4, body = render()
//   GET /         -> 200, one line pointing at /metrics (or handlers.page's answer)
//   other GETs    -> handlers.page's answer, when given
//   POST          -> (but to /metrics and /) handlers.action's answer, when given, and only from a loopback
//                    peer (403 otherwise): a POST acts on the training jobs (a zoom),
//                    so it is taken from this machine alone, whatever address the
//                    server listens on
//   anything else -> 404 (405 for a method other than GET/HEAD on a known path)
//
// Connections are kept alive (Prometheus reuses them) and closed after 10 s without
// a complete request; requests larger than 8 KiB are refused. An exception from
// render() becomes a 500 and is counted; nothing escapes the thread.
//
// Threads: Start/Shutdown/destructor from the owner; render() and tick() run on the
// server's thread only (so they need no lock between them); address(), requests(),
// errors() from any thread.
#ifndef LOCKSTEP_COLLECTOR_METRICS_HTTP_SERVER_H_
#define LOCKSTEP_COLLECTOR_METRICS_HTTP_SERVER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "lockstep/common/status.h"

namespace lockstep::collector::metrics {

struct MetricsServerHandlers {
  std::function<std::string()> render;  // the /metrics body; required
  std::function<void()> tick;           // optional, every tick_period on the server thread
  std::chrono::milliseconds tick_period{1000};
  // Optional: any other GET path (`target` with its query), e.g. the live report
  // (report/live_report.h). True: 200 with `body` of `content_type`; false: 404.
  std::function<bool(std::string_view target, std::string* content_type, std::string* body)> page;
  // Optional: POST `target` (with its query) from a loopback peer; returns the HTTP
  // status (200, or 4xx with `reply` one line saying why), `reply` a text/plain body.
  std::function<int(std::string_view target, std::string* reply)> action;
};

class MetricsServer {
 public:
  // `listen` is "HOST:PORT" ("127.0.0.1:9464", "[::1]:0", "localhost:9464"); port 0
  // picks a free port (read address()). A non-loopback address is allowed with a
  // warning. InvalidArgument for a malformed address, Unavailable when it cannot bind;
  // each one sentence naming --metrics-listen.
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                        MetricsServerHandlers handlers);
  ~MetricsServer();  // Shutdown()
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Stops accepting, drops open connections, joins the thread. Idempotent.
  void Shutdown();

  // The bound address with its real port, e.g. "127.0.0.1:41234" or "[::1]:9464".
  const std::string& address() const;
  uint64_t requests() const;  // complete requests answered
  uint64_t errors() const;    // render() failures and I/O errors on the server thread

  class Impl;

 private:
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::collector::metrics

#endif  // LOCKSTEP_COLLECTOR_METRICS_HTTP_SERVER_H_
