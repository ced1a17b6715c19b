// HttpClient: one HTTP/1.1 POST at a time over plain TCP or TLS (Boost.Beast +
// OpenSSL), with a connect timeout (DNS + TCP connect) and a request timeout (TLS
// handshake, write, read). TLS verifies the peer against the system CA store plus an
// optional CA file, checks the host name, and sends SNI. One connection per request
// (alerts are rare; no pooled connection can go stale).
//
// Threads: Post() from one thread at a time (the sink's worker); Abort() from any
// thread, after which every Post() fails fast.
#ifndef LOCKSTEP_ALERTING_SRC_HTTP_CLIENT_H_
#define LOCKSTEP_ALERTING_SRC_HTTP_CLIENT_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>

#include "lockstep/common/status.h"
#include "url.h"

namespace lockstep::alerting {

struct HttpResponse {
  int status = 0;
  std::string body;
};

class HttpClient {
 public:
  struct Options {
    std::chrono::milliseconds connect_timeout{3000};
    std::chrono::milliseconds request_timeout{10000};
    std::string ca_file;  // PEM, trusted in addition to the system store
  };
  // Fails (one sentence) if the CA file cannot be loaded.
  static StatusOr<std::unique_ptr<HttpClient>> Create(const Options& options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // POSTs `body` to `url` (its query extended by `extra_query` when non-empty).
  // A transport failure is kUnavailable/kTimeout with a sentence; any HTTP status is
  // a response (the caller judges it). `headers` are extra "Name: value" pairs.
  StatusOr<HttpResponse> Post(const Url& url, const std::string& extra_query,
                              const std::string& body, const std::string& content_type,
                              const std::vector<std::pair<std::string, std::string>>& headers);
  void Abort() noexcept;

 private:
  explicit HttpClient(const Options& options);
  Options options_;
  boost::asio::io_context ioc_;
  boost::asio::ssl::context ssl_ctx_;
  std::atomic<bool> aborted_{false};
};

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_SRC_HTTP_CLIENT_H_
