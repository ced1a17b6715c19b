// PyAgent: what `lockstep._core.Agent` wraps — a lockstep::Agent and its HostRecorder
// (the host statistics path, host_recorder.h), owned together. The engine logic lives
// in the agent library; this class only holds the parts and counts malformed packed
// rows. bind_agent.cc and bind_agent_host.cc convert the typed results for Python.
//
// Threads: as lockstep::Agent and lockstep::HostRecorder (see their headers).
#ifndef LOCKSTEP_AGENT_PYTHON_PY_AGENT_H_
#define LOCKSTEP_AGENT_PYTHON_PY_AGENT_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "lockstep/agent/agent.h"
#include "lockstep/agent/host_recorder.h"
#include "lockstep/agent/packed_rows.h"
#include "lockstep/common/status.h"

namespace lockstep::python {

class PyAgent {
 public:
  static StatusOr<std::unique_ptr<PyAgent>> Create(const AgentOptions& options);
  PyAgent(const PyAgent&) = delete;
  PyAgent& operator=(const PyAgent&) = delete;

  Agent& agent() noexcept { return *agent_; }
  const Agent& agent() const noexcept { return *agent_; }
  HostRecorder& host() noexcept { return host_; }
  const HostRecorder& host() const noexcept { return host_; }

  // RecordPackedRows on this agent; malformed rows are counted in packed_errors().
  size_t RecordPacked(uint64_t step, const uint32_t* micros, const uint32_t* ids,
                      const uint32_t* orders, const double* rows, size_t n, size_t cols,
                      const uint8_t* flags) noexcept {
    PackedResult r = RecordPackedRows(agent_.get(), host_.config(), step, micros, ids,
                                      orders, rows, n, cols, flags);
    if (r.malformed) packed_errors_.fetch_add(r.malformed, std::memory_order_relaxed);
    return r.accepted;
  }
  uint64_t packed_errors() const noexcept {
    return packed_errors_.load(std::memory_order_relaxed);
  }

 private:
  PyAgent(std::unique_ptr<Agent> agent, const StatsConfig& config)
      : agent_(std::move(agent)), host_(agent_.get(), config) {}

  std::unique_ptr<Agent> agent_;
  HostRecorder host_;  // declared after agent_: its worker stops first
  std::atomic<uint64_t> packed_errors_{0};
};

}  // namespace lockstep::python

#endif  // LOCKSTEP_AGENT_PYTHON_PY_AGENT_H_
