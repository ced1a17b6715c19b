#include "service/quiet_sampling.h"

#include <gtest/gtest.h>

namespace lockstep::collector {
namespace {

constexpr int64_t kSecond = 1'000'000'000;
using State = QuietSampling::State;

TEST(QuietSampling, ALivePairIsAskedKOnceAtItsFirstStep) {
  QuietSampling q(10, 60 * kSecond);
  EXPECT_EQ(q.OnPairStep("p", /*live=*/false, 0), 0u);  // a recorded baseline: nobody asked
  EXPECT_EQ(q.state("p"), State::kNew);
  EXPECT_EQ(q.OnPairStep("p", true, 1), 10u);
  EXPECT_EQ(q.OnPairStep("p", true, 2), 0u);
  EXPECT_EQ(q.state("p"), State::kQuiet);
  EXPECT_EQ(q.OnPairStep("other", true, 2), 10u);  // pairs apart
}

TEST(QuietSampling, AnAlertAsksEveryStepAndTheResolutionAsksKAgain) {
  QuietSampling q(5, 60 * kSecond);
  ASSERT_EQ(q.OnPairStep("p", true, 0), 5u);
  EXPECT_EQ(q.OnAlert("p", 10 * kSecond), 1u);
  EXPECT_EQ(q.OnAlert("p", 20 * kSecond), 0u);  // loud already: asked once
  EXPECT_EQ(q.state("p"), State::kLoud);
  EXPECT_EQ(q.OnPairStep("p", true, 79 * kSecond), 0u);  // 59 s after the last alert
  EXPECT_EQ(q.OnPairStep("p", true, 80 * kSecond), 5u);  // resolved: quiet again
  EXPECT_EQ(q.state("p"), State::kQuiet);
  EXPECT_EQ(q.OnAlert("p", 81 * kSecond), 1u);           // and loud again
}

TEST(QuietSampling, IncidentsThatNeverResolveKeepEveryStep) {
  QuietSampling q(5, 0);
  ASSERT_EQ(q.OnPairStep("p", true, 0), 5u);
  ASSERT_EQ(q.OnAlert("p", kSecond), 1u);
  EXPECT_EQ(q.OnPairStep("p", true, 1000000 * kSecond), 0u);
  EXPECT_EQ(q.state("p"), State::kLoud);
}

TEST(QuietSampling, APairLoudBeforeItsFirstStepIsNotThinned) {
  QuietSampling q(5, 60 * kSecond);
  EXPECT_EQ(q.OnAlert("p", 0), 0u);  // every step already: nothing to ask
  EXPECT_EQ(q.OnPairStep("p", true, kSecond), 0u);
  EXPECT_EQ(q.OnPairStep("p", true, 61 * kSecond), 5u);  // until it resolves
}

TEST(QuietSampling, AnAgentThatDoesNotSampleTurnsThePairOff) {
  QuietSampling q(5, kSecond);
  ASSERT_EQ(q.OnPairStep("p", true, 0), 5u);
  EXPECT_EQ(q.OnNotSampled("p"), 1u);  // the other run goes back to every step
  EXPECT_EQ(q.OnNotSampled("p"), 0u);
  EXPECT_EQ(q.OnAlert("p", 2 * kSecond), 0u);
  EXPECT_EQ(q.OnPairStep("p", true, 10 * kSecond), 0u);
  EXPECT_EQ(q.state("p"), State::kOff);
}

}  // namespace
}  // namespace lockstep::collector
