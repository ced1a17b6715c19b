// Message formats: how one Alert becomes the body of a request to its sink's kind of
// receiver, and how the receiver's answer is read. Each kind's own format is in its file
// under sinks/ (sink_type.h); here are the entry points that find it, the spool's
// decoder and the pieces several kinds' messages share. Pure functions, any thread.
#ifndef LOCKSTEP_ALERTING_SRC_FORMATS_H_
#define LOCKSTEP_ALERTING_SRC_FORMATS_H_

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "lockstep/alerting/alert.h"
#include "lockstep/alerting/alert_json.h"
#include "lockstep/alerting/options.h"
#include "lockstep/common/status.h"

namespace lockstep::alerting {

struct Payload {
  std::string body;          // JSON
  std::string query_suffix;  // appended to the URL's query (DingTalk signing), "" or "k=v&..."
};

// The body (and query) `sink`'s kind sends for `alert`; `now_unix_ms` stamps
// signatures (Feishu, DingTalk) and a missing first_seen.
Payload FormatAlert(const SinkOptions& sink, const Alert& alert, int64_t now_unix_ms);

// Generic JSON (every field, NaN as null): AlertToJson in lockstep/alerting/alert_json.h.
// The inverse, for the spool. Unknown fields are ignored; a bad record is Corruption.
StatusOr<Alert> AlertFromJson(const std::string& json);
// RFC 3339 UTC with milliseconds, e.g. "2024-05-01T12:00:00.123Z".
std::string Rfc3339(int64_t unix_ns);

// Bot APIs (Feishu, DingTalk, WeCom) answer HTTP 200 with an error code in the body.
struct ReplyVerdict {
  bool ok = false;
  bool retryable = false;
  std::string detail;  // e.g. "HTTP 200", "HTTP 200 code 19021: sign match fail"
};
// The status code's verdict (2xx delivered; 408, 429, 5xx retryable), then for a 2xx
// the kind's reading of the body (SinkType::judge_body).
ReplyVerdict JudgeReply(const std::string& kind, int http_status, const std::string& body);

// The pieces the kinds' messages share (sinks/).
// "[critical] lockstep first_divergence in <experiment>" (with the incident's news).
std::string AlertTitle(const Alert& a);
// The markdown lines under the title; `bold` is "*" (Slack), "**" or "" (plain text).
std::string AlertDetails(const Alert& a, const std::string& bold);
// %.6g, "n/a" for NaN.
std::string FormatNumber(double v);
// The alert's runs joined by `sep`.
std::string JoinRuns(const Alert& a, const char* sep);
// Compact JSON; invalid UTF-8 from detector strings is replaced, never thrown on.
std::string DumpJson(const nlohmann::json& j);
// base64 of HMAC-SHA256(key, msg): the bots' signatures.
std::string HmacSha256Base64(const std::string& key, const std::string& msg);
// A bot's 2xx answer with a non-zero error code in its body turns `v` into a failure
// (retryable for the frequency limits we know). The code and message are read from the
// first of the keys the body has (else the last).
void ReadBotErrorCode(const std::string& body, std::initializer_list<const char*> code_keys,
                      std::initializer_list<const char*> msg_keys, ReplyVerdict* v);

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_SRC_FORMATS_H_
