#include "transport.h"

#include "http_client.h"
#include "lockstep/common/clock.h"
#include "sink_type.h"
#include "url.h"

namespace lockstep::alerting {
namespace {

// Every HTTP kind: POSTs the kind's payload to its URL (with the bearer token when one
// is set) and judges the answer by its status code and the kind's reading of the body.
class HttpTransport final : public Transport {
 public:
  static StatusOr<std::unique_ptr<Transport>> Create(const SinkType& type, const SinkOptions& sink,
                                                     const std::string& display_name) {
    std::unique_ptr<HttpTransport> t(new HttpTransport());
    t->sink_ = sink;
    auto url = ParseUrl(sink.target, "URL of alert sink " + display_name);
    if (!url.ok()) return url.status();
    t->url_ = *url;
    if (type.request_target) t->url_.target = type.request_target(t->url_.target);
    HttpClient::Options ho;
    ho.connect_timeout = sink.connect_timeout;
    ho.request_timeout = sink.request_timeout;
    ho.ca_file = sink.ca_file;
    auto client = HttpClient::Create(ho);
    if (!client.ok())
      return Status::InvalidArgument("alert sink " + display_name + ": " +
                                     client.status().message());
    t->http_ = std::move(client.value());
    return std::unique_ptr<Transport>(std::move(t));
  }

  AttemptResult Deliver(const Alert& alert) override {
    AttemptResult r;
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

  void Abort() noexcept override { http_->Abort(); }

 private:
  HttpTransport() = default;
  SinkOptions sink_;
  Url url_;
  std::unique_ptr<HttpClient> http_;  // never null once created
};

}  // namespace

StatusOr<std::unique_ptr<Transport>> Transport::Create(const SinkOptions& sink,
                                                       const std::string& display_name) {
  const SinkType& type = SinkTypeOf(sink.kind);
  if (type.http) return HttpTransport::Create(type, sink, display_name);
  return type.open(sink, display_name);
}

}  // namespace lockstep::alerting
