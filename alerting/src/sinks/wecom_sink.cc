// WeCom (WeChat Work) group robot: markdown with the title coloured by severity. The
// robot answers errors with HTTP 200 and `errcode`/`errmsg`.
#include <nlohmann/json.hpp>

#include "sink_type.h"

namespace lockstep::alerting {
namespace {

Payload Format(const SinkOptions&, const Alert& a, int64_t) {
  const char* color = a.severity == Severity::kCritical  ? "warning"
                      : a.severity == Severity::kWarning ? "comment"
                                                         : "info";
  std::string content = "### <font color=\"" + std::string(color) + "\">" + AlertTitle(a) +
                        "</font>\n" + AlertDetails(a, "**");
  return Payload{DumpJson({{"msgtype", "markdown"}, {"markdown", {{"content", content}}}}), ""};
}

void JudgeBody(const std::string& body, ReplyVerdict* v) {
  ReadBotErrorCode(body, {"errcode"}, {"errmsg"}, v);
}

}  // namespace

extern const SinkType kWeComSink{
    .name = "wecom",
    .aliases = {"wechat", "wxwork"},
    .http = true,
    .format = Format,
    .judge_body = JudgeBody};

}  // namespace lockstep::alerting
