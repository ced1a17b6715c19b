// Time bounds of tests under the sanitizers. ASan runs code ~2x slower, TSan 5-15x, and
// scripts/test's sanitizer stages share a 2-core machine with each other's ctest -j2:
// a bound that only says "does not hang" is multiplied by LOCKSTEP_TIME_SCALE (set by
// scripts/test for those stages; 1 when unset, so the normal build keeps its bounds).
// Bounds that assert a property ("returns no sooner than its timeout") stay unscaled.
#ifndef LOCKSTEP_TESTS_TIME_SCALE_H_
#define LOCKSTEP_TESTS_TIME_SCALE_H_

#include <chrono>
#include <cstdlib>

namespace lockstep::testing {

// The factor from LOCKSTEP_TIME_SCALE: a positive integer, else 1.
inline int TimeScale() {
  static const int scale = [] {
    const char* v = std::getenv("LOCKSTEP_TIME_SCALE");
    int n = v != nullptr ? std::atoi(v) : 1;
    return n >= 1 ? n : 1;
  }();
  return scale;
}

// `d` stretched by TimeScale().
template <typename Rep, typename Period>
std::chrono::duration<Rep, Period> Scaled(std::chrono::duration<Rep, Period> d) {
  return d * TimeScale();
}

}  // namespace lockstep::testing

#endif  // LOCKSTEP_TESTS_TIME_SCALE_H_
