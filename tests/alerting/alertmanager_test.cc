// The real Prometheus Alertmanager (Debian's prometheus-alertmanager), started on
// loopback with a temporary config and storage: an alert posted by lockstep shows
// up in GET /api/v2/alerts with the labels routing depends on. Skips, saying why,
// when the binary is not installed.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "lockstep/alerting/dispatcher.h"
#include "test_server.h"
#include "test_util.h"

extern char** environ;

namespace lockstep::alerting {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr const char* kBinary = "/usr/bin/prometheus-alertmanager";

class RealAlertmanager {
 public:
  explicit RealAlertmanager(const std::string& dir) {
    std::ofstream(dir + "/am.yml") << "route:\n  receiver: 'null'\nreceivers:\n  - name: 'null'\n";
    port_ = testing::ClosedPort();
    std::vector<std::string> args = {kBinary,
                                     "--config.file=" + dir + "/am.yml",
                                     "--storage.path=" + dir + "/data",
                                     "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                                     "--cluster.listen-address=",
                                     "--log.level=warn"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, (dir + "/am.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pid_, kBinary, &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~RealAlertmanager() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st = 0;
      waitpid(pid_, &st, 0);
    }
  }
  // Polls /-/ready until the deadline (the process needs a moment to listen).
  bool WaitReady(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      testing::HttpGet(port_, "/-/ready", &status);
      if (status == 200) return true;
      int st = 0;
      if (pid_ <= 0 || waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }
  uint16_t port() const { return port_; }

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

TEST(RealAlertmanager, PostedAlertIsListedWithLabels) {
  if (!std::filesystem::exists(kBinary)) GTEST_SKIP() << kBinary << " is not installed (apt-get install prometheus-alertmanager)";
  std::string dir = testing::TempDir("am");
  {
    RealAlertmanager am(dir);
    ASSERT_TRUE(am.WaitReady(15s)) << "alertmanager did not become ready; see " << dir << "/am.log";
    AlertingOptions o;
    o.sinks.push_back(testing::HttpSink("alertmanager", "http://127.0.0.1:" + std::to_string(am.port())));
    o.sinks[0].generator_url = "http://127.0.0.1:9464/";
    auto d = Dispatcher::Create(o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    Alert a = testing::SampleAlert();
    a.first_seen_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::system_clock::now().time_since_epoch()).count();
    (*d)->Submit(a);
    ASSERT_TRUE((*d)->Flush(10s)) << (*d)->Counters()[0].last_error;
    EXPECT_EQ((*d)->Counters()[0].delivered, 1u);
    int status = 0;
    json list = json::parse(testing::HttpGet(am.port(), "/api/v2/alerts", &status));
    ASSERT_EQ(status, 200);
    ASSERT_EQ(list.size(), 1u) << list.dump();
    const json& l = list[0]["labels"];
    EXPECT_EQ(l["alertname"], "LockstepFirstDivergence");
    EXPECT_EQ(l["severity"], "critical");
    EXPECT_EQ(l["experiment"], "glm-migration");
    EXPECT_EQ(l["run"], "glm-gpu-01,glm-npu-01");
    EXPECT_EQ(l["tensor"], "layers.3.mlp");
    EXPECT_EQ(l["kind"], "act");
    EXPECT_EQ(l["rule"], "first_divergence");
    EXPECT_EQ(list[0]["annotations"]["summary"], a.message);
    EXPECT_EQ(list[0]["generatorURL"], "http://127.0.0.1:9464/");
    EXPECT_EQ(list[0]["status"]["state"], "active");
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lockstep::alerting
