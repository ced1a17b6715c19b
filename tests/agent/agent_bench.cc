// agent_bench: the cost of one RecordStats() through the public API, as the training
// thread sees it. Default options (sketch_k = 32, 16 histogram bins, 16384-record queue);
// the sender thread runs concurrently and encodes every message, handing it to a
// transport that accepts and discards it (so the figure is the agent's, not the
// network's). The queue is kept below half full between samples (outside the timed
// region) so every timed call takes the accept path, not the cheaper refusal path.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "lockstep/agent/agent.h"
#include "transport/transport.h"

namespace {

class DiscardTransport final : public lockstep::Transport {
 public:
  SendResult Send(const uint8_t*, size_t) noexcept override { return SendResult::kSent; }
  int TakeConnectEvents() noexcept override { return 0; }
  void Close(std::chrono::milliseconds) noexcept override {}
};

}  // namespace

int main() {
  using Clock = std::chrono::steady_clock;
  lockstep::AgentOptions o;
  o.run = "agent-bench";
  auto created = lockstep::Agent::CreateWithTransport(o, std::make_unique<DiscardTransport>());
  if (!created.ok()) {
    std::fprintf(stderr, "agent_bench: %s\n", created.status().ToString().c_str());
    return 1;
  }
  auto agent = std::move(created).value();
  const int kTensors = 256;
  std::vector<uint32_t> ids;
  for (int t = 0; t < kTensors; ++t) {
    ids.push_back(agent->RegisterTensor("layers." + std::to_string(t), lockstep::TensorKind::kAct,
                                        lockstep::DType::kBF16, {1024}, t));
  }
  lockstep::TensorStats s;
  s.numel = 1024;
  s.sketch_k = lockstep::kDefaultSketchK;
  s.hist_bins = lockstep::kHistBins;
  for (int i = 0; i < lockstep::kMaxSketchK; ++i) s.sketch[i] = 0.5f * i;
  for (int i = 0; i < lockstep::kHistBins; ++i) s.hist[i] = i;

  // agent_record_ns_p50: a sample is the wall time of kBatch consecutive RecordStats()
  // calls divided by kBatch (one call is too short to time alone); the figure is the
  // median over kSamples samples, after a warm-up of one full step.
  const int kBatch = 16, kSamples = 20000;
  std::vector<double> samples;
  samples.reserve(kSamples);
  uint64_t step = 0, refused = 0;
  for (int t = 0; t < kTensors; ++t) agent->RecordStats(step, 0, ids[t], t, s);
  agent->Flush(std::chrono::seconds(10));
  int t = 0;
  for (int i = 0; i < kSamples; ++i) {
    if (agent->Counters().queue_depth > o.queue_capacity / 2) agent->Flush(std::chrono::seconds(10));
    auto t0 = Clock::now();
    for (int j = 0; j < kBatch; ++j) {
      refused += !agent->RecordStats(step, 0, ids[t], t, s);
      if (++t == kTensors) {
        t = 0;
        ++step;
      }
    }
    auto t1 = Clock::now();
    samples.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kBatch);
  }
  agent->Close(std::chrono::seconds(10));
  std::sort(samples.begin(), samples.end());
  double p50 = samples[samples.size() / 2];
  double p99 = samples[samples.size() * 99 / 100];
  auto c = agent->Counters();
  std::printf("records=%llu sent=%llu refused=%llu messages=%llu\n",
              (unsigned long long)c.records_enqueued, (unsigned long long)c.records_sent,
              (unsigned long long)refused, (unsigned long long)c.messages_sent);
  std::printf("BENCH agent_record_ns_p50 %.1f ns\n", p50);
  std::printf("BENCH agent_record_ns_p99 %.1f ns\n", p99);
  return 0;
}
