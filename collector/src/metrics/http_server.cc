#include "metrics/http_server.h"

#include <exception>
#include <optional>
#include <thread>
#include <utility>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

#include "lockstep/common/thread_name.h"

namespace lockstep::collector::metrics {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr auto kIdleTimeout = std::chrono::seconds(10);
constexpr size_t kMaxRequestBytes = 8 << 10;
constexpr char kExpositionType[] = "text/plain; version=0.0.4; charset=utf-8";

Status BadAddress(const std::string& listen) {
  return Status::InvalidArgument("--metrics-listen '" + listen +
                                 "' is not HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464, or 'off')");
}

// "HOST:PORT" or "[V6]:PORT" -> endpoint. "localhost" means 127.0.0.1 (no resolver:
// a scrape target should not depend on /etc/hosts); other names are resolved once.
StatusOr<tcp::endpoint> ParseListen(const std::string& listen, asio::io_context& io) {
  std::string host, port;
  if (!listen.empty() && listen.front() == '[') {
    auto close = listen.find(']');
    if (close == std::string::npos || close + 1 >= listen.size() || listen[close + 1] != ':') return BadAddress(listen);
    host = listen.substr(1, close - 1);
    port = listen.substr(close + 2);
  } else {
    auto colon = listen.rfind(':');
    if (colon == std::string::npos || listen.find(':') != colon) return BadAddress(listen);
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
  }
  if (host.empty() || port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return BadAddress(listen);
  unsigned long p = std::stoul(port);
  if (p > 65535) return BadAddress(listen);
  if (host == "localhost") host = "127.0.0.1";
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (!ec) return tcp::endpoint(addr, static_cast<uint16_t>(p));
  tcp::resolver resolver(io);
  auto results = resolver.resolve(host, port, ec);
  if (ec || results.empty())
    return Status::InvalidArgument("--metrics-listen '" + listen + "': cannot resolve host '" + host +
                                   "' (use an IP address such as 127.0.0.1)");
  return results.begin()->endpoint();
}

std::string FormatEndpoint(const tcp::endpoint& ep) {
  auto a = ep.address();
  std::string host = a.is_v6() ? "[" + a.to_string() + "]" : a.to_string();
  return host + ":" + std::to_string(ep.port());
}

}  // namespace

class MetricsServer::Impl {
 public:
  Impl(MetricsServerHandlers h) : handlers_(std::move(h)), acceptor_(io_), timer_(io_) {}

  Status Bind(const std::string& listen) {
    auto ep = ParseListen(listen, io_);
    if (!ep.ok()) return ep.status();
    boost::system::error_code ec;
    acceptor_.open(ep->protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(*ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
      return Status::Unavailable("--metrics-listen " + listen + ": cannot listen (" + ec.message() +
                                 "); pick another port, or 'off' to serve no /metrics");
    address_ = FormatEndpoint(acceptor_.local_endpoint());
    if (!ep->address().is_loopback())
      spdlog::warn("/metrics listens on {}, reachable from other hosts: it shows run and experiment names; "
                   "bind 127.0.0.1 unless a firewall restricts who can scrape",
                   address_);
    return Status::OK();
  }

  void Run() {
    Accept();
    if (handlers_.tick) ArmTimer();
    thread_ = std::thread([this] {
      SetCurrentThreadName("ls-metrics");
      Loop();
    });
  }

  void Shutdown() {
    if (!thread_.joinable()) return;
    io_.stop();  // pending handlers (and the sessions they own) die with io_
    thread_.join();
  }

  // The session needs these.
  std::string Respond(const http::request<http::string_body>& req, bool loopback_peer,
                      http::status* status, std::string* content_type) {
    std::string_view target(req.target().data(), req.target().size());
    const std::string_view full_target = target;
    target = target.substr(0, target.find('?'));
    const bool get = req.method() == http::verb::get || req.method() == http::verb::head;
    *content_type = "text/plain; charset=utf-8";
    if (req.method() == http::verb::post && handlers_.action && target != "/metrics" && target != "/") {
      if (!loopback_peer) {
        *status = http::status::forbidden;
        return "this collector takes actions (POST) only from its own machine\n";
      }
      try {
        std::string reply;
        *status = static_cast<http::status>(handlers_.action(full_target, &reply));
        if (reply.empty() || reply.back() != '\n') reply += '\n';
        return reply;
      } catch (const std::exception& e) {
        errors_.fetch_add(1, std::memory_order_relaxed);
        *status = http::status::internal_server_error;
        return std::string("the action failed: ") + e.what() + "\n";
      }
    }
    if (handlers_.page && get && target != "/metrics") {
      try {
        std::string body;
        if (handlers_.page(full_target, content_type, &body)) {
          *status = http::status::ok;
          return body;
        }
        *content_type = "text/plain; charset=utf-8";
      } catch (const std::exception& e) {
        errors_.fetch_add(1, std::memory_order_relaxed);
        *status = http::status::internal_server_error;
        *content_type = "text/plain; charset=utf-8";
        return std::string("rendering the page failed: ") + e.what() + "\n";
      }
    }
    if (target == "/metrics" || target == "/") {
      if (!get) {
        *status = http::status::method_not_allowed;
        return "only GET and HEAD are served here\n";
      }
      *status = http::status::ok;
      if (target == "/") return "lockstep collector: Prometheus metrics are at /metrics\n";
      try {
        std::string body = handlers_.render();
        *content_type = kExpositionType;
        return body;
      } catch (const std::exception& e) {
        errors_.fetch_add(1, std::memory_order_relaxed);
        *status = http::status::internal_server_error;
        return std::string("rendering the metrics failed: ") + e.what() + "\n";
      }
    }
    *status = http::status::not_found;
    return "not found: this server serves /metrics\n";
  }

  std::atomic<uint64_t> requests_{0}, errors_{0};
  std::string address_;

 private:
  void Accept();
  void ArmTimer() {
    timer_.expires_after(handlers_.tick_period);
    timer_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      try {
        handlers_.tick();
      } catch (const std::exception& e) {
        if (errors_.fetch_add(1, std::memory_order_relaxed) == 0) spdlog::error("metrics tick: {}", e.what());
      }
      ArmTimer();
    });
  }

  // One try/catch around the loop: an exception from a handler is counted and the
  // loop goes on; the thread ends only when io_ is stopped.
  void Loop() {
    while (!io_.stopped()) {
      try {
        io_.run();
      } catch (const std::exception& e) {
        if (errors_.fetch_add(1, std::memory_order_relaxed) == 0) spdlog::error("metrics server: {}", e.what());
      }
    }
  }

  MetricsServerHandlers handlers_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer timer_;
  std::thread thread_;
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, MetricsServer::Impl* server) : stream_(std::move(socket)), server_(server) {}

  void Read() {
    parser_.emplace();
    parser_->header_limit(kMaxRequestBytes);
    parser_->body_limit(kMaxRequestBytes);
    stream_.expires_after(kIdleTimeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec) {
      // end_of_stream / timeout / reset: the client went away. Anything else (an
      // oversized or malformed request) gets no answer either: close.
      Close();
      return;
    }
    auto req = parser_->release();
    http::status status;
    std::string type;
    std::string body = server_->Respond(req, LoopbackPeer(), &status, &type);
    res_.emplace(status, req.version());
    res_->set(http::field::server, "lockstep");
    res_->set(http::field::content_type, type);
    res_->keep_alive(req.keep_alive());
    if (req.method() == http::verb::head) {
      res_->content_length(body.size());
    } else {
      res_->body() = std::move(body);
      res_->prepare_payload();
    }
    server_->requests_.fetch_add(1, std::memory_order_relaxed);
    http::async_write(stream_, *res_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec || !self->res_->keep_alive()) {
        self->Close();
        return;
      }
      self->Read();
    });
  }

  // Whether the client connects from this machine (127.0.0.0/8, ::1, or an IPv4
  // loopback address mapped into IPv6).
  bool LoopbackPeer() {
    boost::system::error_code ec;
    auto peer = stream_.socket().remote_endpoint(ec);
    if (ec) return false;
    auto a = peer.address();
    if (a.is_v6() && a.to_v6().is_v4_mapped())
      return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6()).is_loopback();
    return a.is_loopback();
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  MetricsServer::Impl* server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::string_body>> res_;
};

}  // namespace

void MetricsServer::Impl::Accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      std::make_shared<Session>(std::move(socket), this)->Read();
    } else {
      errors_.fetch_add(1, std::memory_order_relaxed);  // e.g. EMFILE; keep accepting
    }
    Accept();
  });
}

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                               MetricsServerHandlers handlers) {
  if (!handlers.render) return Status::InvalidArgument("MetricsServer needs a render function");
  auto impl = std::make_unique<Impl>(std::move(handlers));
  Status s = impl->Bind(listen);
  if (!s.ok()) return s;
  impl->Run();
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() { Shutdown(); }
void MetricsServer::Shutdown() { impl_->Shutdown(); }
const std::string& MetricsServer::address() const { return impl_->address_; }
uint64_t MetricsServer::requests() const { return impl_->requests_.load(std::memory_order_relaxed); }
uint64_t MetricsServer::errors() const { return impl_->errors_.load(std::memory_order_relaxed); }

}  // namespace lockstep::collector::metrics
