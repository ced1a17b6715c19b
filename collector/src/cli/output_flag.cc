#include "cli/output_flag.h"

#include <string>
#include <vector>

#include "lockstep/common/flags.h"

namespace lockstep::cli {

Status ParseWithShortOutput(FlagSet* fs, int argc, const char* const* argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (auto& a : args) {
    if (a == "-o") a = "--output";
  }
  std::vector<const char*> av;
  for (const auto& a : args) av.push_back(a.c_str());
  return fs->Parse(static_cast<int>(av.size()), av.data());
}

}  // namespace lockstep::cli
