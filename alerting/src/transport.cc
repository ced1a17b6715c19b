#include "transport.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "formats.h"
#include "lockstep/common/clock.h"

namespace lockstep::alerting {
StatusOr<std::unique_ptr<Transport>> Transport::Create(const SinkOptions& sink,
                                                       const std::string& display_name) {
  std::unique_ptr<Transport> t(new Transport());
  t->sink_ = sink;
  t->name_ = display_name;
  if (sink.kind == SinkKind::kJsonl) {
    std::error_code ec;
    auto parent = std::filesystem::path(sink.target).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    t->file_.open(sink.target, std::ios::app | std::ios::binary);
    if (!t->file_) {
      const int err = errno;
      std::string why = std::filesystem::is_directory(sink.target, ec)
                            ? "it is a directory: give a file path, e.g. " +
                                  (std::filesystem::path(sink.target) / "alerts.jsonl").string()
                            : std::string(std::strerror(err)) + ": check the path and its permissions";
      return Status::InvalidArgument("cannot open alerts file '" + sink.target + "' for appending: " + why);
    }
    return t;
  }
  if (!IsHttpKind(sink.kind)) return t;
  auto url = ParseUrl(sink.target, "URL of alert sink " + display_name);
  if (!url.ok()) return url.status();
  t->url_ = *url;
  if (sink.kind == SinkKind::kAlertmanager) {
    // Accept the base URL (http://am:9093) as well as the full API path.
    std::string& target = t->url_.target;
    size_t q = target.find('?');
    std::string path = target.substr(0, q), query = q == std::string::npos ? "" : target.substr(q);
    if (path.size() < 14 || path.compare(path.size() - 14, 14, "/api/v2/alerts") != 0) {
      while (!path.empty() && path.back() == '/') path.pop_back();
      target = path + "/api/v2/alerts" + query;
    }
  }
  HttpClient::Options ho;
  ho.connect_timeout = sink.connect_timeout;
  ho.request_timeout = sink.request_timeout;
  ho.ca_file = sink.ca_file;
  auto client = HttpClient::Create(ho);
  if (!client.ok())
    return Status::InvalidArgument("alert sink " + display_name + ": " + client.status().message());
  t->http_ = std::move(client.value());
  return t;
}

void Transport::Abort() noexcept {
  if (http_) http_->Abort();
}

AttemptResult Transport::Deliver(const Alert& alert) {
  AttemptResult r;
  switch (sink_.kind) {
    case SinkKind::kLog: {
      auto level = alert.severity == Severity::kCritical  ? spdlog::level::err
                   : alert.severity == Severity::kWarning ? spdlog::level::warn
                                                          : spdlog::level::info;
      spdlog::log(level, "alert: {}", AlertToLogLine(alert));
      r.ok = true;
      r.detail = "logged";
      return r;
    }
    case SinkKind::kJsonl: {
      file_ << AlertToJson(alert, UnixNowNs() / 1'000'000) << '\n';
      file_.flush();
      r.ok = static_cast<bool>(file_);
      if (!r.ok) {
        file_.clear();
        r.retryable = true;  // a full disk may get space again
        r.detail = "cannot write to alerts file '" + sink_.target + "'";
      } else {
        r.detail = "written";
      }
      return r;
    }
    default:
      break;
  }
  Payload p = FormatAlert(sink_, alert, UnixNowNs() / 1'000'000);
  std::vector<std::pair<std::string, std::string>> headers;
  if (!sink_.token.empty()) headers.emplace_back("Authorization", "Bearer " + sink_.token);
  auto resp = http_->Post(url_, p.query_suffix, p.body, "application/json", headers);
  if (!resp.ok()) {
    r.retryable = true;
    r.detail = resp.status().message();
    return r;
  }
  ReplyVerdict v = JudgeReply(sink_.kind, resp->status, resp->body);
  r.ok = v.ok;
  r.retryable = v.retryable;
  r.detail = v.detail;
  return r;
}

}  // namespace lockstep::alerting
