// The registry of sink kinds (sink_type.h): one list, one line a kind.
#include "sink_type.h"

namespace lockstep::alerting {

// The kinds, in the order ParseSinkKind's error and `lockstep collect --help` list them.
// SINK(Slack) registers kSlackSink, the table sinks/slack_sink.cc defines: the one line
// both declares it and lists it, so a new kind is that file and this line.
#define LOCKSTEP_ALERT_SINKS(SINK) \
  SINK(Webhook)                    \
  SINK(Slack)                      \
  SINK(Feishu)                     \
  SINK(DingTalk)                   \
  SINK(WeCom)                      \
  SINK(Alertmanager)               \
  SINK(Jsonl)                      \
  SINK(Log)

#define LOCKSTEP_DECLARE_SINK(Name) extern const SinkType k##Name##Sink;
LOCKSTEP_ALERT_SINKS(LOCKSTEP_DECLARE_SINK)
#undef LOCKSTEP_DECLARE_SINK

namespace {

#define LOCKSTEP_LIST_SINK(Name) &k##Name##Sink,
constexpr const SinkType* kSinkTypes[] = {LOCKSTEP_ALERT_SINKS(LOCKSTEP_LIST_SINK)};
#undef LOCKSTEP_LIST_SINK

// A kind no table has (only reachable by skipping ValidateOptions): refused when opened,
// and nothing it formats is sent.
StatusOr<std::unique_ptr<Transport>> OpenUnknownKind(const SinkOptions&, const std::string& name) {
  return Status::InvalidArgument("alert sink " + name + " has an unknown kind");
}
const SinkType kUnknownSink{.name = "unknown", .open = OpenUnknownKind};

}  // namespace

std::span<const SinkType* const> AllSinkTypes() { return kSinkTypes; }

const SinkType* FindSinkType(const std::string& kind) {
  for (const SinkType* t : kSinkTypes) {
    if (kind == t->name) return t;
    for (const char* alias : t->aliases)
      if (alias && kind == alias) return t;
  }
  return nullptr;
}

const SinkType& SinkTypeOf(const std::string& kind) {
  const SinkType* t = FindSinkType(kind);
  return t ? *t : kUnknownSink;
}

std::string SinkDisplayName(const SinkOptions& sink, size_t index) {
  if (!sink.name.empty()) return sink.name;
  // An unknown kind is named as given, so the sentence refusing it says which.
  const SinkType* t = FindSinkType(sink.kind);
  return (t ? std::string(t->name) : sink.kind) + "-" + std::to_string(index);
}

std::string SinkShownTarget(const SinkOptions& sink) {
  return SinkTypeOf(sink.kind).http ? RedactUrl(sink.target) : sink.target;
}

}  // namespace lockstep::alerting
