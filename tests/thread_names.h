// How many of this process's threads carry a name: for the tests that check that
// lockstep's threads are named (top -H, ps -L, perf and gdb show those names).
#ifndef LOCKSTEP_TESTS_THREAD_NAMES_H_
#define LOCKSTEP_TESTS_THREAD_NAMES_H_

#include <filesystem>
#include <fstream>
#include <string>

namespace lockstep::testing {

// Threads of this process named `name` (/proc/self/task/*/comm).
inline int ThreadsNamed(const std::string& name) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream f(e.path() / "comm");
    std::string comm;
    if (std::getline(f, comm) && comm == name) ++n;
  }
  return n;
}

}  // namespace lockstep::testing

#endif  // LOCKSTEP_TESTS_THREAD_NAMES_H_
