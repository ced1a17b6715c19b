// FileSizeLimit: while alive, this process cannot make any file larger than `bytes`
// (RLIMIT_FSIZE; SIGXFSZ ignored, so write() fails with EFBIG): a full disk, in-process,
// without root. gtest_discover_tests runs each test in its own process.
#ifndef LOCKSTEP_TESTS_COLLECTOR_FILE_SIZE_LIMIT_H_
#define LOCKSTEP_TESTS_COLLECTOR_FILE_SIZE_LIMIT_H_

#include <signal.h>
#include <sys/resource.h>

#include <cstdint>

namespace lockstep::testing {

class FileSizeLimit {
 public:
  explicit FileSizeLimit(uint64_t bytes) {
    ::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    rlimit r = saved_;
    r.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &r);
  }
  ~FileSizeLimit() { ::setrlimit(RLIMIT_FSIZE, &saved_); }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_{};
};

}  // namespace lockstep::testing

#endif  // LOCKSTEP_TESTS_COLLECTOR_FILE_SIZE_LIMIT_H_
