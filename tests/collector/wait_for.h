// Waits until a condition holds, polling, or until a time limit: tests of threads and
// sockets wait for what they expect instead of sleeping a fixed time.
#ifndef LOCKSTEP_TESTS_COLLECTOR_WAIT_FOR_H_
#define LOCKSTEP_TESTS_COLLECTOR_WAIT_FOR_H_

#include <chrono>
#include <thread>

namespace lockstep::testing {

// True once `pred()` holds; false when `limit` passed first. Polls every 10 ms.
template <typename Pred>
bool WaitFor(Pred pred, std::chrono::seconds limit = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace lockstep::testing

#endif  // LOCKSTEP_TESTS_COLLECTOR_WAIT_FOR_H_
