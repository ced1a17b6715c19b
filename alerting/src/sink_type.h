// SinkType: what one kind of alert sink does differently from the others, as one
// constant table per kind (spdlog's sinks/, OpenTelemetry's exporters): its names, its
// extra option checks, and either how it delivers locally (log, jsonl) or, for an HTTP
// kind, the body it POSTs and how it reads the receiver's 2xx answer. What every kind
// shares — queue, filters, rate limit, incidents, spool, retries — is SinkWorker's
// (sink_worker.h); the POST itself, its status codes and timeouts are the HTTP
// transport's (transport.h). The registry (sink_registry.cc) is the one list of kinds:
// SinkOptions::kind names one, and the CLI's flags, checks and --help ask it
// (SinkKinds() in lockstep/alerting/options.h) rather than naming kinds themselves.
//
// How to add a sink: one file sinks/<name>_sink.cc that defines
// `extern const SinkType k<Name>Sink` (a local kind sets `open`, an HTTP kind `format`
// and, if its receiver answers errors with HTTP 2xx, `judge_body`; the pieces messages
// share are in formats.h), and its line `SINK(<Name>)` in sink_registry.cc, where the
// order is the one messages and --help list the kinds in. alerting/CMakeLists.txt
// builds every sinks/*_sink.cc without an edit. Then a row in docs/alerting.md "Sinks
// and message formats". `--alert-sink kind=<name>` takes it at once, and so does
// `--webhook-format <name>` for an HTTP kind (unless `webhook_format` is false), with
// --webhook-secret / --webhook-token when it `signs` / takes a `bearer_token`; a flag of
// its own is the CLI's (collector/src/cli/alerting_flags.cc).
//
// Threads: the tables are constants and their functions keep no state (`open` makes
// a Transport, whose header says its threads); any thread may call them.
#ifndef LOCKSTEP_ALERTING_SRC_SINK_TYPE_H_
#define LOCKSTEP_ALERTING_SRC_SINK_TYPE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "formats.h"
#include "lockstep/alerting/alert.h"
#include "lockstep/alerting/options.h"
#include "lockstep/common/status.h"
#include "transport.h"

namespace lockstep::alerting {

struct SinkType {
  // SinkOptions::kind, default sink names ("slack-0"), spool folders, metrics labels.
  const char* name;
  // Other names SinkOptions::kind and ParseSinkKind take (up to three; the unused ones null).
  const char* aliases[3] = {};
  // How ParseSinkKind's error lists the kind; null: `name`.
  const char* listed_as = nullptr;
  // True: POSTs over HTTP(S) to a URL, may be unreachable (spools, retries) and
  // notifies per incident. False: local; keeps every alert and never spools to disk.
  bool http = false;
  // Takes a signing secret (SinkOptions::secret); the other kinds refuse one.
  bool signs = false;
  // Sends SinkOptions::token as "Authorization: Bearer" (--webhook-token is for these).
  bool bearer_token = false;
  // HTTP kinds: --webhook-format may name it, POSTed to the URL --webhook gives. False
  // for a kind the CLI gives a flag of its own (Alertmanager: --alertmanager, a base URL).
  bool webhook_format = true;
  // Checks beyond the shared ones (an HTTP kind's URL is checked for every kind);
  // `who` names the sink for the sentence. Null: none.
  Status (*validate)(const SinkOptions& sink, const std::string& who) = nullptr;
  // Local kinds: opens the sink; `display_name` names it in messages.
  StatusOr<std::unique_ptr<Transport>> (*open)(const SinkOptions& sink,
                                               const std::string& display_name) = nullptr;
  // HTTP kinds: the request for one alert; `now_unix_ms` stamps signatures and a
  // missing first_seen. Null: the generic JSON (AlertToJson).
  Payload (*format)(const SinkOptions& sink, const Alert& alert, int64_t now_unix_ms) = nullptr;
  // HTTP kinds whose receiver answers some errors with HTTP 2xx: reads the body and
  // turns `v` (ok, "HTTP 200") into the failure it reports. Null: every 2xx is delivered.
  void (*judge_body)(const std::string& body, ReplyVerdict* v) = nullptr;
  // HTTP kinds: the request target to POST to, from the one the URL gives (Alertmanager
  // takes its base URL). Null: as given.
  std::string (*request_target)(const std::string& target) = nullptr;
};

// The registered kinds, in the order ParseSinkKind's error lists them.
std::span<const SinkType* const> AllSinkTypes();
// The type `kind` names (its name or an alias); null when none does.
const SinkType* FindSinkType(const std::string& kind);
// The type of SinkOptions::kind. A name no kind has (ValidateOptions refuses it first)
// gets a type that refuses to open, so nothing else has to check.
const SinkType& SinkTypeOf(const std::string& kind);

// How messages and counters name the sink: its name, else "<kind>-<index>" ("slack-0").
std::string SinkDisplayName(const SinkOptions& sink, size_t index);
// What logs and counters may show of its target: an HTTP kind's URL redacted
// (RedactUrl), a file path as it is.
std::string SinkShownTarget(const SinkOptions& sink);

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_SRC_SINK_TYPE_H_
