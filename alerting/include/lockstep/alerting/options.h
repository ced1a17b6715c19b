// AlertingOptions: what the alerting component is told to do — which sinks, how
// each delivers (timeouts, retries, TLS, secrets), the spool and dedup settings.
// Plain values, filled by the CLI (collector/src/cli/alerting_flags.h) or by tests,
// and checked by Dispatcher::Create(), which turns every mistake into one sentence.
#ifndef LOCKSTEP_ALERTING_OPTIONS_H_
#define LOCKSTEP_ALERTING_OPTIONS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/alerting/alert.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/status.h"

namespace lockstep::alerting {

// The registered sink kinds (one file each under alerting/src/sinks/, listed in
// sink_registry.cc) as a front end sees them: what to call them, and which of the
// options below each takes. The CLI builds its flags' --help and checks from these.
struct SinkKindInfo {
  const char* name;       // "webhook", "slack", ...: SinkOptions::kind, default sink names
  const char* listed_as;  // how lists show it to users: "generic" for the webhook
  bool http;              // POSTs to a URL; log and jsonl are local
  bool webhook_format;    // an HTTP kind POSTed to the URL as given (--webhook-format)
  bool signs;             // takes SinkOptions::secret
  bool bearer_token;      // sends SinkOptions::token as "Authorization: Bearer"
};
// Every registered kind, in the order messages list them (generic, slack, ...).
std::span<const SinkKindInfo> SinkKinds();
// The kind `name` names, by its name or an alias ("lark" is feishu, "generic" and "json"
// the webhook, "wechat" and "wxwork" wecom); null when none does.
const SinkKindInfo* FindSinkKind(const std::string& name);
// The kind's name ("lark" -> "feishu"), or the sentence that lists the kinds.
StatusOr<std::string> ParseSinkKind(const std::string& name);
// The `listed_as` names of the kinds `pick` takes, in order, joined by `sep` and the last
// two by `last_sep`: "feishu and dingtalk", "generic|slack|...".
std::string ListSinkKinds(bool (*pick)(const SinkKindInfo&), const std::string& sep,
                          const std::string& last_sep);
StatusOr<Severity> ParseSeverity(const std::string& name);

struct SinkOptions {
  // Which kind of sink, by its name (SinkKinds(); an alias is taken too). A name, not
  // an enum or a handle: it is what users write in flags and settings files and what the
  // registry is keyed by, so a new kind is one file under alerting/src/sinks/ and its
  // line in the registry, and no header that every user of these options includes has to
  // change. ValidateOptions refuses a name no kind has, in one sentence listing them.
  std::string kind = "webhook";
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
