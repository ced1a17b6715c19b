#include "lockstep/alerting/dispatcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "sink_type.h"
#include "sink_worker.h"
#include "transport.h"

namespace lockstep::alerting {

StatusOr<std::unique_ptr<Dispatcher>> Dispatcher::Create(const AlertingOptions& options) {
  LOCKSTEP_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<Dispatcher> d(new Dispatcher());
  for (size_t i = 0; i < options.sinks.size(); ++i) {
    auto w = SinkWorker::Create(options.sinks[i], options, i);
    if (!w.ok()) return w.status();  // workers made so far stop in ~Dispatcher
    d->workers_.push_back(std::move(w.value()));
  }
  for (const auto& w : d->workers_) {
    SinkCounters c = w->Snapshot();
    spdlog::info("alerting: sink {} -> {}", c.name, c.target);
  }
  return d;
}

Dispatcher::~Dispatcher() { Shutdown(std::chrono::seconds(2)); }

bool Dispatcher::Submit(Alert alert) noexcept {
  bool all = true;
  // Each worker copies; the last could take the original by move, but alerts are rare
  // and a copy keeps Enqueue's contract simple.
  for (const auto& w : workers_) all = w->Enqueue(alert) && all;
  return all && !shut_down_.load(std::memory_order_relaxed);
}

bool Dispatcher::Flush(std::chrono::milliseconds timeout) noexcept {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool ok = true;
  try {
    for (const auto& w : workers_) ok = w->WaitIdle(deadline) && ok;
  } catch (...) {
    return false;
  }
  return ok;
}

void Dispatcher::Shutdown(std::chrono::milliseconds timeout) noexcept {
  if (shut_down_.exchange(true)) return;
  Flush(timeout);
  for (const auto& w : workers_) w->Stop();
}

std::vector<SinkCounters> Dispatcher::Counters() const {
  std::vector<SinkCounters> out;
  for (const auto& w : workers_) out.push_back(w->Snapshot());
  return out;
}

StatusOr<std::vector<SinkTestResult>> SendTestAlert(const AlertingOptions& options,
                                                    const Alert& alert) {
  LOCKSTEP_RETURN_IF_ERROR(ValidateOptions(options));
  std::vector<SinkTestResult> results;
  for (size_t i = 0; i < options.sinks.size(); ++i) {
    const SinkOptions& s = options.sinks[i];
    SinkTestResult r;
    r.name = SinkDisplayName(s, i);
    r.target = SinkShownTarget(s);
    auto t = Transport::Create(s, r.name);
    if (!t.ok()) {
      r.setup_failed = true;
      r.detail = t.status().message();
      results.push_back(std::move(r));
      continue;
    }
    std::chrono::milliseconds wait = s.backoff_base;
    for (int attempt = 0; attempt <= s.max_retries; ++attempt) {
      ++r.attempts;
      AttemptResult a = (*t)->Deliver(alert);
      r.delivered = a.ok;
      r.detail = a.detail;
      if (a.ok || !a.retryable) break;
      if (attempt < s.max_retries) {
        // A person is waiting at the terminal: keep the pauses short.
        std::this_thread::sleep_for(std::min(wait, std::chrono::milliseconds(2000)));
        wait *= 2;
      }
    }
    if (!r.delivered && r.attempts > 1) r.detail += " (after " + std::to_string(r.attempts) + " attempts)";
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace lockstep::alerting
