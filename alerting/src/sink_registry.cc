// The registry of sink kinds (sink_type.h): one table, one line a kind.
#include "sink_type.h"

namespace lockstep::alerting {

extern const SinkType kWebhookSink, kSlackSink, kFeishuSink, kDingTalkSink, kWeComSink,
    kAlertmanagerSink, kJsonlSink, kLogSink;

namespace {

// In the order ParseSinkKind's error lists them.
constexpr const SinkType* kSinkTypes[] = {
    &kWebhookSink,       // sinks/webhook_sink.cc
    &kSlackSink,         // sinks/slack_sink.cc
    &kFeishuSink,        // sinks/feishu_sink.cc
    &kDingTalkSink,      // sinks/dingtalk_sink.cc
    &kWeComSink,         // sinks/wecom_sink.cc
    &kAlertmanagerSink,  // sinks/alertmanager_sink.cc
    &kJsonlSink,         // sinks/jsonl_sink.cc
    &kLogSink,           // sinks/log_sink.cc
};

// A SinkKind value without a type (a cast from a bad integer): named "unknown", as
// SinkKindName always said, and refused when opened.
StatusOr<std::unique_ptr<Transport>> OpenUnknownKind(const SinkOptions&, const std::string& name) {
  return Status::InvalidArgument("alert sink " + name + " has an unknown kind");
}
const SinkType kUnknownSink{.kind = SinkKind::kLog, .name = "unknown", .open = OpenUnknownKind};

}  // namespace

std::span<const SinkType* const> AllSinkTypes() { return kSinkTypes; }

const SinkType& SinkTypeOf(SinkKind kind) {
  for (const SinkType* t : kSinkTypes)
    if (t->kind == kind) return *t;
  return kUnknownSink;
}

std::string SinkDisplayName(const SinkOptions& sink, size_t index) {
  return sink.name.empty() ? std::string(SinkTypeOf(sink.kind).name) + "-" + std::to_string(index)
                           : sink.name;
}

std::string SinkShownTarget(const SinkOptions& sink) {
  return SinkTypeOf(sink.kind).http ? RedactUrl(sink.target) : sink.target;
}

}  // namespace lockstep::alerting
