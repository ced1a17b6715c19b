// pipeline_bench: agent -> collector throughput over loopback TCP, against a bare
// ZeroMQ PUSH/PULL pair moving the same bytes in the same run.
//
// The collector is the real one (lockstep_collector, in this process, its own ingest
// thread): every message is size-checked, verified (flatbuffers Verifier, schema,
// run id), appended to <tmp>/bench.lslog through its buffered writer and counted in the
// registry. The agent is the real one (Agent::Create, ZeroMQ transport) with default
// options except a larger send HWM, so the figure is the pipe's, not a drop rate.
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/agent/agent.h"
#include "lockstep/collector/collector.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTensors = 1000;  // records per step (one StepStats message of 1000 records)
constexpr int kSteps = 1000;    // 1,000,000 records in all

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Sends `count` messages of `size` bytes (the last one `last_size`) PUSH -> PULL over
// loopback TCP and returns the seconds from the first send to the last receive.
// The baseline has two contexts, so two I/O threads, as between an agent and a
// collector (separate processes). `shared_context` puts both ends in one context: one
// I/O thread then does both ends on one core, cache-hot, which no agent/collector pair
// can (reported beside the figure, for comparison with earlier runs).
double RawZmq(uint64_t count, size_t size, size_t last_size, bool shared_context = false) {
  void* pull_ctx = zmq_ctx_new();
  void* push_ctx = shared_context ? pull_ctx : zmq_ctx_new();
  void* pull = zmq_socket(pull_ctx, ZMQ_PULL);
  void* push = zmq_socket(push_ctx, ZMQ_PUSH);
  int hwm = 100000;
  zmq_setsockopt(pull, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(push, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_bind(pull, "tcp://127.0.0.1:*");
  char ep[256];
  size_t len = sizeof ep;
  zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, ep, &len);
  zmq_connect(push, ep);
  std::vector<uint8_t> payload(std::max(size, last_size), 0x5a);
  auto t0 = Clock::now();
  std::thread receiver([&] {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    for (uint64_t i = 0; i < count; ++i) zmq_msg_recv(&msg, pull, 0);
    zmq_msg_close(&msg);
  });
  for (uint64_t i = 0; i < count; ++i) {
    zmq_send(push, payload.data(), i + 1 == count ? last_size : size, 0);
  }
  receiver.join();
  double secs = Seconds(Clock::now() - t0);
  int linger = 0;
  zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
  zmq_close(push);
  zmq_close(pull);
  if (push_ctx != pull_ctx) zmq_ctx_term(push_ctx);
  zmq_ctx_term(pull_ctx);
  return secs;
}

// Per thread name (each ZeroMQ context has its own "ZMQbg/IO/0"), summed: CPU seconds
// (user + system) and minor page faults so far. Context for the figures: which stage of
// the pipe the time goes to.
struct ThreadUse {
  double cpu_s = 0;
  uint64_t faults = 0;
};
std::map<std::string, ThreadUse> ThreadUsage() {
  std::map<std::string, ThreadUse> out;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream f(e.path() / "stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    ThreadUse& u = out[line.substr(open + 1, close - open - 1)];
    for (int i = 3; i <= 15 && rest >> field; ++i) {  // proc(5): 10 minflt, 14 utime, 15 stime
      if (i == 10) u.faults += std::stoull(field);
      if (i == 14 || i == 15) u.cpu_s += std::stod(field) / tick;
    }
  }
  return out;
}

// CPU seconds of the whole process, threads that have exited included.
double ProcessCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

std::string Describe(const std::map<std::string, ThreadUse>& use) {
  std::string s;
  for (const auto& [name, u] : use) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s%s=%.2fs/%llu", s.empty() ? "" : " ", name.c_str(), u.cpu_s,
                  static_cast<unsigned long long>(u.faults));
    s += buf;
  }
  return s;
}

}  // namespace

int main() {
  char tmpl[] = "/tmp/lockstep-pipeline-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::fprintf(stderr, "pipeline_bench: cannot make a temp dir\n");
    return 1;
  }
  std::string dir = tmpl;

  lockstep::collector::CollectorOptions co;
  co.listen = {"tcp://127.0.0.1:*"};
  co.data_dir = dir;
  co.rebuild_from_logs = false;
  auto col = lockstep::collector::Collector::Create(co);
  if (!col.ok() || !(*col)->Start().ok()) {
    std::fprintf(stderr, "pipeline_bench: collector: %s\n", col.status().ToString().c_str());
    return 1;
  }
  lockstep::AgentOptions o;
  o.run = "bench";
  o.endpoint = (*col)->endpoints().front();
  o.send_hwm = 100000;
  auto created = lockstep::Agent::Create(o);
  if (!created.ok()) {
    std::fprintf(stderr, "pipeline_bench: agent: %s\n", created.status().ToString().c_str());
    return 1;
  }
  auto agent = std::move(created).value();
  std::vector<uint32_t> ids;
  for (int t = 0; t < kTensors; ++t) {
    ids.push_back(agent->RegisterTensor("layers." + std::to_string(t), lockstep::TensorKind::kAct,
                                        lockstep::DType::kBF16, {4096}, t));
  }
  lockstep::TensorStats s;
  s.numel = 4096;
  s.sketch_k = lockstep::kDefaultSketchK;
  s.hist_bins = lockstep::kHistBins;
  for (int i = 0; i < lockstep::kMaxSketchK; ++i) s.sketch[i] = 0.25f * i;
  for (int i = 0; i < lockstep::kHistBins; ++i) s.hist[i] = 256;

  // pipeline_records_per_s: records / seconds from the first RecordStats() to the moment
  // the collector's registry has counted the last of them (verified and appended to the
  // run log's buffered writer). The producer waits while the agent's queue is more than
  // half full instead of letting it drop, so every record is delivered; it waits for room,
  // not for an empty queue (a Flush would drain the pipe and time its bubbles).
  const uint64_t total = static_cast<uint64_t>(kTensors) * kSteps;
  const double pipe_cpu0 = ProcessCpuSeconds();
  auto t0 = Clock::now();
  uint64_t retries = 0;
  for (int step = 0; step < kSteps; ++step) {
    while (agent->Counters().queue_depth > o.queue_capacity / 2) std::this_thread::yield();
    for (int t = 0; t < kTensors; ++t) {
      while (!agent->RecordStats(step, 0, ids[t], t, s)) {
        ++retries;
        std::this_thread::yield();
      }
    }
    agent->EndStep(step);
  }
  agent->Flush(std::chrono::seconds(30));
  double agent_s = Seconds(Clock::now() - t0);
  lockstep::collector::RankInfo info;
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    if ((*col)->registry().Get("bench", 0, &info) && info.stat_records >= total) break;
    std::this_thread::yield();
  }
  double ours = Seconds(Clock::now() - t0);
  const std::string pipe_cpu = Describe(ThreadUsage());
  const double pipe_cpu_total = ProcessCpuSeconds() - pipe_cpu0;
  agent->Close(std::chrono::seconds(10));
  auto cc = (*col)->counters();
  (void)(*col)->Shutdown(std::chrono::seconds(10));
  auto ac = agent->Counters();
  std::filesystem::remove_all(dir);
  if (info.stat_records < total) {
    std::fprintf(stderr, "pipeline_bench: only %llu of %llu records arrived\n",
                 (unsigned long long)info.stat_records, (unsigned long long)total);
    return 1;
  }

  // pipeline_vs_raw_zmq_ratio: (records/s of the pipeline) / (the same messages' rate
  // through a bare PUSH/PULL pair): the same number of messages with the same total
  // bytes (the collector's accepted count and byte total; equal sizes, remainder in the
  // last), sent as fast as possible, timed from the first send to the last receive.
  uint64_t messages = info.messages;
  uint64_t bytes = info.bytes;
  size_t size = static_cast<size_t>(bytes / messages);
  size_t last = static_cast<size_t>(bytes - size * (messages - 1));
  const double raw_cpu0 = ProcessCpuSeconds();
  double raw = RawZmq(messages, size, last);
  const double raw_cpu = ProcessCpuSeconds() - raw_cpu0;
  const double raw_shared = RawZmq(messages, size, last, /*shared_context=*/true);

  std::printf("records=%llu messages=%llu bytes=%llu agent_dropped=%llu retries=%llu "
              "collector_rejected=%llu agent_s=%.3f ours_s=%.3f raw_s=%.3f\n",
              (unsigned long long)info.stat_records, (unsigned long long)messages,
              (unsigned long long)bytes, (unsigned long long)ac.records_dropped,
              (unsigned long long)retries, (unsigned long long)cc.rejected, agent_s, ours, raw);
  std::printf("pipeline threads (CPU seconds/minor faults): %s\n", pipe_cpu.c_str());
  std::printf("CPU seconds in all: pipeline %.2f, raw ZeroMQ %.2f\n", pipe_cpu_total, raw_cpu);
  std::printf("raw ZeroMQ with both ends in one context: %.3f s (ratio against it %.3f)\n",
              raw_shared, raw_shared / ours);
  std::printf("BENCH pipeline_records_per_s %.0f records/s\n", static_cast<double>(total) / ours);
  std::printf("BENCH pipeline_vs_raw_zmq_ratio %.3f ratio\n", raw / ours);
  return 0;
}
