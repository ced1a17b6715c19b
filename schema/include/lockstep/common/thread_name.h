// Names the calling thread, so that `top -H`, `ps -L`, perf and gdb show which of
// lockstep's threads is which (the agent's sender lives inside a training process that
// may have hundreds of threads). Linux keeps at most 15 characters; longer names are
// cut. Best effort: a failure changes nothing else.
#ifndef LOCKSTEP_COMMON_THREAD_NAME_H_
#define LOCKSTEP_COMMON_THREAD_NAME_H_

#include <pthread.h>

#include <cstring>

namespace lockstep {

inline void SetCurrentThreadName(const char* name) noexcept {
  char buf[16];
  std::strncpy(buf, name, sizeof buf - 1);
  buf[sizeof buf - 1] = '\0';
  (void)pthread_setname_np(pthread_self(), buf);
}

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_THREAD_NAME_H_
