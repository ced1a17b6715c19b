// `lockstep zoom EXPERIMENT MODULE`: asks a running collector to have every live run of
// EXPERIMENT zoom into MODULE (record each torch call in its own code, forward and
// backward, for a few steps), as the collector does by itself when an error is born in a
// container's own code (docs/python.md "Zoom", docs/design.md "The control channel").
// It POSTs /zoom to the collector's HTTP port (--metrics-listen), which takes actions
// from its own machine only, and prints the collector's one-line answer.
#include <chrono>
#include <cstdio>
#include <string>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "cli/commands.h"
#include "lockstep/common/flags.h"
#include "lockstep/common/url_encoding.h"

namespace lockstep::cli {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

// "HOST:PORT" or "[V6]:PORT" split; false when it is neither.
bool SplitHostPort(const std::string& addr, std::string* host, std::string* port) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size()) return false;
  *host = addr.substr(0, colon);
  *port = addr.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  return true;
}

}  // namespace

int ZoomCommand(int argc, const char* const* argv) {
  std::string collector = "127.0.0.1:9464";
  int64_t steps = 2;
  FlagSet flags("zoom", "zoom [--steps N] [--collector HOST:PORT] EXPERIMENT MODULE",
                "Asks a running collector to have every live run of EXPERIMENT zoom into MODULE (a "
                "module's name in the rows, e.g. blocks.1.attn) for N steps from the next step all of them "
                "can act at: each torch call in the module's own code becomes rows of its own "
                "(MODULE/func#k, forward and gradients), so the first divergence can name the call. The "
                "collector does this by itself when an error is born in a container's own code; this is "
                "for any module, any time. The collector's HTTP port (collect --metrics-listen) takes it "
                "from this machine only. Exit 0 when the collector asked the runs; each run answers on the "
                "wire (lockstep inspect RUN_LOG shows ControlAck) and refuses a module it does not have.");
  flags.String("collector", &collector, "the collector's HTTP address (its --metrics-listen)");
  flags.Int("steps", &steps, "steps to zoom, 1 to 10000");
  Status s = flags.Parse(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "lockstep zoom: %s\n", OneLine(s.message()).c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::printf("%s\n", flags.Help().c_str());
    return kExitOk;
  }
  if (flags.positional().size() != 2) {
    std::fprintf(stderr, "lockstep zoom: give EXPERIMENT and MODULE, e.g. 'lockstep zoom demo blocks.1.attn'\n");
    return kExitUsage;
  }
  if (steps < 1 || steps > 10000) {
    std::fprintf(stderr, "lockstep zoom: --steps must be between 1 and 10000\n");
    return kExitUsage;
  }
  std::string host, port;
  if (!SplitHostPort(collector, &host, &port)) {
    std::fprintf(stderr, "lockstep zoom: --collector '%s' is not HOST:PORT (e.g. 127.0.0.1:9464)\n",
                 collector.c_str());
    return kExitUsage;
  }
  const std::string target = "/zoom?experiment=" + UrlEncode(flags.positional()[0]) +
                             "&module=" + UrlEncode(flags.positional()[1]) + "&steps=" + std::to_string(steps);
  try {
    asio::io_context io;
    asio::ip::tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    stream.expires_after(std::chrono::seconds(10));
    stream.connect(resolver.resolve(host, port));
    http::request<http::string_body> req(http::verb::post, target, 11);
    req.set(http::field::host, host);
    req.set(http::field::user_agent, "lockstep zoom");
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    beast::error_code ignored;
    stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    std::string body = res.body();
    while (!body.empty() && body.back() == '\n') body.pop_back();
    if (res.result_int() == 200) {
      std::printf("%s\n", body.c_str());
      return kExitOk;
    }
    std::fprintf(stderr, "lockstep zoom: the collector at %s said: %s\n", collector.c_str(), body.c_str());
    return res.result_int() == 400 ? kExitUsage : kExitRuntime;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep zoom: no collector answered at %s (%s): is `lockstep collect` running with "
                         "--metrics-listen there?\n",
                 collector.c_str(), e.what());
    return kExitRuntime;
  }
}

}  // namespace lockstep::cli
