// The alerting flags and TOML keys -> AlertingOptions, and their mistakes.
#include "cli/alerting_flags.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "test_util.h"

namespace lockstep::cli {
namespace {


StatusOr<alerting::AlertingOptions> Build(std::vector<const char*> argv, const std::string& spool = "/tmp/spool") {
  FlagSet flags("collect", "collect", "test");
  AlertingFlags af;
  RegisterAlertingFlags(&flags, &af);
  Status st = flags.Parse(static_cast<int>(argv.size()), argv.data());
  if (!st.ok()) return st;
  return BuildAlertingOptions(af, spool);
}

TEST(AlertingFlags, WebhooksWithFormatsAlertmanagerFileAndLog) {
  setenv("LOCKSTEP_TEST_DING_SECRET", "SECding0123456789", 1);
  auto o = Build({"--webhook", "https://hooks.slack.com/services/T/B/X", "--webhook",
                  "https://oapi.dingtalk.com/robot/send?access_token=t", "--webhook-format", "slack",
                  "--webhook-format", "dingtalk", "--webhook-secret", "env:LOCKSTEP_TEST_DING_SECRET",
                  "--alertmanager", "http://127.0.0.1:9093", "--alerts-file", "/tmp/a.jsonl",
                  "--alert-min-severity", "warning", "--alert-cooldown-s", "30", "--alert-retries", "5",
                  "--alert-timeout-s", "2.5"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ASSERT_EQ(o->sinks.size(), 5u);
  EXPECT_EQ(o->sinks[0].kind, "slack");
  EXPECT_TRUE(o->sinks[0].secret.empty());
  EXPECT_EQ(o->sinks[1].kind, "dingtalk");
  EXPECT_EQ(o->sinks[1].secret, "SECding0123456789");
  EXPECT_EQ(o->sinks[2].kind, "alertmanager");
  EXPECT_EQ(o->sinks[3].kind, "jsonl");
  EXPECT_EQ(o->sinks[4].kind, "log");
  for (const auto& s : o->sinks) EXPECT_EQ(s.min_severity, alerting::Severity::kWarning);
  EXPECT_EQ(o->sinks[0].max_retries, 5);
  EXPECT_EQ(o->sinks[0].request_timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(o->dedup_cooldown, std::chrono::seconds(30));
  EXPECT_EQ(o->spool_dir, "/tmp/spool");
}

TEST(AlertingFlags, SecretAndTokenGoToTheKindsThatTakeThem) {
  auto o = Build({"--no-alert-log", "--webhook", "https://a.example/generic", "--webhook",
                  "https://open.feishu.cn/open-apis/bot/v2/hook/x", "--webhook", "https://hooks.slack.com/s",
                  "--webhook-format", "json", "--webhook-format", "lark", "--webhook-format", "slack",
                  "--webhook-secret", "SECfeishu0123456", "--webhook-token", "tkn"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ASSERT_EQ(o->sinks.size(), 3u);
  EXPECT_EQ(o->sinks[0].kind, "webhook");  // aliases become the kind's name
  EXPECT_EQ(o->sinks[0].token, "tkn");
  EXPECT_TRUE(o->sinks[0].secret.empty());
  EXPECT_EQ(o->sinks[1].kind, "feishu");
  EXPECT_EQ(o->sinks[1].secret, "SECfeishu0123456");
  EXPECT_TRUE(o->sinks[1].token.empty());
  EXPECT_EQ(o->sinks[2].kind, "slack");
  EXPECT_TRUE(o->sinks[2].secret.empty());
  EXPECT_TRUE(o->sinks[2].token.empty());
}

TEST(AlertingFlags, SinkSpecConfiguresEachSinkOnItsOwn) {
  setenv("LOCKSTEP_TEST_FEISHU_URL", "https://open.feishu.cn/open-apis/bot/v2/hook/abc", 1);
  auto o = Build({"--no-alert-log", "--alert-sink",
                  "kind=feishu,url=env:LOCKSTEP_TEST_FEISHU_URL,secret=s3cr3t,min-severity=critical,"
                  "msg-type=text,rate-per-min=5,burst=2,cooldown-s=0"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ASSERT_EQ(o->sinks.size(), 1u);
  const auto& s = o->sinks[0];
  EXPECT_EQ(s.kind, "feishu");
  EXPECT_EQ(s.target, "https://open.feishu.cn/open-apis/bot/v2/hook/abc");
  EXPECT_EQ(s.secret, "s3cr3t");
  EXPECT_TRUE(s.feishu_text);
  EXPECT_EQ(s.min_severity, alerting::Severity::kCritical);
  EXPECT_EQ(s.rate_per_min, 5);
  EXPECT_EQ(s.burst, 2);
  EXPECT_EQ(s.cooldown.count(), 0);
}

TEST(AlertingFlags, TomlConfigSetsSinks) {
  std::string dir = alerting::testing::TempDir("toml");
  std::string path = dir + "/lockstep.toml";
  std::ofstream(path) << "webhook = [\"https://example.com/a\"]\n"
                         "webhook-format = \"wecom\"\n"
                         "alert-sink = [\"kind=generic,url=https://example.com/b,token=tkn\"]\n"
                         "alert_spool_dir = \"" << dir << "/spool\"\n"
                         "alert-log = false\n";
  auto o = Build({"--config", path.c_str()});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ASSERT_EQ(o->sinks.size(), 2u);
  EXPECT_EQ(o->sinks[0].kind, "wecom");
  EXPECT_EQ(o->sinks[1].kind, "webhook");
  EXPECT_EQ(o->sinks[1].token, "tkn");
  EXPECT_EQ(o->spool_dir, dir + "/spool");
  std::filesystem::remove_all(dir);
}

TEST(AlertingFlags, IncidentFlags) {
  auto def = Build({"--webhook", "https://a.example/h"});
  ASSERT_TRUE(def.ok()) << def.status().ToString();
  EXPECT_TRUE(def->group_incidents);
  EXPECT_EQ(def->incident_digest_interval, std::chrono::minutes(5));
  EXPECT_EQ(def->incident_resolve_after, std::chrono::minutes(10));
  auto set = Build({"--webhook", "https://a.example/h", "--no-incidents", "--incident-digest-interval-s", "60",
                    "--incident-resolve-s", "0"});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_FALSE(set->group_incidents);
  EXPECT_EQ(set->incident_digest_interval, std::chrono::seconds(60));
  EXPECT_EQ(set->incident_resolve_after.count(), 0);
  auto neg = Build({"--incident-resolve-s", "-1"});
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("--incident-resolve-s must not be negative"), std::string::npos);
}

TEST(AlertingFlags, MistakesAreOneSentence) {
  auto unknown = Build({"--webhook", "https://x.example/h", "--webhook-format", "teams"});
  ASSERT_FALSE(unknown.ok());
  // The formats named are those --help lists (one source), not the other sink kinds.
  EXPECT_NE(unknown.status().message().find("'teams' is not a webhook format: use one of generic, slack, "
                                            "feishu, dingtalk, wecom"),
            std::string::npos)
      << unknown.status().message();
  EXPECT_EQ(unknown.status().message().find("jsonl"), std::string::npos) << unknown.status().message();
  {
    FlagSet flags("collect", "collect", "test");
    AlertingFlags af;
    RegisterAlertingFlags(&flags, &af);
    EXPECT_NE(flags.Help().find("generic|slack|feishu|dingtalk|wecom:"), std::string::npos) << flags.Help();
    // Which kinds take a secret or a token: the registry's answer, as it was written out.
    EXPECT_NE(flags.Help().find("signing secret (or env:VAR) for feishu and dingtalk webhooks"),
              std::string::npos) << flags.Help();
    EXPECT_NE(flags.Help().find("bearer token (or env:VAR) sent to generic webhooks"), std::string::npos)
        << flags.Help();
  }
  // An unknown --alert-sink key is named with the known ones, not "expects a number".
  auto colour = Build({"--alert-sink", "kind=generic,url=https://a.example/h,colour=red"});
  ASSERT_FALSE(colour.ok());
  EXPECT_NE(colour.status().message().find("unknown key 'colour' (known: kind, url,"), std::string::npos)
      << colour.status().message();
  EXPECT_EQ(colour.status().message().find("expects a number"), std::string::npos);
  // A secret in a spec never shows; a malformed URL shows its host.
  auto secret = Build({"--alert-sink", "kind=feishu,url=open.feishu.cn/hook/0c5c1f8e-aaaa-bbbb-cccc,secret=hunter2"});
  ASSERT_FALSE(secret.ok());
  EXPECT_EQ(secret.status().message().find("hunter2"), std::string::npos) << secret.status().message();
  EXPECT_EQ(secret.status().message().find("0c5c1f8e-aaaa-bbbb-cccc"), std::string::npos)
      << secret.status().message();
  EXPECT_NE(secret.status().message().find("open.feishu.cn/hook/0c5c***"), std::string::npos)
      << secret.status().message();
  // Negative and huge rates, counts and durations are errors naming the flag.
  for (const auto& bad : std::vector<std::vector<const char*>>{{"--alert-rate-per-min", "-1"},
                                                               {"--alert-burst", "-5"},
                                                               {"--alert-retries", "-1"},
                                                               {"--alert-cooldown-s", "-3"},
                                                               {"--alert-timeout-s", "1e300"},
                                                               {"--alert-backoff-ms", "0"}}) {
    auto r = Build({bad[0], bad[1]});
    ASSERT_FALSE(r.ok()) << bad[0] << " " << bad[1];
    EXPECT_NE(r.status().message().find(bad[0]), std::string::npos) << r.status().message();
  }
  auto neg_spec = Build({"--alert-sink", "kind=generic,url=https://a.example/h,rate-per-min=-2"});
  ASSERT_FALSE(neg_spec.ok());
  EXPECT_NE(neg_spec.status().message().find("must not be negative"), std::string::npos)
      << neg_spec.status().message();
  auto bad_url = Build({"--webhook", "hooks.slack.com/x"});
  ASSERT_FALSE(bad_url.ok());
  EXPECT_NE(bad_url.status().message().find("http:// or https://"), std::string::npos);
  unsetenv("LOCKSTEP_TEST_UNSET");
  auto no_env = Build({"--webhook", "env:LOCKSTEP_TEST_UNSET"});
  ASSERT_FALSE(no_env.ok());
  EXPECT_NE(no_env.status().message().find("LOCKSTEP_TEST_UNSET"), std::string::npos);
  auto counts = Build({"--webhook", "https://a.example/", "--webhook", "https://b.example/",
                       "--webhook-format", "slack", "--webhook-format", "wecom", "--webhook-format", "slack"});
  EXPECT_FALSE(counts.ok());
  auto spec = Build({"--alert-sink", "url=https://a.example/"});
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("kind="), std::string::npos);
  EXPECT_FALSE(Build({"--alert-min-severity", "fatal"}).ok());
}

}  // namespace
}  // namespace lockstep::cli
