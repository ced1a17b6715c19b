#include "throttle.h"

#include <algorithm>

namespace lockstep::alerting {

namespace {
// Beyond this many keys, those idle for a whole cooldown are forgotten: memory stays
// bounded however many distinct tensors alert.
constexpr size_t kMaxKeys = 10000;
}  // namespace

bool DedupFilter::Admit(Alert* alert, std::chrono::nanoseconds now) {
  if (cooldown_.count() <= 0) return true;
  std::string key = alert->DedupKey();
  auto it = keys_.find(key);
  if (it == keys_.end()) {
    if (keys_.size() >= kMaxKeys) {
      for (auto i = keys_.begin(); i != keys_.end();) {
        i = now - i->second.last_sent >= cooldown_ ? keys_.erase(i) : std::next(i);
      }
    }
    Key k;
    k.last_sent = now;
    k.seen = std::max<uint64_t>(alert->repeat_count, 1);
    k.first_seen_unix_ns = alert->first_seen_unix_ns;
    k.max_sent = alert->severity;
    keys_.emplace(std::move(key), k);
    return true;
  }
  Key& k = it->second;
  k.seen += std::max<uint64_t>(alert->repeat_count, 1);
  const bool cooling = now - k.last_sent < cooldown_;
  if (cooling && alert->severity <= k.max_sent) return false;
  k.max_sent = alert->severity;
  k.last_sent = now;
  alert->repeat_count = k.seen;
  if (k.first_seen_unix_ns != 0) alert->first_seen_unix_ns = k.first_seen_unix_ns;
  return true;
}

void DedupFilter::Seed(const std::string& key, Severity severity, std::chrono::nanoseconds last_sent,
                       int64_t first_seen_unix_ns) {
  if (cooldown_.count() <= 0) return;
  auto [it, inserted] = keys_.try_emplace(key);
  Key& k = it->second;
  ++k.seen;
  if (inserted || k.first_seen_unix_ns == 0) k.first_seen_unix_ns = first_seen_unix_ns;
  if (inserted || last_sent - k.last_sent >= cooldown_) {
    k.max_sent = severity;
  } else {
    k.max_sent = std::max(k.max_sent, severity);
  }
  k.last_sent = std::max(k.last_sent, last_sent);
}

void RateLimiter::Refill(std::chrono::nanoseconds now) {
  if (!started_) {
    started_ = true;
    last_ = now;
  }
  double minutes = std::chrono::duration<double>(now - last_).count() / 60.0;
  if (minutes > 0) {
    tokens_ = std::min(burst_, tokens_ + minutes * per_min_);
    last_ = now;
  }
}

bool RateLimiter::Admit(std::chrono::nanoseconds now) {
  if (per_min_ <= 0) return true;
  Refill(now);
  if (tokens_ < 1.0) return false;
  tokens_ -= 1.0;
  return true;
}

void RateLimiter::Take(std::chrono::nanoseconds now) {
  if (per_min_ <= 0) return;
  Refill(now);
  if (tokens_ >= 1.0) tokens_ -= 1.0;
}

std::chrono::nanoseconds RateLimiter::TimeToToken(std::chrono::nanoseconds now) {
  if (per_min_ <= 0) return std::chrono::nanoseconds(0);
  Refill(now);
  if (tokens_ >= 1.0) return std::chrono::nanoseconds(0);
  const double seconds = (1.0 - tokens_) / per_min_ * 60.0;
  return std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9) + 1);
}

}  // namespace lockstep::alerting
