// A planted violation: reads a GUARDED_BY member without its lock. The thread_safety.planted
// ctest entry compiles this file and passes only when clang reports exactly that, so the
// check of the real sources (thread_safety.*) is known to be able to fail.
#include "lockstep/common/thread_annotations.h"

namespace {

class Counter {
 public:
  void Add() EXCLUDES(mu_) {
    lockstep::MutexLock l(&mu_);
    ++count_;
  }
  int Peek() const { return count_; }  // the violation: no lock

 private:
  mutable lockstep::Mutex mu_;
  int count_ GUARDED_BY(mu_) = 0;
};

}  // namespace

int PlantedViolation() {
  Counter c;
  c.Add();
  return c.Peek();
}
