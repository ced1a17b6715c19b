// Slack incoming webhook: a header block with the title, a section with the details
// (mrkdwn, *bold*), and `text` as the fallback notifications show. Any 2xx is delivered.
#include <nlohmann/json.hpp>

#include "sink_type.h"

namespace lockstep::alerting {
namespace {

using nlohmann::json;

Payload Format(const SinkOptions&, const Alert& a, int64_t) {
  json blocks = json::array();
  blocks.push_back(
      {{"type", "header"}, {"text", {{"type", "plain_text"}, {"text", AlertTitle(a)}}}});
  blocks.push_back(
      {{"type", "section"}, {"text", {{"type", "mrkdwn"}, {"text", AlertDetails(a, "*")}}}});
  return Payload{DumpJson({{"text", AlertTitle(a) + ": " + a.message}, {"blocks", blocks}}), ""};
}

}  // namespace

extern const SinkType kSlackSink{.name = "slack", .http = true, .format = Format};

}  // namespace lockstep::alerting
