// Dedup and rate limit: the two filters a sink applies before it spools an alert.
// Time comes from the caller (an injectable clock), so tests need no sleeps.
// Threads: single owner (the sink's worker thread).
#ifndef LOCKSTEP_ALERTING_SRC_THROTTLE_H_
#define LOCKSTEP_ALERTING_SRC_THROTTLE_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "lockstep/alerting/alert.h"

namespace lockstep::alerting {

// Per DedupKey(): the first alert passes; repeats within `cooldown` of the last one
// that passed are suppressed; the next one to pass carries repeat_count = every
// time the key was seen (suppressed ones included) and the key's first-seen time.
// An escalation — a repeat more severe than any sent for the key in this cooldown
// (a drift that turns critical) — always passes: it is news, not a repeat.
// A cooldown of zero passes everything.
class DedupFilter {
 public:
  explicit DedupFilter(std::chrono::nanoseconds cooldown) : cooldown_(cooldown) {}
  // True: send `*alert` (its repeat_count/first_seen updated). False: suppressed.
  bool Admit(Alert* alert, std::chrono::nanoseconds now);
  // Restores a key that passed at `last_sent` (before a restart: from the sink's journal).
  void Seed(const std::string& key, Severity severity, std::chrono::nanoseconds last_sent,
            int64_t first_seen_unix_ns);

 private:
  struct Key {
    std::chrono::nanoseconds last_sent{0};
    uint64_t seen = 0;
    int64_t first_seen_unix_ns = 0;
    Severity max_sent = Severity::kInfo;  // most severe sent since last_sent's cooldown began
  };
  std::chrono::nanoseconds cooldown_;
  std::unordered_map<std::string, Key> keys_;
};

// Token bucket: `burst` tokens, refilled at `per_min` a minute. per_min <= 0: no limit.
class RateLimiter {
 public:
  RateLimiter(double per_min, int burst) : per_min_(per_min), burst_(burst), tokens_(burst) {}
  bool Admit(std::chrono::nanoseconds now);
  // Takes a token if there is one; never refuses (critical news uses one when it can).
  void Take(std::chrono::nanoseconds now);
  // How long until Admit(now + result) passes; 0 if a token is there now.
  std::chrono::nanoseconds TimeToToken(std::chrono::nanoseconds now);

 private:
  void Refill(std::chrono::nanoseconds now);
  double per_min_;
  double burst_;
  double tokens_;
  std::chrono::nanoseconds last_{0};
  bool started_ = false;
};

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_SRC_THROTTLE_H_
