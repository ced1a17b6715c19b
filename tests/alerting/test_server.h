// TestServer: a small HTTP or HTTPS receiver on 127.0.0.1:<ephemeral> for the
// alerting tests and bench. One connection at a time on its own thread; records
// every request; answers with a handler's status/body after an optional delay
// (interruptible, so Stop() is prompt even when the delay is 5 s).
// Also: MakeTestCa() writes a throwaway CA and a localhost server certificate.
#ifndef LOCKSTEP_TESTS_ALERTING_TEST_SERVER_H_
#define LOCKSTEP_TESTS_ALERTING_TEST_SERVER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace lockstep::alerting::testing {

struct Received {
  std::string method, target, body;
  std::map<std::string, std::string> headers;  // lower-case names
  std::chrono::steady_clock::time_point at;
};

struct TlsFiles {
  std::string dir, ca_cert, server_cert, server_key;
  bool ok = false;
};
// Generates with the openssl CLI into a fresh temp dir: CA + cert for
// localhost/127.0.0.1 signed by it. ok=false if openssl failed.
TlsFiles MakeTestCa();

class TestServer {
 public:
  // Returns the HTTP status; may fill *body.
  using Handler = std::function<int(const Received&, std::string* body)>;
  // port 0 = ephemeral. tls: cert/key PEM files.
  explicit TestServer(uint16_t port = 0, const TlsFiles* tls = nullptr);
  ~TestServer();
  TestServer(const TestServer&) = delete;
  TestServer& operator=(const TestServer&) = delete;

  uint16_t port() const { return port_; }
  std::string Url(const std::string& path = "/hook") const;
  void SetHandler(Handler h);
  void SetDelay(std::chrono::milliseconds d);
  std::vector<Received> Requests() const;
  size_t Count() const;
  // Waits (condition variable, no sleep) until at least n requests were received.
  bool WaitFor(size_t n, std::chrono::milliseconds timeout) const;
  void Stop();

 private:
  void Loop();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
  bool tls_ = false;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<Received> requests_;
  Handler handler_;
  std::chrono::milliseconds delay_{0};
  bool stop_ = false;
  std::thread thread_;
};

// GET http://127.0.0.1:<port><target>; returns the body, sets *status (0 = no answer).
std::string HttpGet(uint16_t port, const std::string& target, int* status);

// A port nothing listens on (bound then released): "connection refused".
uint16_t ClosedPort();

}  // namespace lockstep::alerting::testing

#endif  // LOCKSTEP_TESTS_ALERTING_TEST_SERVER_H_
