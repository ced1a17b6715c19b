// AlertingOptions: what the alerting component is told to do — which sinks, how
// each delivers (timeouts, retries, TLS, secrets), the spool and dedup settings.
// Plain values, filled by the CLI (collector/src/cli/alerting_flags.h) or by tests,
// and checked by Dispatcher::Create(), which turns every mistake into one sentence.
#ifndef LOCKSTEP_ALERTING_OPTIONS_H_
#define LOCKSTEP_ALERTING_OPTIONS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/alerting/alert.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/status.h"

namespace lockstep::alerting {

enum class SinkKind : uint8_t {
  kLog,           // one spdlog line per alert
  kJsonl,         // one JSON object per line appended to a file
  kWebhook,       // generic JSON POST with every alert field
  kSlack,         // Slack incoming webhook (blocks + text fallback)
  kFeishu,        // Feishu / Lark custom bot (interactive card or text; optional signing)
  kDingTalk,      // DingTalk custom robot (markdown; optional signing)
  kWeCom,         // WeCom (WeChat Work) group robot (markdown)
  kAlertmanager,  // Prometheus Alertmanager v2: POST <base>/api/v2/alerts
};

// "log", "jsonl", "webhook", ... ; ParseSinkKind also accepts "generic" (= webhook),
// "lark" (= feishu), "wechat"/"wxwork" (= wecom).
const char* SinkKindName(SinkKind k);
StatusOr<SinkKind> ParseSinkKind(const std::string& name);
StatusOr<Severity> ParseSeverity(const std::string& name);
// True for the kinds that POST over HTTP(S) (everything but log and jsonl).
bool IsHttpKind(SinkKind k);

struct SinkOptions {
  SinkKind kind = SinkKind::kWebhook;
  // URL (HTTP kinds; the Alertmanager base URL or the full .../api/v2/alerts URL) or
  // file path (jsonl). "env:NAME" is resolved by the CLI, not here.
  std::string target;
  // Shown in logs and counters; default "<kind>-<index>" (e.g. "slack-0").
  std::string name;
  Severity min_severity = Severity::kInfo;
  // Token bucket: at most `burst` messages at once, refilled at `rate_per_min`.
  // rate_per_min <= 0 turns the limit off. Critical news always passes; what the
  // bucket holds back is merged into the incident's next message (grouping sinks) or
  // dropped and counted (the others).
  double rate_per_min = 60;
  int burst = 20;
  std::chrono::milliseconds connect_timeout{3000};
  std::chrono::milliseconds request_timeout{10000};  // whole request: TLS, write, read
  // Attempts after the first before an alert counts as spooled; the sink keeps
  // retrying it afterwards (backoff capped at backoff_max) until it is delivered.
  int max_retries = 3;
  std::chrono::milliseconds backoff_base{500};
  std::chrono::milliseconds backoff_max{60000};
  std::string ca_file;  // extra trusted CA (PEM) besides the system store
  std::string secret;   // feishu / dingtalk signing secret
  std::string token;    // "Authorization: Bearer" for webhook / alertmanager
  bool feishu_text = false;   // msg_type "text" instead of "interactive"
  std::string generator_url;  // alertmanager generatorURL (optional)
  // Dedup cooldown for this sink; negative = AlertingOptions::dedup_cooldown.
  std::chrono::milliseconds cooldown{-1};
};

struct AlertingOptions {
  std::vector<SinkOptions> sinks;
  // Where undelivered alerts of HTTP sinks wait (one subfolder per sink, named from
  // its kind and a hash of its URL so a restart finds them). "" = in memory only.
  std::string spool_dir;
  // Each sink also keeps there (sent/<kind>-<hash>.journal) the alerts it has handled,
  // so alerts replayed by a restarted collector are not sent twice; "" = none.
  uint64_t spool_max_bytes = 64ull << 20;  // per sink; oldest dropped and counted
  size_t memory_spool_max = 10000;         // per sink, when spool_dir is ""
  // An alert with the same DedupKey() within this time of the last one sent by a
  // sink is suppressed there (counted; the next one sent carries repeat_count).
  std::chrono::milliseconds dedup_cooldown{std::chrono::minutes(5)};
  // HTTP sinks (webhooks, chat bots, Alertmanager) notify per incident, not per alert
  // (docs/alerting.md "Incidents"); log and jsonl sinks keep every alert.
  bool group_incidents = true;
  // While an incident lasts, what joined it since its last message is sent as one
  // digest at most this often (0 = no digests: only open / escalate / resolve).
  std::chrono::milliseconds incident_digest_interval{std::chrono::minutes(5)};
  // An incident that no alert joined for this long is resolved (0 = never).
  std::chrono::milliseconds incident_resolve_after{std::chrono::minutes(10)};
  size_t queue_capacity = 4096;  // per sink; Submit drops (and counts) beyond it
  // Time for dedup, rate limit, incidents and the sent journal; null: the real clock
  // (tests inject a FakeClock, which must outlive the Dispatcher).
  const Clock* clock = nullptr;
};

// Checks every field; returns the first mistake as one sentence naming the sink.
Status ValidateOptions(const AlertingOptions& options);

// "https://oapi.dingtalk.com/robot/send?access_token=abcd***": what logs may show of
// a URL (userinfo, most of the path and every query value redacted).
std::string RedactUrl(const std::string& url);
// First 4 characters then "***" ("" stays "").
std::string RedactSecret(const std::string& secret);

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_OPTIONS_H_
