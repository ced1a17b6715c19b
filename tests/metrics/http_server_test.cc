#include "metrics/http_server.h"

#include <atomic>
#include <stdexcept>
#include <string>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <gtest/gtest.h>

#include "http_get.h"

namespace lockstep::collector::metrics {
namespace {

using lockstep::testing::HttpRequest;
namespace http = boost::beast::http;

std::unique_ptr<MetricsServer> StartOrDie(MetricsServerHandlers h, const std::string& listen = "127.0.0.1:0") {
  auto s = MetricsServer::Start(listen, std::move(h));
  EXPECT_TRUE(s.ok()) << s.status().message();
  return std::move(s).value();
}

TEST(MetricsServer, ServesMetricsRootAnd404) {
  std::atomic<int> renders{0};
  auto server = StartOrDie({[&] { return "m " + std::to_string(++renders) + "\n"; }});
  ASSERT_EQ(server->address().rfind("127.0.0.1:", 0), 0u) << server->address();
  ASSERT_NE(server->address(), "127.0.0.1:0");

  auto r = HttpRequest(server->address(), "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r.body, "m 1\n");
  EXPECT_EQ(HttpRequest(server->address(), "/metrics?x=1").body, "m 2\n");  // query ignored

  r = HttpRequest(server->address(), "/");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("/metrics"), std::string::npos);
  EXPECT_EQ(HttpRequest(server->address(), "/metricsX").status, 404);
  EXPECT_EQ(HttpRequest(server->address(), "/metrics", http::verb::post).status, 405);
  r = HttpRequest(server->address(), "/metrics", http::verb::head);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "");
  EXPECT_EQ(server->requests(), 6u);
  EXPECT_EQ(renders.load(), 3);  // /metrics twice, HEAD once; never for / or 404
}

TEST(MetricsServer, PageHandlerServesOtherPathsWithTheirQuery) {
  MetricsServerHandlers h;
  h.render = [] { return std::string("m\n"); };
  std::string seen;
  h.page = [&seen](std::string_view target, std::string* type, std::string* body) {
    seen = std::string(target);
    if (target.substr(0, 7) != "/report" && target != "/") return false;
    *type = "text/html; charset=utf-8";
    *body = "<p>page</p>";
    return true;
  };
  auto server = StartOrDie(std::move(h));
  auto r = HttpRequest(server->address(), "/report?experiment=a%20b");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/html; charset=utf-8");
  EXPECT_EQ(r.body, "<p>page</p>");
  EXPECT_EQ(seen, "/report?experiment=a%20b");
  EXPECT_EQ(HttpRequest(server->address(), "/").body, "<p>page</p>");
  EXPECT_EQ(HttpRequest(server->address(), "/nope").status, 404);
  EXPECT_EQ(HttpRequest(server->address(), "/metrics").body, "m\n");  // never asked of the page
  EXPECT_EQ(seen, "/nope");
}

TEST(MetricsServer, ActionHandlerTakesPostsWithTheirQueryFromLoopback) {
  MetricsServerHandlers h;
  h.render = [] { return std::string("m\n"); };
  std::string seen;
  h.action = [&seen](std::string_view target, std::string* reply) {
    seen = std::string(target);
    *reply = target.substr(0, 5) == "/zoom" ? "asked" : "not found";
    return target.substr(0, 5) == "/zoom" ? 200 : 404;
  };
  auto server = StartOrDie(std::move(h));
  auto r = HttpRequest(server->address(), "/zoom?experiment=a%20b&module=m", http::verb::post);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "asked\n");
  EXPECT_EQ(seen, "/zoom?experiment=a%20b&module=m");
  EXPECT_EQ(HttpRequest(server->address(), "/x", http::verb::post).status, 404);
  EXPECT_EQ(HttpRequest(server->address(), "/metrics", http::verb::post).status, 405);  // the server's own
  EXPECT_EQ(HttpRequest(server->address(), "/metrics").body, "m\n");  // GETs as before
}

// A non-loopback address of this machine, or "" when it has none (an isolated sandbox).
std::string OwnNonLoopbackIpv4() {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return "";
  std::string out;
  for (ifaddrs* i = all; i != nullptr && out.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET_ADDRSTRLEN];
    auto* in = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf) != nullptr) out = buf;
  }
  freeifaddrs(all);
  return out;
}

TEST(MetricsServer, PostsFromAnotherAddressAreForbiddenWhateverTheBind) {
  const std::string own = OwnNonLoopbackIpv4();
  if (own.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address";
  MetricsServerHandlers h;
  h.render = [] { return std::string("m\n"); };
  int actions = 0;
  h.action = [&actions](std::string_view, std::string* reply) {
    ++actions;
    *reply = "asked";
    return 200;
  };
  auto server = StartOrDie(std::move(h), "0.0.0.0:0");
  const std::string port = server->address().substr(server->address().rfind(':') + 1);
  auto r = HttpRequest(own + ":" + port, "/zoom?experiment=x&module=m", http::verb::post);
  EXPECT_EQ(r.status, 403);
  EXPECT_NE(r.body.find("only from its own machine"), std::string::npos) << r.body;
  EXPECT_EQ(HttpRequest(own + ":" + port, "/metrics").status, 200);  // reads are served
  EXPECT_EQ(HttpRequest("127.0.0.1:" + port, "/zoom?x", http::verb::post).status, 200);
  EXPECT_EQ(actions, 1);
}

TEST(MetricsServer, RenderExceptionIsA500AndServingGoesOn) {
  bool fail = true;
  auto server = StartOrDie({[&]() -> std::string {
    if (fail) {
      fail = false;
      throw std::runtime_error("boom");
    }
    return "ok 1\n";
  }});
  auto r = HttpRequest(server->address(), "/metrics");
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(r.body.find("boom"), std::string::npos);
  EXPECT_EQ(HttpRequest(server->address(), "/metrics").body, "ok 1\n");
  EXPECT_EQ(server->errors(), 1u);
}

TEST(MetricsServer, RefusesBadAddressesWithOneSentence) {
  for (const char* bad : {"9464", "127.0.0.1", "127.0.0.1:x", "127.0.0.1:70000", "[::1]9464", ":9464"}) {
    auto s = MetricsServer::Start(bad, {[] { return std::string(); }});
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_TRUE(s.status().IsInvalidArgument()) << bad;
    EXPECT_NE(s.status().message().find("--metrics-listen"), std::string::npos);
  }
}

TEST(MetricsServer, PortInUseIsUnavailable) {
  auto first = StartOrDie({[] { return std::string(); }});
  auto second = MetricsServer::Start(first->address(), {[] { return std::string(); }});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Status::Code::kUnavailable);
  EXPECT_NE(second.status().message().find(first->address()), std::string::npos);
}

TEST(MetricsServer, TicksOnItsOwnThreadAndShutsDownIdempotently) {
  std::atomic<int> ticks{0};
  MetricsServerHandlers h{[&] { return std::to_string(ticks.load()) + "\n"; }, [&] { ++ticks; },
                          std::chrono::milliseconds(1)};
  auto server = StartOrDie(std::move(h), "localhost:0");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ticks.load() < 3 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_GE(ticks.load(), 3);
  server->Shutdown();
  int after = ticks.load();
  server->Shutdown();
  EXPECT_EQ(ticks.load(), after);
}

}  // namespace
}  // namespace lockstep::collector::metrics
