// Feishu / Lark custom bot: an interactive card coloured by severity, or plain text
// (SinkOptions::feishu_text); signed in the body when a secret is set. The bot answers
// errors with HTTP 200 and a code in the body (`code`/`msg`, older bots
// `StatusCode`/`StatusMessage`).
#include <nlohmann/json.hpp>

#include "sink_type.h"

namespace lockstep::alerting {
namespace {

using nlohmann::json;

// key = "<timestamp>\n<secret>", message empty, base64 of the HMAC-SHA256.
std::string FeishuSign(int64_t timestamp_s, const std::string& secret) {
  return HmacSha256Base64(std::to_string(timestamp_s) + "\n" + secret, "");
}

Payload Format(const SinkOptions& sink, const Alert& a, int64_t now_unix_ms) {
  json j;
  if (sink.feishu_text) {
    j = {{"msg_type", "text"}, {"content", {{"text", AlertTitle(a) + "\n" + AlertDetails(a, "")}}}};
  } else {
    const char* color = a.severity == Severity::kCritical  ? "red"
                        : a.severity == Severity::kWarning ? "orange"
                                                           : "blue";
    j = {{"msg_type", "interactive"},
         {"card",
          {{"config", {{"wide_screen_mode", true}}},
           {"header",
            {{"title", {{"tag", "plain_text"}, {"content", AlertTitle(a)}}}, {"template", color}}},
           {"elements",
            json::array({{{"tag", "div"},
                          {"text", {{"tag", "lark_md"}, {"content", AlertDetails(a, "**")}}}}})}}}};
  }
  if (!sink.secret.empty()) {
    int64_t ts = now_unix_ms / 1000;
    j["timestamp"] = std::to_string(ts);
    j["sign"] = FeishuSign(ts, sink.secret);
  }
  return Payload{DumpJson(j), ""};
}

void JudgeBody(const std::string& body, ReplyVerdict* v) {
  ReadBotErrorCode(body, {"code", "StatusCode"}, {"msg", "StatusMessage"}, v);
}

}  // namespace

extern const SinkType kFeishuSink{
    .name = "feishu",
    .aliases = {"lark"},
    .http = true,
    .signs = true,
    .format = Format,
    .judge_body = JudgeBody};

}  // namespace lockstep::alerting
