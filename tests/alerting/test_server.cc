#include "test_server.h"

#include <cstdlib>
#include <filesystem>
#include <random>

#include <sys/socket.h>
#include <sys/time.h>

#include <utility>  // Boost 1.74 asio/awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace lockstep::alerting::testing {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct TestServer::Impl {
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  asio::ssl::context ssl{asio::ssl::context::tls_server};
};

TlsFiles MakeTestCa() {
  TlsFiles f;
  std::random_device rd;
  f.dir = (std::filesystem::temp_directory_path() / ("lockstep-ca-" + std::to_string(rd()))).string();
  std::filesystem::create_directories(f.dir);
  f.ca_cert = f.dir + "/ca.pem";
  f.server_cert = f.dir + "/server.pem";
  f.server_key = f.dir + "/server.key";
  std::string d = f.dir;
  std::string cmd =
      "cd " + d + " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
      "-keyout ca.key -out ca.pem -days 2 -subj /CN=lockstep-test-ca "
      "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign "
      ">/dev/null 2>&1 && "
      "openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key "
      "-out server.csr -subj /CN=localhost >/dev/null 2>&1 && "
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\n' > ext.cnf && "
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile ext.cnf -out server.pem >/dev/null 2>&1";
  f.ok = std::system(cmd.c_str()) == 0 && std::filesystem::exists(f.server_cert);
  return f;
}

uint16_t ClosedPort() {
  asio::io_context ioc;
  tcp::acceptor a(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  uint16_t p = a.local_endpoint().port();
  a.close();
  return p;
}

std::string HttpGet(uint16_t port, const std::string& target, int* status) {
  *status = 0;
  try {
    asio::io_context ioc;
    tcp::socket s(ioc);
    s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    http::request<http::empty_body> req{http::verb::get, target, 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::connection, "close");
    http::write(s, req);
    beast::flat_buffer buf;
    http::response<http::string_body> resp;
    http::read(s, buf, resp);
    *status = static_cast<int>(resp.result_int());
    return resp.body();
  } catch (const std::exception&) {
    return "";
  }
}

TestServer::TestServer(uint16_t port, const TlsFiles* tls) : impl_(std::make_unique<Impl>()) {
  tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), port);
  impl_->acceptor.open(ep.protocol());
  impl_->acceptor.set_option(asio::socket_base::reuse_address(true));
  impl_->acceptor.bind(ep);
  impl_->acceptor.listen();
  port_ = impl_->acceptor.local_endpoint().port();
  if (tls != nullptr) {
    tls_ = true;
    impl_->ssl.use_certificate_chain_file(tls->server_cert);
    impl_->ssl.use_private_key_file(tls->server_key, asio::ssl::context::pem);
  }
  thread_ = std::thread([this] { Loop(); });
}

TestServer::~TestServer() { Stop(); }

std::string TestServer::Url(const std::string& path) const {
  return std::string(tls_ ? "https" : "http") + "://127.0.0.1:" + std::to_string(port_) + path;
}

void TestServer::SetHandler(Handler h) {
  std::lock_guard<std::mutex> lk(mu_);
  handler_ = std::move(h);
}
void TestServer::SetDelay(std::chrono::milliseconds d) {
  std::lock_guard<std::mutex> lk(mu_);
  delay_ = d;
}
std::vector<Received> TestServer::Requests() const {
  std::lock_guard<std::mutex> lk(mu_);
  return requests_;
}
size_t TestServer::Count() const {
  std::lock_guard<std::mutex> lk(mu_);
  return requests_.size();
}
bool TestServer::WaitFor(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return requests_.size() >= n; });
}

void TestServer::Stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  // Wake a blocking accept() by connecting to ourselves.
  try {
    asio::io_context ioc;
    tcp::socket s(ioc);
    boost::system::error_code ec;
    s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_), ec);
  } catch (...) {
  }
  if (thread_.joinable()) thread_.join();
  boost::system::error_code ec;
  impl_->acceptor.close(ec);
}

void TestServer::Loop() {
  for (;;) {
    tcp::socket sock(impl_->ioc);
    boost::system::error_code ec;
    impl_->acceptor.accept(sock, ec);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) return;
    }
    if (ec) continue;
    // A client that connects and never sends must not wedge the server (or Stop()).
    struct timeval tv{10, 0};
    setsockopt(sock.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    auto serve = [&](auto& stream) {
      beast::flat_buffer buf;
      http::request<http::string_body> req;
      beast::error_code rec;
      http::read(stream, buf, req, rec);
      if (rec) return;
      Received r;
      r.method = std::string(req.method_string());
      r.target = std::string(req.target());
      r.body = req.body();
      for (const auto& f : req) {
        std::string name(f.name_string());
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        r.headers[name] = std::string(f.value());
      }
      r.at = std::chrono::steady_clock::now();
      Handler h;
      std::chrono::milliseconds delay;
      {
        std::unique_lock<std::mutex> lk(mu_);
        requests_.push_back(r);
        h = handler_;
        delay = delay_;
        cv_.notify_all();
        if (delay.count() > 0) cv_.wait_for(lk, delay, [&] { return stop_; });
        if (stop_) return;
      }
      std::string body = "ok";
      int status = h ? h(r, &body) : 200;
      http::response<http::string_body> resp{static_cast<http::status>(status), 11};
      resp.set(http::field::content_type, "application/json");
      resp.body() = body;
      resp.prepare_payload();
      http::write(stream, resp, rec);
    };
    if (tls_) {
      asio::ssl::stream<tcp::socket&> s(sock, impl_->ssl);
      s.handshake(asio::ssl::stream_base::server, ec);
      if (!ec) serve(s);
    } else {
      serve(sock);
    }
    sock.shutdown(tcp::socket::shutdown_both, ec);
    sock.close(ec);
  }
}

}  // namespace lockstep::alerting::testing
