#include "sink_worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "lockstep/common/thread_name.h"
#include "sink_type.h"

namespace lockstep::alerting {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Repeated failure lines of one sink: at most one per this interval (the rest counted).
constexpr auto kWarnInterval = std::chrono::seconds(10);
// While incidents are open the worker looks at them at least this often, so a test's
// injected clock is noticed without a real wait of the digest interval.
constexpr auto kIncidentPoll = std::chrono::milliseconds(100);


}  // namespace

StatusOr<std::unique_ptr<SinkWorker>> SinkWorker::Create(const SinkOptions& sink,
                                                         const AlertingOptions& all, size_t index) {
  std::unique_ptr<SinkWorker> w(new SinkWorker());
  w->sink_ = sink;
  w->name_ = SinkDisplayName(sink, index);
  w->redacted_target_ = SinkShownTarget(sink);
  w->capacity_ = all.queue_capacity;
  w->clock_ = RealClockOr(all.clock);
  auto t = Transport::Create(sink, w->name_);
  if (!t.ok()) return t.status();
  w->transport_ = std::move(t.value());
  // Only HTTP sinks can be unreachable; log and jsonl are local and never spool to disk.
  // Folders are named by the kind's name, not the alias the options gave ("lark"), so
  // a restart finds them however the kind was spelt.
  const SinkType& type = SinkTypeOf(sink.kind);
  std::string dir;
  if (type.http && !all.spool_dir.empty())
    dir = (std::filesystem::path(all.spool_dir) / SpoolSubdirName(type.name, sink.target)).string();
  auto s = Spool::Open(dir, all.spool_max_bytes, all.memory_spool_max);
  if (!s.ok()) return s.status();
  w->spool_ = std::move(s.value());
  const size_t spooled = w->spool_->Size();
  {
    MutexLock lk(&w->mu_);  // no other thread yet; the lock is for the analysis
    w->spool_size_ = spooled;
  }
  if (spooled > 0)
    spdlog::info("alerting: sink {} found {} undelivered alert(s) in its spool {}; delivering them",
                 w->name_, spooled, dir);
  auto cooldown = sink.cooldown.count() >= 0 ? sink.cooldown : all.dedup_cooldown;
  w->dedup_ = std::make_unique<DedupFilter>(cooldown);
  if (!all.spool_dir.empty()) {
    const std::string jpath = (std::filesystem::path(all.spool_dir) / "sent" /
                               (SpoolSubdirName(type.name, sink.target) + ".journal"))
                                  .string();
    auto j = SentJournal::Open(jpath);
    if (!j.ok()) return j.status();
    w->journal_ = std::move(j.value());
    // The cooldown goes on across a restart: each key that passed restarts its clock at
    // its age (wall time) on this process's clock.
    const int64_t wall_now = w->clock_->NowUnixNs();
    const auto now = w->Now();
    for (const auto& e : w->journal_->passed_at_open())
      w->dedup_->Seed(e.dedup_key, e.severity, now - std::chrono::nanoseconds(wall_now - e.unix_ns),
                      e.first_seen_unix_ns);
  }
  w->rate_ = std::make_unique<RateLimiter>(sink.rate_per_min, sink.burst);
  if (all.group_incidents && type.http)
    w->incidents_ = std::make_unique<IncidentGrouper>(all.incident_digest_interval, all.incident_resolve_after);
  w->next_attempt_ = SteadyClock::now();
  w->thread_ = std::thread([p = w.get()] {
    SetCurrentThreadName("ls-alert-sink");
    p->Run();
  });
  return w;
}

SinkWorker::~SinkWorker() { Stop(); }

bool SinkWorker::Enqueue(const Alert& alert) noexcept {
  try {
    {
      MutexLock lk(&mu_);
      if (stop_ || queue_.size() >= capacity_) {
        c_.queue_dropped.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      queue_.push_back(alert);
    }
    wake_cv_.notify_one();
    return true;
  } catch (...) {  // bad_alloc: drop and count, never throw into the collector
    c_.queue_dropped.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
}

bool SinkWorker::WaitIdle(SteadyClock::time_point deadline) {
  MutexLock lk(&mu_);
  auto idle = [&] {
    mu_.AssertHeld();  // called by this thread with lk held, or by the wait below
    return queue_.empty() && spool_size_ == 0 && held_ == 0 && !busy_;
  };
  return idle_cv_.wait_until(lk.native(), deadline, [&] {
    mu_.AssertHeld();
    return stop_ || idle();
  }) && idle();
}

void SinkWorker::Stop() noexcept {
  {
    MutexLock lk(&mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  if (transport_) transport_->Abort();  // null when Create failed before the transport was made
  wake_cv_.notify_all();
  idle_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

SinkCounters SinkWorker::Snapshot() const {
  SinkCounters s;
  s.name = name_;
  s.kind = SinkTypeOf(sink_.kind).name;
  s.target = redacted_target_;
  auto r = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  s.delivered = r(c_.delivered);
  s.failed = r(c_.failed);
  s.retried = r(c_.retried);
  s.spooled = r(c_.spooled);
  s.spool_dropped = r(c_.spool_dropped);
  s.deduped = r(c_.deduped);
  s.rate_limited = r(c_.rate_limited);
  s.rate_held = r(c_.rate_held);
  s.filtered = r(c_.filtered);
  s.queue_dropped = r(c_.queue_dropped);
  s.already_sent = r(c_.already_sent);
  MutexLock lk(&mu_);
  // in_hand_ too: while the worker spools a batch (slow with an on-disk spool), those
  // alerts are in neither queue_ nor spool_size_, and pending read 0.
  s.pending = queue_.size() + in_hand_ + spool_size_ + held_;
  s.last_error = last_error_;
  return s;
}

void SinkWorker::Warn(const std::string& line) {
  auto now = SteadyClock::now();
  if (now - last_warn_ < kWarnInterval) {
    ++warns_suppressed_;
    return;
  }
  last_warn_ = now;
  if (warns_suppressed_ > 0) {
    spdlog::warn("alerting: sink {} ({}): {} ({} similar lines suppressed)", name_, redacted_target_,
                 line, warns_suppressed_);
    warns_suppressed_ = 0;
  } else {
    spdlog::warn("alerting: sink {} ({}): {}", name_, redacted_target_, line);
  }
}

std::chrono::milliseconds SinkWorker::Backoff(int attempt) {
  // Exponential with "equal jitter": half the delay fixed, half random, so sinks
  // (and collectors) that failed together do not retry in lockstep.
  double d = static_cast<double>(sink_.backoff_base.count());
  for (int i = 1; i < attempt && d < sink_.backoff_max.count(); ++i) d *= 2;
  d = std::min(d, static_cast<double>(sink_.backoff_max.count()));
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  return std::chrono::milliseconds(static_cast<int64_t>(d * jitter(rng_)));
}

void SinkWorker::Journal(const Alert& a, bool passed) {
  if (!journal_) return;
  Status s = journal_->Record(a, passed, clock_->NowUnixNs());
  if (!s.ok() && !journal_warned_) {
    journal_warned_ = true;  // once: alerts are still delivered, only restart-dedup suffers
    Warn(s.message() + "; alerts replayed after a restart may be sent again");
  }
}

void SinkWorker::Accept(Alert alert) {
  if (alert.replayed && journal_ && journal_->Contains(InstanceKey(alert))) {
    c_.already_sent.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (alert.severity < sink_.min_severity) {
    c_.filtered.fetch_add(1, std::memory_order_relaxed);
    Journal(alert, false);
    return;
  }
  auto now = Now();
  if (incidents_ && !alert.incident.empty()) {
    // Handled once grouped: a restart's replay does not group it again (the incident's
    // messages already went, or wait in the spool).
    Journal(alert, true);
    std::vector<Alert> notes;
    incidents_->Add(alert, now, &notes);
    for (auto& n : notes) Offer(std::move(n), now);
    return;
  }
  if (!dedup_->Admit(&alert, now)) {
    c_.deduped.fetch_add(1, std::memory_order_relaxed);
    Journal(alert, false);
    return;
  }
  Offer(std::move(alert), now);
}

void SinkWorker::Offer(Alert alert, std::chrono::nanoseconds now) {
  // Critical news is never refused: it takes a token when there is one. A digest or a
  // resolution is not news, even of a critical incident.
  const bool urgent = alert.severity == Severity::kCritical && alert.notification != "update" &&
                      alert.notification != "resolved";
  if (urgent) {
    rate_->Take(now);
  } else if (!rate_->Admit(now)) {
    if (incidents_ && !alert.notification.empty()) {
      // Held, not dropped: merged into the incident's next message, sent when the
      // bucket has a token again (TickIncidents).
      c_.rate_held.fetch_add(1, std::memory_order_relaxed);
      incidents_->Hold(alert);
      return;
    }
    c_.rate_limited.fetch_add(1, std::memory_order_relaxed);
    Journal(alert, false);
    Warn("rate limit reached (" + std::to_string(sink_.rate_per_min) + "/min, burst " +
         std::to_string(sink_.burst) + "); dropping non-critical alerts until it refills");
    return;
  }
  Status write_error;
  uint64_t dropped = spool_->Push(alert, &write_error);
  if (!write_error.ok()) Warn(write_error.message());
  // On disk the spool delivers it after a restart: handled. In memory it is handled
  // once delivered (AttemptHead): a crash before that sends it again (at-least-once).
  if (spool_->on_disk() && write_error.ok()) Journal(alert, true);
  if (dropped > 0) {
    c_.spool_dropped.fetch_add(dropped, std::memory_order_relaxed);
    Warn("spool full; dropped the " + std::to_string(dropped) + " oldest undelivered alert(s)");
  }
  if (down_) c_.spooled.fetch_add(1, std::memory_order_relaxed);
}

void SinkWorker::TickIncidents() {
  if (!incidents_) return;
  auto now = Now();
  const auto to_token = rate_->TimeToToken(now);
  std::vector<Alert> notes;
  incidents_->Tick(now, to_token.count() == 0, &notes);
  for (auto& n : notes) Offer(std::move(n), now);
  if (incidents_->open() == 0) {
    incident_wake_ = SteadyClock::time_point::max();
    return;
  }
  // Clock time until the next digest or resolution (or a token, for a held message),
  // slept on the steady clock; at most kIncidentPoll.
  std::chrono::nanoseconds wait = incidents_->NextDue() - Now();
  if (incidents_->held() > 0) wait = rate_->TimeToToken(Now());
  wait = std::clamp<std::chrono::nanoseconds>(wait, std::chrono::milliseconds(1), kIncidentPoll);
  incident_wake_ = SteadyClock::now() + wait;
}

void SinkWorker::AttemptHead() {
  const Alert* head = spool_->Front();
  if (head == nullptr) return;
  if (attempt_ > 0) c_.retried.fetch_add(1, std::memory_order_relaxed);
  AttemptResult r = transport_->Deliver(*head);
  auto now = SteadyClock::now();
  if (r.ok) {
    c_.delivered.fetch_add(1, std::memory_order_relaxed);
    if (!spool_->on_disk()) Journal(*head, true);
    spool_->PopFront();
    if (down_)
      spdlog::info("alerting: sink {} ({}) is reachable again; delivering {} spooled alert(s)", name_,
                   redacted_target_, spool_->Size());
    down_ = false;
    attempt_ = 0;
    next_attempt_ = now;
    MutexLock lk(&mu_);
    last_error_.clear();
    return;
  }
  bool stopping;
  {
    MutexLock lk(&mu_);
    last_error_ = r.detail;
    stopping = stop_;
  }
  if (stopping) return;  // aborted by Stop(): the alert stays spooled, nothing to report
  if (!r.retryable) {
    c_.failed.fetch_add(1, std::memory_order_relaxed);
    if (!spool_->on_disk()) Journal(*head, false);
    spdlog::error("alerting: sink {} ({}) rejected alert {} ({}): {}; not retrying, since the same "
                  "request will fail again: check the sink's URL, token and format",
                  name_, redacted_target_, head->id, head->DedupKey(), r.detail);
    spool_->PopFront();
    attempt_ = 0;
    next_attempt_ = now;
    return;
  }
  ++attempt_;
  auto wait = Backoff(attempt_);
  next_attempt_ = now + wait;
  if (attempt_ == sink_.max_retries + 1) {
    // This alert used its retries: the receiver is down. Everything waiting now
    // counts as spooled, and so does what arrives until it is back.
    down_ = true;
    c_.spooled.fetch_add(spool_->Size(), std::memory_order_relaxed);
    Warn(r.detail + "; " + std::to_string(spool_->Size()) + " alert(s) kept in the " +
         (spool_->on_disk() ? "on-disk" : "in-memory") + " spool, retrying with backoff");
  } else if (attempt_ <= sink_.max_retries) {
    Warn(r.detail + "; retry " + std::to_string(attempt_) + "/" + std::to_string(sink_.max_retries) +
         " in " + std::to_string(wait.count()) + " ms");
  }
}

void SinkWorker::Run() noexcept {
  try {
    MutexLock lk(&mu_);
    while (true) {
      auto due = [&] {
        mu_.AssertHeld();
        return spool_size_ > 0 && SteadyClock::now() >= next_attempt_;
      };
      auto incidents_due = [&] { return SteadyClock::now() >= incident_wake_; };
      if (!stop_ && queue_.empty() && !due() && !incidents_due()) {
        auto until = incident_wake_;
        if (spool_size_ > 0) until = std::min(until, next_attempt_);
        if (until != SteadyClock::time_point::max()) {
          wake_cv_.wait_until(lk.native(), until, [&] {
            mu_.AssertHeld();
            return stop_ || !queue_.empty() || due() || incidents_due();
          });
        } else {
          wake_cv_.wait(lk.native(), [&] {
            mu_.AssertHeld();
            return stop_ || !queue_.empty();
          });
        }
      }
      std::deque<Alert> batch;
      batch.swap(queue_);
      in_hand_ = batch.size();
      bool stopping = stop_;
      busy_ = true;
      lk.Unlock();
      for (auto& a : batch) Accept(std::move(a));
      if (!stopping) TickIncidents();
      if (!stopping && !spool_->Empty() && SteadyClock::now() >= next_attempt_) AttemptHead();
      lk.Lock();
      spool_size_ = spool_->Size();
      held_ = incidents_ ? incidents_->held() : 0;
      in_hand_ = 0;
      busy_ = false;
      if (queue_.empty() && spool_size_ == 0 && held_ == 0) idle_cv_.notify_all();
      if (stopping && queue_.empty()) break;
    }
    if (spool_size_ > 0 && !spool_->on_disk())
      spdlog::warn("alerting: sink {} stops with {} undelivered alert(s) (no --alert-spool-dir, so they "
                   "are lost)", name_, spool_size_);
    if (held_ > 0)
      spdlog::warn("alerting: sink {} stops with {} incident message(s) still held by its rate limit "
                   "(every alert is in the alerts file and the log)", name_, held_);
  } catch (const std::exception& e) {
    spdlog::error("alerting: sink {} worker stopped by an internal error: {}", name_, e.what());
  } catch (...) {
    spdlog::error("alerting: sink {} worker stopped by an unknown internal error", name_);
  }
  MutexLock lk(&mu_);
  busy_ = false;
  in_hand_ = 0;
  idle_cv_.notify_all();
}

}  // namespace lockstep::alerting
