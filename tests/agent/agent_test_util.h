// Helpers shared by the agent's tests: options, a filled TensorStats, and counting
// what a FakeTransport saw.
#ifndef LOCKSTEP_TESTS_AGENT_AGENT_TEST_UTIL_H_
#define LOCKSTEP_TESTS_AGENT_AGENT_TEST_UTIL_H_

#include <memory>
#include <vector>

#include "fake_transport.h"
#include "lockstep/agent/agent.h"

namespace lockstep::testing {

inline AgentOptions TestOptions() {
  AgentOptions o;
  o.run = "test-run";
  o.experiment = "exp";
  o.role = Role::kCandidate;
  o.rank = 1;
  o.world_size = 2;
  o.queue_capacity = 1024;
  o.heartbeat_interval = std::chrono::hours(1);  // tests that want heartbeats lower it
  o.batch_linger = std::chrono::hours(1);        // only EndStep / full / Flush ship
  return o;
}

inline TensorStats MakeStats(double v, int k = kDefaultSketchK) {
  TensorStats s;
  s.numel = 100;
  s.min = -v;
  s.max = v;
  s.mean = v / 10;
  s.std = v / 2;
  s.l2 = v * 3;
  s.absmax = v;
  s.nan_count = 1;
  s.inf_count = 2;
  s.zero_count = 3;
  s.sat_count = 4;
  s.subnormal_count = 5;
  s.limit_dtype = DType::kF16;
  s.sketch_k = static_cast<uint16_t>(k);
  for (int i = 0; i < k; ++i) s.sketch[i] = static_cast<float>(v + i);
  s.hist_bins = kHistBins;
  for (int i = 0; i < kHistBins; ++i) s.hist[i] = static_cast<uint32_t>(i);
  return s;
}

struct Made {
  std::unique_ptr<Agent> agent;
  std::shared_ptr<FakeState> state;
};

inline Made MakeAgent(const AgentOptions& o, std::shared_ptr<FakeState> state = nullptr) {
  if (!state) state = std::make_shared<FakeState>();
  auto a = Agent::CreateWithTransport(o, std::make_unique<FakeTransport>(state));
  if (!a.ok()) return {nullptr, state};
  return {std::move(a).value(), state};
}

inline size_t Count(const std::vector<FakeMessage>& ms, wire::Body type, bool accepted_only = true) {
  size_t n = 0;
  for (const auto& m : ms) n += (m.type() == type && (m.accepted || !accepted_only));
  return n;
}

inline uint64_t Records(const std::vector<FakeMessage>& ms, bool accepted) {
  uint64_t n = 0;
  for (const auto& m : ms) {
    if (m.accepted == accepted) n += m.records();
  }
  return n;
}

}  // namespace lockstep::testing

#endif  // LOCKSTEP_TESTS_AGENT_AGENT_TEST_UTIL_H_
