// The folders of an msprobe dump: DUMP/step<N>/<rank<R>|proc<PID>>/dump.json (or one
// rank's folder given directly). Filesystem only; any thread.
#ifndef LOCKSTEP_COLLECTOR_INTEROP_MSPROBE_LAYOUT_H_
#define LOCKSTEP_COLLECTOR_INTEROP_MSPROBE_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/common/status.h"

namespace lockstep::collector::msprobe {

struct Part {
  uint64_t step = 0;
  uint32_t rank = 0;
  std::string dir;  // holds dump.json, construct.json, ...
};

struct Layout {
  std::vector<Part> parts;  // by step, then rank
  uint64_t steps = 0, ranks = 0;
};

// The dump's parts. NotFound / InvalidArgument naming the folder or file: no such
// directory, not an msprobe dump, a rank folder missing from a step, a dump.json missing.
Status FindLayout(const std::string& path, Layout* out);

// Whether `path` is a folder laid out so (a quick look, no file read).
bool LooksLikeDump(const std::string& path);

}  // namespace lockstep::collector::msprobe

#endif  // LOCKSTEP_COLLECTOR_INTEROP_MSPROBE_LAYOUT_H_
