// Every message format, field by field, without a network; reply judging; URL
// parsing and redaction.
#include "formats.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "sink_type.h"
#include "test_util.h"
#include "url.h"

namespace lockstep::alerting {
namespace {

using nlohmann::json;
using testing::SampleAlert;

constexpr int64_t kNowMs = 1599360473000;

SinkOptions Sink(const std::string& k) {
  SinkOptions s;
  s.kind = k;
  s.target = "https://example.com/hook";
  return s;
}

TEST(Formats, GenericJsonCarriesEveryField) {
  json j = json::parse(AlertToJson(SampleAlert(), kNowMs));
  EXPECT_EQ(j["id"], "a1");
  EXPECT_EQ(j["rule"], "first_divergence");
  EXPECT_EQ(j["severity"], "critical");
  EXPECT_EQ(j["experiment"], "glm-migration");
  EXPECT_EQ(j["runs"], json({"glm-gpu-01", "glm-npu-01"}));
  EXPECT_EQ(j["step"], 1234);
  EXPECT_EQ(j["rank"], 3);
  EXPECT_EQ(j["micro_step"], 2);
  EXPECT_EQ(j["tensor"], "layers.3.mlp");
  EXPECT_EQ(j["kind"], "act");
  EXPECT_DOUBLE_EQ(j["baseline_value"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(j["candidate_value"].get<double>(), 2.25);
  EXPECT_EQ(j["metric"], "rel_err_l2");
  EXPECT_DOUBLE_EQ(j["error"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["threshold"].get<double>(), 0.01);
  EXPECT_EQ(j["first_seen"], "2024-05-01T12:00:00.123Z");
  EXPECT_EQ(j["first_seen_unix_ns"], 1714564800123000000);
  EXPECT_EQ(j["repeat_count"], 1);
  EXPECT_EQ(j["message"], "layers.3.mlp output diverges first at step 1234");
  // The sample is micro step 2: the key ends in /micro2.
  EXPECT_EQ(j["dedup_key"], "first_divergence/glm-migration/glm-npu-01/layers.3.mlp/act/rank3/micro2");
}

TEST(Formats, GenericJsonWritesNanAsNullAndSurvivesBadUtf8) {
  Alert a = SampleAlert();
  a.baseline_value = std::nan("");
  a.message = std::string("bad \xff byte");
  json j = json::parse(AlertToJson(a, kNowMs));
  EXPECT_TRUE(j["baseline_value"].is_null());
  EXPECT_NE(j["message"].get<std::string>().find("bad"), std::string::npos);
}

TEST(Formats, SpoolRoundTripKeepsEveryField) {
  Alert a = SampleAlert();
  a.repeat_count = 7;
  auto back = AlertFromJson(AlertToJson(a, kNowMs));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->id, a.id);
  EXPECT_EQ(back->runs, a.runs);
  EXPECT_EQ(back->step, a.step);
  EXPECT_EQ(back->severity, a.severity);
  EXPECT_DOUBLE_EQ(back->threshold, a.threshold);
  EXPECT_EQ(back->first_seen_unix_ns, a.first_seen_unix_ns);
  EXPECT_EQ(back->repeat_count, 7u);
  EXPECT_EQ(back->micro_step, 2u);
  EXPECT_EQ(back->rank, 3u);
  EXPECT_EQ(back->DedupKey(), a.DedupKey());
  EXPECT_FALSE(AlertFromJson("{not json").ok());
}

TEST(Formats, AnIncidentNotificationCarriesItsFactsThroughTheSpool) {
  Alert a = SampleAlert();
  a.incident = "divergence/glm-migration/glm-gpu-01/glm-npu-01";
  a.notification = "escalated";
  a.incident_alerts = 42;
  IncidentFact f;
  f.rule = "nonfinite";
  f.severity = Severity::kCritical;
  f.step = 160;
  f.run = "glm-npu-01";
  f.tensor = "blocks.2";
  f.kind = "act";
  f.message = "first NaN/Inf in blocks.2";
  a.facts = {f};
  json j = json::parse(AlertToJson(a, kNowMs));
  EXPECT_EQ(j["incident"], a.incident);
  EXPECT_EQ(j["notification"], "escalated");
  EXPECT_EQ(j["incident_alerts"], 42);
  ASSERT_EQ(j["facts"].size(), 1u);
  EXPECT_EQ(j["facts"][0]["tensor"], "blocks.2");
  EXPECT_EQ(j["facts"][0]["severity"], "critical");
  auto back = AlertFromJson(AlertToJson(a, kNowMs));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->incident, a.incident);
  EXPECT_EQ(back->notification, "escalated");
  EXPECT_EQ(back->incident_alerts, 42u);
  ASSERT_EQ(back->facts.size(), 1u);
  EXPECT_EQ(back->facts[0].step, 160u);
  EXPECT_EQ(back->facts[0].message, f.message);
  // Alertmanager: one incident is one alert (stable labels), grouped by its key.
  json am = json::parse(FormatAlert(Sink("alertmanager"), a, kNowMs).body)[0];
  EXPECT_EQ(am["labels"]["alertname"], "LockstepIncident");
  EXPECT_EQ(am["labels"]["incident"], a.incident);
  EXPECT_FALSE(am["labels"].contains("tensor"));
  EXPECT_FALSE(am.contains("endsAt"));
  a.notification = "resolved";
  am = json::parse(FormatAlert(Sink("alertmanager"), a, kNowMs).body)[0];
  EXPECT_TRUE(am.contains("endsAt"));
  // Chat formats list the facts.
  json slack = json::parse(FormatAlert(Sink("slack"), a, kNowMs).body);
  EXPECT_NE(slack["blocks"][1]["text"]["text"].get<std::string>().find("first NaN/Inf in blocks.2"),
            std::string::npos);
  EXPECT_NE(slack["blocks"][0]["text"]["text"].get<std::string>().find("incident resolved"), std::string::npos);
}

TEST(Formats, SlackHasTextFallbackAndBlocks) {
  json j = json::parse(FormatAlert(Sink("slack"), SampleAlert(), kNowMs).body);
  EXPECT_EQ(j["text"], "[critical] lockstep first_divergence in glm-migration: "
                       "layers.3.mlp output diverges first at step 1234");
  ASSERT_EQ(j["blocks"].size(), 2u);
  EXPECT_EQ(j["blocks"][0]["type"], "header");
  EXPECT_EQ(j["blocks"][0]["text"]["type"], "plain_text");
  EXPECT_EQ(j["blocks"][1]["type"], "section");
  EXPECT_EQ(j["blocks"][1]["text"]["type"], "mrkdwn");
  std::string md = j["blocks"][1]["text"]["text"];
  EXPECT_NE(md.find("*tensor*: layers.3.mlp (act)"), std::string::npos) << md;
  EXPECT_NE(md.find("*step*: 1234 (micro step 2)  *rank*: 3"), std::string::npos) << md;
  EXPECT_NE(md.find("*rel_err_l2*: 0.5 (threshold 0.01)"), std::string::npos);
  EXPECT_NE(md.find("glm-gpu-01 vs glm-npu-01"), std::string::npos);
}

TEST(Formats, FeishuInteractiveCardSignedAsDocumented) {
  SinkOptions s = Sink("feishu");
  s.secret = "SECtest";
  json j = json::parse(FormatAlert(s, SampleAlert(), kNowMs).body);
  EXPECT_EQ(j["msg_type"], "interactive");
  EXPECT_EQ(j["card"]["header"]["title"]["tag"], "plain_text");
  EXPECT_EQ(j["card"]["header"]["template"], "red");
  EXPECT_EQ(j["card"]["elements"][0]["tag"], "div");
  EXPECT_EQ(j["card"]["elements"][0]["text"]["tag"], "lark_md");
  EXPECT_NE(j["card"]["elements"][0]["text"]["content"].get<std::string>().find("**tensor**"),
            std::string::npos);
  // Python: base64(hmac.new(b"1599360473\nSECtest", b"", sha256).digest())
  EXPECT_EQ(j["timestamp"], "1599360473");
  EXPECT_EQ(j["sign"], "bMjxHlJJlXMW0yjKHZsmMvrFnAOfMlmWpRUsH3qMAek=");
}

TEST(Formats, FeishuTextWithoutSecretHasNoSignature) {
  SinkOptions s = Sink("feishu");
  s.feishu_text = true;
  json j = json::parse(FormatAlert(s, SampleAlert(), kNowMs).body);
  EXPECT_EQ(j["msg_type"], "text");
  EXPECT_NE(j["content"]["text"].get<std::string>().find("layers.3.mlp"), std::string::npos);
  EXPECT_FALSE(j.contains("sign"));
  EXPECT_FALSE(j.contains("timestamp"));
}

TEST(Formats, DingTalkMarkdownAndUrlSignature) {
  SinkOptions s = Sink("dingtalk");
  s.secret = "SECtest";
  Payload p = FormatAlert(s, SampleAlert(), kNowMs);
  json j = json::parse(p.body);
  EXPECT_EQ(j["msgtype"], "markdown");
  EXPECT_EQ(j["markdown"]["title"], "[critical] lockstep first_divergence in glm-migration");
  EXPECT_NE(j["markdown"]["text"].get<std::string>().find("**step**: 1234"), std::string::npos);
  // Python: quote_plus(base64(hmac.new(b"SECtest", b"1599360473000\nSECtest", sha256)))
  EXPECT_EQ(p.query_suffix,
            "timestamp=1599360473000&sign=9uMBwWNha8Pcr4QQCL9YQitwL0E0g2JIxycWz23gAkE%3D");
}

TEST(Formats, WeComMarkdown) {
  json j = json::parse(FormatAlert(Sink("wecom"), SampleAlert(), kNowMs).body);
  EXPECT_EQ(j["msgtype"], "markdown");
  std::string c = j["markdown"]["content"];
  EXPECT_NE(c.find("<font color=\"warning\">[critical] lockstep first_divergence"), std::string::npos);
  EXPECT_NE(c.find("**tensor**: layers.3.mlp (act)"), std::string::npos);
}

TEST(Formats, AlertmanagerV2LabelsAndAnnotations) {
  SinkOptions s = Sink("alertmanager");
  s.generator_url = "http://collector:9464/";
  json j = json::parse(FormatAlert(s, SampleAlert(), kNowMs).body);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 1u);
  const json& l = j[0]["labels"];
  EXPECT_EQ(l["alertname"], "LockstepFirstDivergence");
  EXPECT_EQ(l["severity"], "critical");
  EXPECT_EQ(l["experiment"], "glm-migration");
  EXPECT_EQ(l["run"], "glm-gpu-01,glm-npu-01");
  EXPECT_EQ(l["tensor"], "layers.3.mlp");
  EXPECT_EQ(l["kind"], "act");
  EXPECT_EQ(l["rule"], "first_divergence");
  EXPECT_FALSE(l.contains("step"));  // a per-step label would break grouping
  EXPECT_EQ(l["rank"], "3");          // two ranks are two findings
  EXPECT_FALSE(l.contains("micro_step"));
  EXPECT_EQ(j[0]["annotations"]["micro_step"], "2");
  EXPECT_EQ(j[0]["annotations"]["summary"], "layers.3.mlp output diverges first at step 1234");
  EXPECT_NE(j[0]["annotations"]["description"].get<std::string>().find("rel_err_l2"), std::string::npos);
  EXPECT_EQ(j[0]["annotations"]["step"], "1234");
  EXPECT_EQ(j[0]["startsAt"], "2024-05-01T12:00:00.123Z");
  EXPECT_EQ(j[0]["generatorURL"], "http://collector:9464/");
}

TEST(Formats, AlertmanagerOmitsEmptyLabels) {
  Alert a = SampleAlert();
  a.tensor.clear();
  a.kind.clear();
  json j = json::parse(FormatAlert(Sink("alertmanager"), a, kNowMs).body);
  EXPECT_FALSE(j[0]["labels"].contains("tensor"));
  EXPECT_FALSE(j[0]["labels"].contains("kind"));
  EXPECT_FALSE(j[0].contains("generatorURL"));
}

TEST(JudgeReply, StatusCodesAndBotErrorCodes) {
  EXPECT_TRUE(JudgeReply("webhook", 204, "").ok);
  auto r404 = JudgeReply("slack", 404, "no_service");
  EXPECT_FALSE(r404.ok);
  EXPECT_FALSE(r404.retryable);
  EXPECT_NE(r404.detail.find("no_service"), std::string::npos);
  EXPECT_TRUE(JudgeReply("webhook", 408, "").retryable);
  EXPECT_TRUE(JudgeReply("webhook", 429, "").retryable);
  EXPECT_TRUE(JudgeReply("webhook", 503, "").retryable);
  auto sign = JudgeReply("feishu", 200, R"({"code":19021,"msg":"sign match fail"})");
  EXPECT_FALSE(sign.ok);
  EXPECT_FALSE(sign.retryable);
  EXPECT_NE(sign.detail.find("19021: sign match fail"), std::string::npos);
  EXPECT_TRUE(JudgeReply("feishu", 200, R"({"code":0,"msg":"success"})").ok);
  EXPECT_TRUE(JudgeReply("dingtalk", 200, R"({"errcode":130101,"errmsg":"too fast"})").retryable);
  EXPECT_FALSE(JudgeReply("wecom", 200, R"({"errcode":93000,"errmsg":"invalid key"})").ok);
  EXPECT_TRUE(JudgeReply("wecom", 200, R"({"errcode":0,"errmsg":"ok"})").ok);
}

TEST(Url, ParsesHostPortTargetAndRejectsMistakes) {
  auto u = ParseUrl("https://user:pw@hooks.example.com:8443/a/b?x=1#frag", "test URL");
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(u->https);
  EXPECT_EQ(u->host, "hooks.example.com");
  EXPECT_EQ(u->port, 8443);
  EXPECT_EQ(u->target, "/a/b?x=1");
  EXPECT_EQ(u->userinfo, "user:pw");
  auto v6 = ParseUrl("http://[::1]:9093", "test URL");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->target, "/");
  EXPECT_EQ(v6->HostHeader(), "[::1]:9093");
  auto bad = ParseUrl("htp://x", "webhook URL of sink slack-0");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("webhook URL of sink slack-0"), std::string::npos);
  EXPECT_NE(bad.status().message().find("http:// or https://"), std::string::npos);
  EXPECT_FALSE(ParseUrl("http://:80/", "u").ok());
  EXPECT_FALSE(ParseUrl("http://h:99999/", "u").ok());
  EXPECT_FALSE(ParseUrl("http://h o/", "u").ok());
}

TEST(Redact, SecretsInUrlsNeverShowInFull) {
  EXPECT_EQ(RedactUrl("https://oapi.dingtalk.com/robot/send?access_token=abcdef0123456789"),
            "https://oapi.dingtalk.com/robot/send?access_token=abcd***");
  EXPECT_EQ(RedactUrl("https://hooks.slack.com/services/T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX"),
            "https://hooks.slack.com/services/T000/B000/XXXX***");
  EXPECT_EQ(RedactUrl("https://open.feishu.cn/open-apis/bot/v2/hook/0c5c1f8e-aaaa-bbbb-cccc-123456789abc"),
            "https://open.feishu.cn/open-apis/bot/v2/hook/0c5c***");
  EXPECT_EQ(RedactUrl("http://admin:hunter2@am:9093/api/v2/alerts"), "http://***@am:9093/api/v2/alerts");
  // A malformed URL keeps what is needed to fix it (scheme, host, port), not its tokens.
  EXPECT_EQ(RedactUrl("hooks.slack.com/services/T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX"),
            "hooks.slack.com/services/T000/B000/XXXX***");
  EXPECT_EQ(RedactUrl("htps://hooks.slack.com:99999/services/XXXXXXXXXXXXXXXXXXXXXXXX?key=abcdefghijkl"),
            "htps://hooks.slack.com:99999/services/XXXX***?key=abcd***");
  EXPECT_EQ(RedactUrl("https:/open.feishu.cn/hook/0c5c1f8e-aaaa-bbbb-cccc-123456789abc"),
            "https:/open.feishu.cn/hook/0c5c***");
  EXPECT_EQ(RedactUrl("am:9093/api/v2/alerts"), "am:9093/api/v2/alerts");
  EXPECT_EQ(RedactUrl("xoxbSECRETTOKENVALUE0123"), "xoxb***");  // a bare token stays hidden
  EXPECT_EQ(RedactSecret("SECabcdefghijkl"), "SECa***");
  EXPECT_EQ(RedactSecret("short"), "***");
}

TEST(Options, UnknownFormatAndSeverityGiveOneSentence) {
  auto k = ParseSinkKind("teams");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("unknown alert sink format 'teams'"), std::string::npos);
  EXPECT_EQ(ParseSinkKind("lark").value(), "feishu");
  EXPECT_FALSE(ParseSeverity("fatal").ok());
  AlertingOptions o;
  SinkOptions s;
  s.kind = "slack";
  s.target = "hooks.slack.com/services/x";
  o.sinks.push_back(s);
  Status st = ValidateOptions(o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("slack-0"), std::string::npos) << st.message();
  o.sinks[0].target = "https://hooks.slack.com/services/x";
  o.sinks[0].secret = "s3cr3t";
  EXPECT_FALSE(ValidateOptions(o).ok());  // slack takes no signing secret
  o.sinks[0].secret.clear();
  EXPECT_TRUE(ValidateOptions(o).ok());
}

// The registry (sink_type.h) is the one list of kinds: each once, every name and alias
// finds it, what front ends see of it (SinkKinds) is the table's, and the sentences built
// from it read as they did when written out.
TEST(SinkTypes, EachKindOnceAndTheSentencesBuiltFromTheTable) {
  std::set<std::string> names;
  ASSERT_EQ(SinkKinds().size(), AllSinkTypes().size());
  for (size_t i = 0; i < AllSinkTypes().size(); ++i) {
    const SinkType* t = AllSinkTypes()[i];
    const SinkKindInfo& k = SinkKinds()[i];
    EXPECT_TRUE(names.insert(t->name).second) << t->name;
    EXPECT_EQ(&SinkTypeOf(t->name), t) << t->name;
    EXPECT_EQ(FindSinkKind(t->name), &k) << t->name;
    EXPECT_EQ(ParseSinkKind(t->name).value(), t->name);
    for (const char* alias : t->aliases) {
      if (alias == nullptr) continue;
      EXPECT_TRUE(names.insert(alias).second) << alias << ": an alias of two kinds";
      EXPECT_EQ(ParseSinkKind(alias).value(), t->name) << alias;
      EXPECT_EQ(&SinkTypeOf(alias), t) << alias;
    }
    EXPECT_EQ(t->http, t->open == nullptr) << t->name << ": a local kind opens its own transport";
    EXPECT_STREQ(k.name, t->name);
    EXPECT_EQ(k.http, t->http) << t->name;
    EXPECT_EQ(k.signs, t->signs) << t->name;
    EXPECT_EQ(k.bearer_token, t->bearer_token) << t->name;
    EXPECT_EQ(k.webhook_format, t->http && t->webhook_format) << t->name;
  }
  EXPECT_EQ(AllSinkTypes().size(), 8u);
  EXPECT_EQ(FindSinkKind("teams"), nullptr);
  EXPECT_STREQ(SinkTypeOf("teams").name, "unknown");
  EXPECT_EQ(ListSinkKinds([](const SinkKindInfo& k) { return k.webhook_format; }, "|", "|"),
            "generic|slack|feishu|dingtalk|wecom");
  EXPECT_EQ(ListSinkKinds([](const SinkKindInfo& k) { return k.bearer_token; }, ", ", " and "),
            "generic and alertmanager");
  EXPECT_EQ(ParseSinkKind("teams").status().message(),
            "unknown alert sink format 'teams': use one of generic, slack, feishu, dingtalk, wecom, "
            "alertmanager, jsonl, log");
  AlertingOptions o;
  o.sinks.push_back(Sink("wechat"));  // an alias names the sink by its kind's name
  o.sinks[0].secret = "s3cr3t";
  EXPECT_EQ(ValidateOptions(o).message(),
            "alert sink wecom-0: a signing secret only applies to feishu and dingtalk sinks");
  o.sinks[0] = Sink("jsonl");
  o.sinks[0].target.clear();
  EXPECT_EQ(ValidateOptions(o).message(),
            "alert sink jsonl-0 has no file path: give --alerts-file PATH");
  o.sinks[0] = Sink("teams");  // a kind no file defines: refused before anything opens
  EXPECT_EQ(ValidateOptions(o).message(),
            "alert sink teams-0: unknown alert sink format 'teams': use one of generic, slack, "
            "feishu, dingtalk, wecom, alertmanager, jsonl, log");
}

}  // namespace
}  // namespace lockstep::alerting
