#include "http_client.h"

#include <openssl/ssl.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

namespace lockstep::alerting {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxResponseBytes = 1 << 20;

// What the coroutine reports back; shared so that an aborted (stopped) coroutine
// never writes into a finished Post()'s stack.
struct Outcome {
  bool done = false;
  Status status;
  HttpResponse response;
};

std::string Describe(const std::string& stage, const beast::error_code& ec, const Url& url) {
  std::string where = (url.https ? "https://" : "http://") + url.HostHeader();
  if (ec == beast::error::timeout || ec == asio::error::operation_aborted)
    return stage + " to " + where + " timed out";
  return stage + " to " + where + " failed: " + ec.message();
}

template <typename Stream>
constexpr bool kIsTls = !std::is_same_v<Stream, beast::tcp_stream>;

Status Fail(const beast::error_code& ec, const std::string& why) {
  return ec == beast::error::timeout ? Status::Timeout(why) : Status::Unavailable(why);
}

// Connect, (TLS handshake,) write, read: the body of one request on `stream`.
template <typename Stream>
asio::awaitable<void> ConnectAndExchange(Stream& stream, const tcp::resolver::results_type& endpoints,
                                         Clock::time_point connect_deadline,
                                         std::chrono::milliseconds request_timeout, const Url& url,
                                         http::request<http::string_body>& req,
                                         std::shared_ptr<Outcome> out) {
  beast::error_code ec;
  beast::tcp_stream& tcp_layer = beast::get_lowest_layer(stream);
  tcp_layer.expires_at(connect_deadline);
  co_await tcp_layer.async_connect(endpoints, asio::redirect_error(asio::use_awaitable, ec));
  if (ec) {
    out->status = Fail(ec, Describe("connecting", ec, url));
    co_return;
  }
  const auto deadline = Clock::now() + request_timeout;
  if constexpr (kIsTls<Stream>) {
    beast::error_code addr_ec;
    asio::ip::make_address(url.host, addr_ec);
    if (addr_ec) {  // SNI is for names only (RFC 6066 forbids IP literals)
      SSL_set_tlsext_host_name(stream.native_handle(), url.host.c_str());
    }
    stream.set_verify_mode(asio::ssl::verify_peer);
    stream.set_verify_callback(asio::ssl::host_name_verification(url.host));
    tcp_layer.expires_at(deadline);
    co_await stream.async_handshake(asio::ssl::stream_base::client,
                                    asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      std::string why = Describe("TLS handshake", ec, url);
      if (ec.category() == asio::error::get_ssl_category())
        why += " (is the server certificate signed by a CA in the system store or --alert-ca-file, "
               "and issued for " + url.host + "?)";
      out->status = Fail(ec, why);
      co_return;
    }
  }
  tcp_layer.expires_at(deadline);
  co_await http::async_write(stream, req, asio::redirect_error(asio::use_awaitable, ec));
  if (ec) {
    out->status = Fail(ec, Describe("sending the request", ec, url));
    co_return;
  }
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxResponseBytes);
  tcp_layer.expires_at(deadline);
  co_await http::async_read(stream, buf, parser, asio::redirect_error(asio::use_awaitable, ec));
  if (ec) {
    out->status = Fail(ec, Describe("reading the answer", ec, url));
    co_return;
  }
  out->response.status = static_cast<int>(parser.get().result_int());
  out->response.body = parser.get().body();
  // No TLS close_notify round trip: the answer is in, and a peer that never sends
  // its close_notify must not hold this thread.
  beast::error_code ignored;
  tcp_layer.socket().shutdown(tcp::socket::shutdown_both, ignored);
}

asio::awaitable<void> DoPost(asio::ssl::context& ssl_ctx, HttpClient::Options opt, Url url,
                             http::request<http::string_body> req, std::shared_ptr<Outcome> out) {
  auto ex = co_await asio::this_coro::executor;
  const auto connect_deadline = Clock::now() + opt.connect_timeout;
  beast::error_code ec;

  // Resolve under the connect deadline: a timer cancels a slow DNS lookup.
  tcp::resolver resolver(ex);
  asio::steady_timer dns_timer(ex);
  dns_timer.expires_at(connect_deadline);
  dns_timer.async_wait([&resolver](const beast::error_code& e) {
    if (!e) resolver.cancel();
  });
  auto endpoints = co_await resolver.async_resolve(url.host, std::to_string(url.port),
                                                   asio::redirect_error(asio::use_awaitable, ec));
  dns_timer.cancel();
  if (ec) {
    out->status = Status::Unavailable(ec == asio::error::operation_aborted
                                          ? "resolving " + url.host + " timed out"
                                          : "cannot resolve host " + url.host + ": " + ec.message());
    co_return;
  }
  if (url.https) {
    beast::ssl_stream<beast::tcp_stream> stream(ex, ssl_ctx);
    co_await ConnectAndExchange(stream, endpoints, connect_deadline, opt.request_timeout, url, req, out);
  } else {
    beast::tcp_stream stream(ex);
    co_await ConnectAndExchange(stream, endpoints, connect_deadline, opt.request_timeout, url, req, out);
  }
}

std::string Base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], k[v & 63]};
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += {k[v >> 18], k[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], '='};
  }
  return out;
}

}  // namespace

HttpClient::HttpClient(const Options& options)
    : options_(options), ssl_ctx_(asio::ssl::context::tls_client) {}

HttpClient::~HttpClient() = default;

StatusOr<std::unique_ptr<HttpClient>> HttpClient::Create(const Options& options) {
  std::unique_ptr<HttpClient> c(new HttpClient(options));
  beast::error_code ec;
  c->ssl_ctx_.set_default_verify_paths(ec);
  if (ec) return Status::Internal("cannot load the system CA store: " + ec.message());
  if (!options.ca_file.empty()) {
    c->ssl_ctx_.load_verify_file(options.ca_file, ec);
    if (ec)
      return Status::InvalidArgument("cannot load CA file '" + options.ca_file +
                                     "' (it must be PEM): " + ec.message());
  }
  c->ssl_ctx_.set_verify_mode(asio::ssl::verify_peer);
  return c;
}

void HttpClient::Abort() noexcept {
  aborted_.store(true);
  ioc_.stop();
}

StatusOr<HttpResponse> HttpClient::Post(
    const Url& url, const std::string& extra_query, const std::string& body,
    const std::string& content_type,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string target = url.target;
  if (!extra_query.empty()) target += (target.find('?') == std::string::npos ? "?" : "&") + extra_query;
  http::request<http::string_body> req{http::verb::post, target, 11};
  req.set(http::field::host, url.HostHeader());
  req.set(http::field::user_agent, "lockstep-alerting/" LOCKSTEP_VERSION);
  req.set(http::field::content_type, content_type);
  req.set(http::field::connection, "close");
  if (!url.userinfo.empty()) req.set(http::field::authorization, "Basic " + Base64(url.userinfo));
  for (const auto& [k, v] : headers) req.set(k, v);
  req.body() = body;
  req.prepare_payload();

  auto out = std::make_shared<Outcome>();
  ioc_.restart();
  // Abort() sets the flag before stop(): checked after restart(), no stop is lost.
  if (aborted_.load()) return Status::Unavailable("alerting is shutting down");
  asio::co_spawn(ioc_, DoPost(ssl_ctx_, options_, url, std::move(req), out),
                 [out](std::exception_ptr e) {
                   out->done = true;
                   if (e) {
                     try {
                       std::rethrow_exception(e);
                     } catch (const std::exception& ex) {
                       out->status = Status::Internal(std::string("HTTP client error: ") + ex.what());
                     } catch (...) {
                       out->status = Status::Internal("HTTP client error");
                     }
                   }
                 });
  try {
    ioc_.run();
  } catch (const std::exception& e) {
    return Status::Internal(std::string("HTTP client error: ") + e.what());
  }
  if (!out->done) return Status::Unavailable("request aborted: alerting is shutting down");
  if (!out->status.ok()) return out->status;
  return std::move(out->response);
}

}  // namespace lockstep::alerting
