// A fresh temporary directory per test, removed at the end.
#ifndef LOCKSTEP_TESTS_COLLECTOR_TEST_DIR_H_
#define LOCKSTEP_TESTS_COLLECTOR_TEST_DIR_H_

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace lockstep::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "lockstep-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace lockstep::testing

#endif  // LOCKSTEP_TESTS_COLLECTOR_TEST_DIR_H_
