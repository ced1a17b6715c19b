// compare's and report's inputs that are msprobe dump folders rather than run logs:
// each is imported to a temporary run log (interop/msprobe_import.h), removed when this
// object goes (docs/msprobe.md "compare and report on dumps").
#ifndef LOCKSTEP_CLI_DUMP_INPUTS_H_
#define LOCKSTEP_CLI_DUMP_INPUTS_H_

#include <string>

#include "lockstep/common/status.h"

namespace lockstep::cli {

class DumpInputs {
 public:
  DumpInputs() = default;
  ~DumpInputs();
  DumpInputs(const DumpInputs&) = delete;
  DumpInputs& operator=(const DumpInputs&) = delete;

  // Replaces each of *baseline, *candidate that is an msprobe dump folder with the path
  // of its import. Two dumps of one folder name get distinct run ids. InvalidArgument /
  // Corruption / IOError naming the dump's file when an import fails.
  Status Resolve(std::string* baseline, std::string* candidate);

  bool any() const { return !dir_.empty(); }

 private:
  std::string dir_;  // the temporary folder of the imports ("" = none)
};

}  // namespace lockstep::cli

#endif  // LOCKSTEP_CLI_DUMP_INPUTS_H_
