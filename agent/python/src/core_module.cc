// lockstep._core: the pybind11 face of the C++ agent (see py_agent.h).
//
// Called from lockstep's pure-Python package only. Agent.create() raises ValueError
// with the agent's one-line message (the package turns it into a warning and a no-op
// monitor); every method used from training hooks returns a value instead of raising
// and releases the GIL while it works.
//
// One function per area, each in its own file (bindings.h): the vocabulary
// (bind_vocabulary.cc), the kernel's test entry points (bind_host_stats.cc), the Agent
// class (bind_agent.cc), its host statistics methods (bind_agent_host.cc), and the
// recorder's host path that the package's Recorder subclasses (bind_recorder.cc), and
// the watch() hooks that call it (py_hooks.cc), and the wrapper that makes lockstep's
// Python hooks copy and pickle as those do (py_portable.cc).
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "py_hooks.h"
#include "py_portable.h"
#include "py_recorder.h"

PYBIND11_MODULE(_core, m) {
  using namespace lockstep::python;
  m.doc() = "lockstep C++ agent core (use the `lockstep` package, not this module)";
  BindVocabulary(m);
  BindHostStats(m);
  BindHostOutcome(m);
  BindAgent(m);
  BindRecorder(m);
  BindHooks(m);
  BindPortable(m);
}
