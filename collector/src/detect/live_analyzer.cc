#include "detect/live_analyzer.h"

#include <chrono>
#include <exception>

#include <spdlog/spdlog.h>

#include "lockstep/common/clock.h"
#include "lockstep/common/thread_name.h"

namespace lockstep::collector {

LiveAnalyzer::LiveAnalyzer(std::unique_ptr<Analyzer> analyzer, int64_t tick_ms)
    : analyzer_(std::move(analyzer)), tick_ms_(tick_ms), clock_(analyzer_->clock()) {}

LiveAnalyzer::~LiveAnalyzer() { Shutdown(); }

void LiveAnalyzer::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] {
    SetCurrentThreadName("ls-analyzer");
    Loop();
  });
}

void LiveAnalyzer::Shutdown() {
  {
    MutexLock l(&stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LiveAnalyzer::OnMessage(const wire::Envelope& env, int64_t recv_ns) {
  MutexLock l(&mu_);
  try {
    analyzer_->OnMessage(env, recv_ns);
  } catch (const std::exception& e) {
    if (errors_.fetch_add(1, std::memory_order_relaxed) == 0) {
      spdlog::error("analyzer: {} (the message is skipped by the analysis; it is in the run log)", e.what());
    }
  }
}

void LiveAnalyzer::Inspect(const std::function<void(const Analyzer&)>& fn) const {
  MutexLock l(&mu_);
  fn(*analyzer_);
}

void LiveAnalyzer::Mutate(const std::function<void(Analyzer&)>& fn) {
  MutexLock l(&mu_);
  fn(*analyzer_);
}

void LiveAnalyzer::Loop() {
  while (true) {
    {
      MutexLock l(&stop_mu_);
      if (stop_cv_.wait_for(l.native(), std::chrono::milliseconds(tick_ms_), [&] {
            stop_mu_.AssertHeld();
            return stop_;
          }))
        return;
    }
    const int64_t now = clock_->NowUnixNs();
    MutexLock l(&mu_);
    try {
      analyzer_->Tick(now);
    } catch (const std::exception& e) {
      if (errors_.fetch_add(1, std::memory_order_relaxed) == 0) spdlog::error("analyzer tick: {}", e.what());
    }
  }
}

}  // namespace lockstep::collector
