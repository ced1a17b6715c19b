// Bench of retention (collector/src/runlog/retention.h): how fast closed segments of a
// long run are thinned in the background.
//
// BENCH retention_compact_mb_per_s: MB (1e6 bytes) of closed segments thinned per second
// (read, checked, decompressed, filtered, recompressed, written, fdatasync-ed and renamed:
// Retention's own timing of its rewrites, RetentionCounters::seconds), the median of 3
// passes, each over a fresh data dir holding one run of 3,000 steps in zstd blocks and
// 8 MiB segments, each step one StepStats message of 256 tensors (sketch 32, 16 bins,
// values drawn at random: as incompressible as a real log's) with its scalars and StepEnd;
// --retain-steps 100, --thin-every 100. No target: at a GPT-2-sized rank's ~116 KB a
// step (docs/load.md), 5 MB/s thins 43 steps a second, far ahead of any training run.
// The bytes before and after go to stderr.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_format.h"
#include "runlog/log_writer.h"
#include "runlog/retention.h"
#include "test_dir.h"
#include "test_messages.h"

namespace {

using lockstep::collector::LogWriter;
using lockstep::collector::Retention;
using lockstep::collector::RetentionOptions;
using lockstep::testing::At;

constexpr uint64_t kSteps = 3000;
constexpr uint32_t kTensors = 256, kSketch = 32, kBins = 16;

// Statistics that change from step to step as a training run's do (a fixed pattern
// would compress far better than real logs): a small xorshift generator.
struct Rng {
  uint64_t x = 0x9E3779B97F4A7C15ull;
  float Next() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return static_cast<float>(x >> 40) / static_cast<float>(1 << 24);
  }
};

lockstep::testing::Bytes RandomStats(const lockstep::testing::Head& h, uint64_t step, Rng& rng) {
  flatbuffers::FlatBufferBuilder fbb(1024 + kTensors * (128 + kSketch * 4 + kBins * 4));
  std::vector<lockstep::wire::TensorStat> stats;
  std::vector<float> sketch;
  std::vector<uint32_t> hist;
  for (uint32_t i = 0; i < kTensors; ++i) {
    const double m = rng.Next() - 0.5, sd = 0.5 + rng.Next();
    stats.emplace_back(i, 0, i, lockstep::wire::DType::BF16, 0, 0, 4096, m - 3 * sd, m + 3 * sd, m,
                       sd, 64 * sd, 3 * sd, 0, 0, 1, 0, 0);
    for (uint32_t k = 0; k < kSketch; ++k) sketch.push_back(rng.Next() * 8 - 4);
    for (uint32_t b = 0; b < kBins; ++b) hist.push_back(static_cast<uint32_t>(rng.Next() * 512));
  }
  auto body =
      lockstep::wire::CreateStepStatsDirect(fbb, step, &stats, kSketch, &sketch, kBins, &hist);
  return lockstep::testing::Finish(fbb, h, lockstep::wire::Body::StepStats, body.Union());
}

void WriteRun(const std::string& dir) {
  auto w =
      LogWriter::Open(lockstep::collector::runlog::LogPathFor(dir, "run"), true, 256 << 10, true);
  if (!w.ok()) {
    std::fprintf(stderr, "%s\n", w.status().message().c_str());
    std::exit(1);
  }
  (*w)->SetSegmentBytes(8 << 20);
  uint64_t seq = 0;
  auto put = [&](const lockstep::testing::Bytes& b) {
    (void)(*w)->Append(b.data(), b.size(), 1000 + seq);
  };
  put(lockstep::testing::Hello(At("run", 0, seq++), "bench", lockstep::wire::Role::Solo));
  Rng rng;
  for (uint64_t s = 0; s < kSteps; ++s) {
    put(RandomStats(At("run", 0, seq++), s, rng));
    put(lockstep::testing::Scalars(At("run", 0, seq++), s, 1.0 / (1 + s)));
    put(lockstep::testing::StepEnd(At("run", 0, seq++), s, 256));
  }
  (void)(*w)->Sync();
}

}  // namespace

int main() {
  spdlog::set_level(spdlog::level::warn);  // a line per segment otherwise, on stdout
  std::vector<double> rates;
  for (int rep = 0; rep < 3; ++rep) {
    lockstep::testing::TempDir dir;
    WriteRun(dir.path());
    RetentionOptions o;
    o.data_dir = dir.path();
    o.retain_steps = 100;
    o.thin_every = 100;
    Retention r(o);
    if (!r.CompactOnce().ok()) return 1;
    auto c = r.counters();
    if (c.segments_thinned == 0 || c.seconds <= 0) {
      std::fprintf(stderr, "nothing was thinned\n");
      return 1;
    }
    rates.push_back(static_cast<double>(c.bytes_before) / 1e6 / c.seconds);
    std::fprintf(stderr, "pass %d: %llu segments, %.1f MB -> %.2f MB in %.2f s (%.1f MB/s)\n", rep,
                 static_cast<unsigned long long>(c.segments_thinned), c.bytes_before / 1e6,
                 c.bytes_after / 1e6, c.seconds, rates.back());
  }
  std::sort(rates.begin(), rates.end());
  std::printf("BENCH retention_compact_mb_per_s %.1f MB/s\n", rates[1]);
  return 0;
}
