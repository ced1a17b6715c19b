// The jsonl sink (--alerts-file PATH): one generic JSON object (AlertToJson) per line,
// appended and flushed (docs/alerting.md "Sinks and message formats"). Local: a failed
// write (a full disk) is retried, never spooled to disk.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "lockstep/common/clock.h"
#include "sink_type.h"

namespace lockstep::alerting {
namespace {

class JsonlTransport final : public Transport {
 public:
  explicit JsonlTransport(std::string path) : path_(std::move(path)) {}

  // Creates the file's folder; fails with the reason in one sentence.
  Status Open() {
    std::error_code ec;
    auto parent = std::filesystem::path(path_).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    file_.open(path_, std::ios::app | std::ios::binary);
    if (file_) return Status::OK();
    const int err = errno;
    std::string why =
        std::filesystem::is_directory(path_, ec)
            ? "it is a directory: give a file path, e.g. " +
                  (std::filesystem::path(path_) / "alerts.jsonl").string()
            : std::string(std::strerror(err)) + ": check the path and its permissions";
    return Status::InvalidArgument("cannot open alerts file '" + path_ + "' for appending: " + why);
  }

  AttemptResult Deliver(const Alert& alert) override {
    AttemptResult r;
    file_ << AlertToJson(alert, UnixNowNs() / 1'000'000) << '\n';
    file_.flush();
    r.ok = static_cast<bool>(file_);
    if (!r.ok) {
      file_.clear();
      r.retryable = true;  // a full disk may get space again
      r.detail = "cannot write to alerts file '" + path_ + "'";
    } else {
      r.detail = "written";
    }
    return r;
  }

 private:
  const std::string path_;
  std::ofstream file_;
};

StatusOr<std::unique_ptr<Transport>> Open(const SinkOptions& sink, const std::string&) {
  auto t = std::make_unique<JsonlTransport>(sink.target);
  LOCKSTEP_RETURN_IF_ERROR(t->Open());
  return std::unique_ptr<Transport>(std::move(t));
}

Status Validate(const SinkOptions& sink, const std::string& who) {
  if (sink.target.empty())
    return Status::InvalidArgument(who + " has no file path: give --alerts-file PATH");
  return Status::OK();
}

}  // namespace

extern const SinkType kJsonlSink{
    .name = "jsonl", .aliases = {"file"}, .validate = Validate, .open = Open};

}  // namespace lockstep::alerting
