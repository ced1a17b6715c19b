// Dedup cooldown and the token bucket, driven by a fake clock.
#include "throttle.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace lockstep::alerting {
namespace {

using namespace std::chrono_literals;
using testing::SampleAlert;

TEST(DedupFilter, SuppressesWithinCooldownAndCountsRepeats) {
  DedupFilter d(60s);
  Alert a = SampleAlert();
  EXPECT_TRUE(d.Admit(&a, 0s));
  EXPECT_EQ(a.repeat_count, 1u);
  for (int i = 0; i < 4; ++i) {
    Alert r = SampleAlert();
    r.first_seen_unix_ns = 999;  // later sightings must not move the key's first-seen time
    EXPECT_FALSE(d.Admit(&r, std::chrono::seconds(10 + i)));
  }
  Alert late = SampleAlert();
  late.first_seen_unix_ns = 999;
  EXPECT_TRUE(d.Admit(&late, 61s));
  EXPECT_EQ(late.repeat_count, 6u);
  EXPECT_EQ(late.first_seen_unix_ns, SampleAlert().first_seen_unix_ns);
  Alert other = SampleAlert("b", "layers.4.mlp");  // another tensor: another key
  EXPECT_TRUE(d.Admit(&other, 62s));
  Alert again = SampleAlert();
  EXPECT_FALSE(d.Admit(&again, 100s));  // cooldown restarts at the last sent (61 s)
}

TEST(DedupFilter, AnEscalationPassesWithinTheCooldown) {
  DedupFilter d(60s);
  Alert warn = SampleAlert();
  warn.severity = Severity::kWarning;
  EXPECT_TRUE(d.Admit(&warn, 0s));
  Alert again = SampleAlert();
  again.severity = Severity::kWarning;
  EXPECT_FALSE(d.Admit(&again, 5s));
  Alert crit = SampleAlert();
  crit.severity = Severity::kCritical;
  EXPECT_TRUE(d.Admit(&crit, 10s));  // the same key turned critical: news
  EXPECT_EQ(crit.repeat_count, 3u);
  Alert crit2 = SampleAlert();
  crit2.severity = Severity::kCritical;
  EXPECT_FALSE(d.Admit(&crit2, 20s));  // a repeat of the critical one is not
  Alert warn2 = SampleAlert();
  warn2.severity = Severity::kWarning;
  EXPECT_FALSE(d.Admit(&warn2, 30s));
}

TEST(DedupFilter, ZeroCooldownPassesEverything) {
  DedupFilter d(0s);
  for (int i = 0; i < 3; ++i) {
    Alert a = SampleAlert();
    EXPECT_TRUE(d.Admit(&a, 0s));
    EXPECT_EQ(a.repeat_count, 1u);
  }
}

TEST(RateLimiter, BurstThenRefillRate) {
  RateLimiter r(60, 3);  // one a second, three at once
  EXPECT_TRUE(r.Admit(0s));
  EXPECT_TRUE(r.Admit(0s));
  EXPECT_TRUE(r.Admit(0s));
  EXPECT_FALSE(r.Admit(0s));
  EXPECT_FALSE(r.Admit(500ms));
  EXPECT_TRUE(r.Admit(1000ms));
  EXPECT_FALSE(r.Admit(1100ms));
  EXPECT_TRUE(r.Admit(100s));
  EXPECT_TRUE(r.Admit(100s));
  EXPECT_TRUE(r.Admit(100s));
  EXPECT_FALSE(r.Admit(100s));  // refill is capped at the burst
}

TEST(RateLimiter, NonPositiveRateIsUnlimited) {
  RateLimiter r(0, 1);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(r.Admit(0s));
}

}  // namespace
}  // namespace lockstep::alerting
