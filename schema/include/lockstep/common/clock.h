// The one way lockstep reads time. Two clocks, both in int64 nanoseconds:
//   - unix (wall) time: timestamps that go on the wire, into logs and alerts, and the
//     ages shown to users (system_clock; may jump when the host's clock is set);
//   - monotonic time: intervals, rates, cooldowns and timeouts (steady_clock; its epoch
//     is arbitrary, only differences mean anything).
//
// UnixNowNs() and MonotonicNowNs() are the plain reads (inline, no indirection: the
// agent's hot path calls them). Components whose behaviour depends on time take a
// `const Clock*` (constructor parameter or options field; null means RealClock()), so
// that tests drive them with a FakeClock instead of sleeping.
//
// Thread safety: every Clock's Now*() may be called from any thread; FakeClock's
// setters too (its readings are atomics).
#ifndef LOCKSTEP_COMMON_CLOCK_H_
#define LOCKSTEP_COMMON_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace lockstep {

inline int64_t UnixNowNs() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline int64_t MonotonicNowNs() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowUnixNs() const noexcept = 0;
  virtual int64_t NowMonotonicNs() const noexcept = 0;
};

// The host's clocks (system_clock and steady_clock).
class RealClock final : public Clock {
 public:
  int64_t NowUnixNs() const noexcept override { return UnixNowNs(); }
  int64_t NowMonotonicNs() const noexcept override { return MonotonicNowNs(); }
};

// The process-wide real clock; `clock` itself when it is not null.
inline const Clock* RealClockOr(const Clock* clock) noexcept {
  static const RealClock real;
  return clock != nullptr ? clock : &real;
}

// A clock that moves only when told: Advance() moves both readings, the setters one.
// Starts at the given readings (default: unix time 1.7e18 ns, late 2023; monotonic 0).
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t unix_ns = 1'700'000'000'000'000'000, int64_t monotonic_ns = 0)
      : unix_ns_(unix_ns), monotonic_ns_(monotonic_ns) {}

  int64_t NowUnixNs() const noexcept override { return unix_ns_.load(std::memory_order_acquire); }
  int64_t NowMonotonicNs() const noexcept override {
    return monotonic_ns_.load(std::memory_order_acquire);
  }

  void Advance(std::chrono::nanoseconds d) noexcept {
    unix_ns_.fetch_add(d.count(), std::memory_order_acq_rel);
    monotonic_ns_.fetch_add(d.count(), std::memory_order_acq_rel);
  }
  void SetUnixNs(int64_t ns) noexcept { unix_ns_.store(ns, std::memory_order_release); }
  void SetMonotonicNs(int64_t ns) noexcept { monotonic_ns_.store(ns, std::memory_order_release); }

 private:
  std::atomic<int64_t> unix_ns_;
  std::atomic<int64_t> monotonic_ns_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_CLOCK_H_
