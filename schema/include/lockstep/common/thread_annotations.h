// Lock annotations that clang checks at compile time (-Wthread-safety): a member
// declared GUARDED_BY(mu_) may only be touched with mu_ held, a function declared
// REQUIRES(mu_) only called with it, EXCLUDES(mu_) only without. Under gcc every
// macro expands to nothing. The style is abseil's and leveldb's port/thread_annotations.h.
//
// libstdc++'s std::mutex carries no annotations, so locks that guard annotated members
// are a lockstep::Mutex (a std::mutex with annotations) held by a MutexLock:
//
//   Mutex mu_;
//   int count_ GUARDED_BY(mu_) = 0;
//   void Add() EXCLUDES(mu_) { MutexLock l(&mu_); ++count_; }
//
// A condition variable waits on the std::unique_lock inside the MutexLock
// (`cv_.wait(l.native(), pred)`); the analysis cannot see that the predicate runs with
// the lock held, so a predicate that reads guarded members starts with mu_.AssertHeld().
//
// The check: ctest's thread_safety.* entries compile the annotated sources with clang++
// -fsyntax-only -Wthread-safety -Werror=thread-safety (tests/thread_safety).
#ifndef LOCKSTEP_COMMON_THREAD_ANNOTATIONS_H_
#define LOCKSTEP_COMMON_THREAD_ANNOTATIONS_H_

#include <mutex>

#if defined(__clang__)
#define LOCKSTEP_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define LOCKSTEP_THREAD_ANNOTATION_(x)
#endif

#define CAPABILITY(x) LOCKSTEP_THREAD_ANNOTATION_(capability(x))
#define SCOPED_CAPABILITY LOCKSTEP_THREAD_ANNOTATION_(scoped_lockable)
#define GUARDED_BY(x) LOCKSTEP_THREAD_ANNOTATION_(guarded_by(x))
#define PT_GUARDED_BY(x) LOCKSTEP_THREAD_ANNOTATION_(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) LOCKSTEP_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) LOCKSTEP_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
#define REQUIRES(...) LOCKSTEP_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) LOCKSTEP_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
#define ACQUIRE(...) LOCKSTEP_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RELEASE(...) LOCKSTEP_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) LOCKSTEP_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) LOCKSTEP_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) LOCKSTEP_THREAD_ANNOTATION_(assert_capability(x))
#define RETURN_CAPABILITY(x) LOCKSTEP_THREAD_ANNOTATION_(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS LOCKSTEP_THREAD_ANNOTATION_(no_thread_safety_analysis)

namespace lockstep {

// A std::mutex that clang's analysis knows as a capability. Same cost as std::mutex.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // Tells the analysis that the caller holds the lock (checks nothing at run time).
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope (a std::unique_lock underneath, for condition variables).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : lock_(mu->mu_) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Lets go for a while (work that must not hold the lock), then takes it back.
  void Unlock() RELEASE() { lock_.unlock(); }
  void Lock() ACQUIRE() { lock_.lock(); }

  // For std::condition_variable::wait*: locked on entry and on return.
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_THREAD_ANNOTATIONS_H_
