// DingTalk custom robot: markdown, signed in the URL's query (timestamp, sign) when a
// secret is set. The robot answers errors with HTTP 200 and `errcode`/`errmsg`.
#include <nlohmann/json.hpp>

#include "lockstep/common/url_encoding.h"
#include "sink_type.h"

namespace lockstep::alerting {
namespace {

using nlohmann::json;

// key = secret, message = "<timestamp_ms>\n<secret>"; not URL-encoded.
std::string DingTalkSign(int64_t timestamp_ms, const std::string& secret) {
  return HmacSha256Base64(secret, std::to_string(timestamp_ms) + "\n" + secret);
}

Payload Format(const SinkOptions& sink, const Alert& a, int64_t now_unix_ms) {
  Payload p;
  p.body = DumpJson({{"msgtype", "markdown"},
                     {"markdown",
                      {{"title", AlertTitle(a)},
                       {"text", "### " + AlertTitle(a) + "\n\n" + AlertDetails(a, "**")}}}});
  if (!sink.secret.empty()) {
    p.query_suffix = "timestamp=" + std::to_string(now_unix_ms) +
                     "&sign=" + UrlEncode(DingTalkSign(now_unix_ms, sink.secret));
  }
  return p;
}

void JudgeBody(const std::string& body, ReplyVerdict* v) {
  ReadBotErrorCode(body, {"errcode"}, {"errmsg"}, v);
}

}  // namespace

extern const SinkType kDingTalkSink{
    .name = "dingtalk", .http = true, .signs = true, .format = Format, .judge_body = JudgeBody};

}  // namespace lockstep::alerting
