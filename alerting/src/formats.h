// Message formats: how one Alert becomes the body of a request to each kind of
// receiver, and how each receiver's answer is read. Pure functions, any thread.
#ifndef LOCKSTEP_ALERTING_SRC_FORMATS_H_
#define LOCKSTEP_ALERTING_SRC_FORMATS_H_

#include <cstdint>
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

// `now_unix_ms` stamps signatures (Feishu, DingTalk) and a missing first_seen.
Payload FormatAlert(const SinkOptions& sink, const Alert& alert, int64_t now_unix_ms);

// Generic JSON (every field, NaN as null): AlertToJson in lockstep/alerting/alert_json.h.
// The inverse, for the spool. Unknown fields are ignored; a bad record is Corruption.
StatusOr<Alert> AlertFromJson(const std::string& json);
// One human line for the log sink.
std::string AlertToLogLine(const Alert& alert);
// RFC 3339 UTC with milliseconds, e.g. "2024-05-01T12:00:00.123Z".
std::string Rfc3339(int64_t unix_ns);

// Bot APIs (Feishu, DingTalk, WeCom) answer HTTP 200 with an error code in the body.
struct ReplyVerdict {
  bool ok = false;
  bool retryable = false;
  std::string detail;  // e.g. "HTTP 200", "HTTP 200 code 19021: sign match fail"
};
ReplyVerdict JudgeReply(SinkKind kind, int http_status, const std::string& body);

// Signatures, exposed for tests.
std::string FeishuSign(int64_t timestamp_s, const std::string& secret);
std::string DingTalkSign(int64_t timestamp_ms, const std::string& secret);  // not URL-encoded
std::string UrlEncode(const std::string& s);

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_SRC_FORMATS_H_
