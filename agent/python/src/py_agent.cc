#include "py_agent.h"

#include <utility>

namespace lockstep::python {

StatusOr<std::unique_ptr<PyAgent>> PyAgent::Create(const AgentOptions& options) {
  StatsConfig config;
  config.sketch_k = options.sketch_k;
  config.hist_bins = options.hist_bins;
  auto agent = Agent::Create(options);
  if (!agent.ok()) return agent.status();
  return std::unique_ptr<PyAgent>(new PyAgent(std::move(agent).value(), config));
}

}  // namespace lockstep::python
