// A blocking HTTP/1.1 GET for tests (Boost.Beast), one request per connection.
#ifndef LOCKSTEP_TESTS_METRICS_HTTP_GET_H_
#define LOCKSTEP_TESTS_METRICS_HTTP_GET_H_

#include <string>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace lockstep::testing {

struct HttpReply {
  int status = 0;
  std::string content_type, body;
};

// `address` is "127.0.0.1:PORT". Throws on connection errors (tests only).
inline HttpReply HttpRequest(const std::string& address, const std::string& target,
                             boost::beast::http::verb verb = boost::beast::http::verb::get) {
  namespace http = boost::beast::http;
  boost::asio::io_context io;
  boost::asio::ip::tcp::resolver resolver(io);
  auto colon = address.rfind(':');
  boost::beast::tcp_stream stream(io);
  stream.expires_after(std::chrono::seconds(10));
  stream.connect(resolver.resolve(address.substr(0, colon), address.substr(colon + 1)));
  http::request<http::string_body> req(verb, target, 11);
  req.set(http::field::host, address);
  req.keep_alive(false);
  http::write(stream, req);
  boost::beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 20);
  if (verb == http::verb::head) parser.skip(true);
  http::read(stream, buf, parser);
  auto res = parser.release();
  return {static_cast<int>(res.result_int()), std::string(res[http::field::content_type]), res.body()};
}

}  // namespace lockstep::testing

#endif  // LOCKSTEP_TESTS_METRICS_HTTP_GET_H_
