// fuzz_seed_gen OUT_DIR: writes the fuzzers' seed corpora from real messages, built by
// the agent's own WireEncoder and recorded by the collector's own LogWriter, so the
// fuzzers start from what an agent and a collector actually produce:
//   OUT_DIR/envelope/  one message per file (every body type)
//   OUT_DIR/session/   message sequences in fuzz_common.h's frame format: a baseline and
//                      a candidate that drifts and turns NaN, a solo run, a restart
//   OUT_DIR/runlog/    run logs: clean, torn tail, flipped bit, bad length
// Run at build time (tests/fuzz/standalone/CMakeLists.txt); deterministic output.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/tensor_registry.h"
#include "engine/wire_encoder.h"
#include "fuzz_common.h"
#include "lockstep/agent/agent.h"
#include "runlog/log_writer.h"

namespace lockstep::fuzz {
namespace {

namespace fs = std::filesystem;
using Msg = std::vector<uint8_t>;

void WriteFile(const fs::path& p, const uint8_t* data, size_t size) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!f) {
    std::fprintf(stderr, "fuzz_seed_gen: cannot write %s\n", p.c_str());
    std::exit(1);
  }
}

// One agent's messages over a few steps: Hello, Sampling, TensorDirectory, per step
// StepStats (sketch and histogram), StepScalars then StepEnd, a Heartbeat, Goodbye. `drift` scales the
// candidate's values; `nan_step` makes one tensor non-finite from that step on.
std::vector<Msg> AgentRun(const std::string& run, Role role, uint32_t rank, uint64_t steps,
                          double drift, int64_t nan_step, int64_t start_ns) {
  engine::WireEncoder enc(run, rank);
  engine::TensorRegistry reg;
  std::vector<Msg> out;
  uint64_t seq = 0;
  auto keep = [&](engine::Bytes b) { out.emplace_back(b.data, b.data + b.size); };

  AgentOptions o;
  o.run = run;
  o.experiment = "fuzz-exp";
  o.role = role;
  o.rank = rank;
  o.world_size = 2;
  o.sketch_k = 4;
  o.hist_bins = 4;
  o.framework = "torch 2.1";
  keep(enc.Hello(o, start_ns, seq++));
  Sampling sampling;
  sampling.every = 1;
  sampling.include_regex = "^module";
  sampling.kinds = {TensorKind::kAct, TensorKind::kActGrad, TensorKind::kParamGrad};
  keep(enc.Sampling(sampling, 4, 4, seq++));

  const char* names[] = {"module.embed", "module.blocks.0.attn", "module.blocks.0.mlp",
                         "module.head"};
  const TensorKind kinds[] = {TensorKind::kAct, TensorKind::kAct, TensorKind::kActGrad,
                              TensorKind::kParamGrad};
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32, DType::kF32};
  constexpr uint32_t kTensors = 4;
  bool added = false;
  for (uint32_t i = 0; i < kTensors; ++i)
    reg.Register(names[i], kinds[i], dtypes[i], {8, 16}, i, &added);
  keep(enc.Directory(reg, 0, kTensors, seq++));

  const uint16_t k = 4;
  const uint8_t bins = 4;
  for (uint64_t step = 0; step < steps; ++step) {
    std::vector<wire::TensorStat> stats;
    std::vector<float> sketch;
    std::vector<uint32_t> hist;
    for (uint32_t i = 0; i < kTensors; ++i) {
      double scale = (1.0 + 0.1 * i + 0.01 * step) * (1.0 + drift * step);
      bool nan = nan_step >= 0 && static_cast<int64_t>(step) >= nan_step && i == 1;
      stats.emplace_back(i, 0, i, i < 2 ? static_cast<wire::DType>(dtypes[i]) : wire::DType::F16,
                         0, 0, 128, -scale, scale, 0.01 * scale, 0.5 * scale, 5.6 * scale,
                         scale, nan ? 3 : 0, 0, 2, i == 1 ? 1 : 0, 0);
      for (uint16_t x = 0; x < k; ++x) sketch.push_back(static_cast<float>(scale * (x + 1)));
      for (uint8_t b = 0; b < bins; ++b) hist.push_back(32);
    }
    keep(enc.Stats(step, stats.data(), stats.size(), k, sketch.data(), bins, hist.data(), seq++));
    StepScalars sc;
    sc.loss = 2.0 - 0.1 * step + drift * step;
    if (nan_step >= 0 && static_cast<int64_t>(step) >= nan_step) sc.loss = std::nan("");
    sc.lr = 1e-3;
    sc.grad_norm = 1.5;
    sc.loss_scale = 65536;
    sc.step_time_s = 0.05;
    keep(enc.Scalars(step, sc, seq++));
    keep(enc.StepEnd(step, kTensors, {kTensors}, seq++));
  }
  engine::HeartbeatValues hb;
  hb.records_enqueued = hb.records_sent = kTensors * steps;
  hb.queue_depth = 1;
  hb.last_step = steps - 1;
  keep(enc.Heartbeat(hb, seq++));
  keep(enc.Goodbye("close", steps - 1, seq++));
  return out;
}

// Interleaves runs message by message, as one collector socket would receive them.
std::vector<Msg> Interleave(const std::vector<std::vector<Msg>>& runs) {
  std::vector<Msg> out;
  for (size_t i = 0;; ++i) {
    bool any = false;
    for (const auto& r : runs) {
      if (i < r.size()) {
        out.push_back(r[i]);
        any = true;
      }
    }
    if (!any) return out;
  }
}

Msg Frames(const std::vector<Msg>& msgs) {
  Msg out;
  for (const auto& m : msgs) AppendFrame(&out, m.data(), m.size());
  return out;
}

Msg ReadFile(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return Msg(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A run log of `msgs`, written by the collector's LogWriter: plain records, or zstd
// blocks of at most `buffer` bytes of records each.
Msg RunLog(const fs::path& dir, const std::vector<Msg>& msgs, bool compress = false,
           size_t buffer = 256 << 10) {
  fs::path p = dir / "tmp.lslog";
  fs::remove(p);
  {
    auto w = collector::LogWriter::Open(p.string(), /*recover=*/false, buffer, compress);
    if (!w.ok()) {
      std::fprintf(stderr, "fuzz_seed_gen: %s\n", w.status().message().c_str());
      std::exit(1);
    }
    int64_t t = 1700000000000000000;
    for (const auto& m : msgs) (void)(*w)->Append(m.data(), static_cast<uint32_t>(m.size()), t += 1000);
    (void)(*w)->Sync();
  }
  Msg bytes = ReadFile(p);
  fs::remove(p);
  return bytes;
}

}  // namespace
}  // namespace lockstep::fuzz

int main(int argc, char** argv) {
  using namespace lockstep::fuzz;
  using lockstep::Role;
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seed_gen OUT_DIR\n");
    return 2;
  }
  Quiet();
  fs::path out = argv[1];
  for (const char* d : {"envelope", "session", "runlog"}) fs::create_directories(out / d);

  auto base = AgentRun("base-gpu", Role::kBaseline, 0, 4, 0.0, -1, 1);
  auto cand = AgentRun("cand-npu", Role::kCandidate, 0, 4, 0.05, 3, 2);
  auto solo = AgentRun("solo.run_1", Role::kSolo, 1, 3, 0.0, 1, 3);

  // envelope: every message of one agent, each body type once at least.
  for (size_t i = 0; i < cand.size(); ++i)
    WriteFile(out / "envelope" / ("cand-" + std::to_string(i)), cand[i].data(), cand[i].size());

  // session: a pair that drifts and turns NaN; a solo run; a candidate whose agent
  // restarted (a second Hello with another start time) after a gap.
  Msg pair = Frames(Interleave({base, cand}));
  WriteFile(out / "session" / "pair", pair.data(), pair.size());
  Msg s = Frames(solo);
  WriteFile(out / "session" / "solo", s.data(), s.size());
  auto restarted = AgentRun("cand-npu", Role::kCandidate, 0, 2, 0.05, -1, 99);
  std::vector<Msg> restart(cand.begin(), cand.begin() + 5);
  restart.insert(restart.end(), restarted.begin(), restarted.end());
  Msg r = Frames(Interleave({base, restart}));
  WriteFile(out / "session" / "restart", r.data(), r.size());

  // runlog: as the collector records it, and as a crash or a bad disk leaves it.
  Msg log = RunLog(out, cand);
  WriteFile(out / "runlog" / "clean.lslog", log.data(), log.size());
  WriteFile(out / "runlog" / "torn.lslog", log.data(), log.size() - 7);
  Msg flipped = log;
  flipped[flipped.size() / 2] ^= 0x10;
  WriteFile(out / "runlog" / "flipped.lslog", flipped.data(), flipped.size());
  Msg bad_len = log;
  bad_len[16 + 2] = 0x7f;  // the first record's length, far past the end of the file
  WriteFile(out / "runlog" / "bad-length.lslog", bad_len.data(), bad_len.size());
  Msg two = RunLog(out, Interleave({solo, base}));
  WriteFile(out / "runlog" / "two-runs.lslog", two.data(), two.size());
  // Compressed blocks (the collector's default): several, and one torn.
  Msg blocks = RunLog(out, Interleave({base, cand}), /*compress=*/true, 2048);
  WriteFile(out / "runlog" / "blocks.lslog", blocks.data(), blocks.size());
  WriteFile(out / "runlog" / "blocks-torn.lslog", blocks.data(), blocks.size() - 5);
  std::printf("fuzz_seed_gen: seeds in %s\n", out.c_str());
  return 0;
}
