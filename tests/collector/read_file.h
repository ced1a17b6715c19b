// The whole of a file a test wrote or had written (an alerts file, a settings file, a
// report), to compare or search; "" when it cannot be read, which the comparison then
// reports.
#ifndef LOCKSTEP_TESTS_COLLECTOR_READ_FILE_H_
#define LOCKSTEP_TESTS_COLLECTOR_READ_FILE_H_

#include <fstream>
#include <sstream>
#include <string>

namespace lockstep::testing {

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace lockstep::testing

#endif  // LOCKSTEP_TESTS_COLLECTOR_READ_FILE_H_
