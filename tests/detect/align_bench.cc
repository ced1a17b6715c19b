// align_bench: throughput of the aligner + detectors on one thread.
//
// Two runs (baseline, candidate) of a 1,000-tensor model with K=32 sketches and 16-bin
// histograms, 200 steps each, pre-encoded as real wire messages (tests/detect/
// stream_builder.h) so only the analyzer is timed: decoding each StepStats into
// compact rows, closing steps, the merge-join by (name, kind, micro step), PairEval
// of every matched tensor, noise floor / trend bookkeeping and every rule.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "detect/analyzer.h"
#include "stream_builder.h"

using lockstep::collector::Analyzer;
using lockstep::collector::AnalyzerOptions;
using lockstep::testing::AsEnvelope;
using lockstep::testing::FakeScalars;
using lockstep::testing::FakeStat;
using lockstep::testing::FakeTensor;
using lockstep::testing::StreamBuilder;

int main() {
  constexpr int kTensors = 1000, kSteps = 200, kK = 32, kBins = 16;
  std::vector<FakeTensor> model;
  for (int i = 0; i < kTensors; ++i) {
    model.push_back(FakeTensor{"model.layers." + std::to_string(i / 10) + ".op" + std::to_string(i % 10),
                               lockstep::wire::TensorKind::Act, lockstep::wire::DType::F32, static_cast<uint32_t>(i)});
  }
  StreamBuilder b("base", "bench", lockstep::wire::Role::Baseline), c("cand", "bench", lockstep::wire::Role::Candidate);
  std::vector<std::vector<uint8_t>> msgs;
  msgs.push_back(b.Hello());
  msgs.push_back(c.Hello());
  msgs.push_back(b.Directory(model));
  msgs.push_back(c.Directory(model));
  for (int s = 0; s < kSteps; ++s) {
    for (StreamBuilder* sb : {&b, &c}) {
      std::vector<FakeStat> stats;
      stats.reserve(kTensors);
      for (int i = 0; i < kTensors; ++i) {
        FakeStat st;
        st.id = i;
        st.order = i;
        st.numel = 4096;
        const double scale = 1.0 + 0.001 * i + (sb == &c ? 1e-7 * s : 0);  // tiny, growing difference
        st.l2 = 64 * scale;
        st.mean = 0.01 * scale;
        st.std = scale;
        st.absmax = 4 * scale;
        st.min = -st.absmax;
        st.max = st.absmax;
        st.sketch.assign(kK, 0.f);
        for (int k = 0; k < kK; ++k) st.sketch[k] = static_cast<float>(scale * std::sin(i + k));
        st.hist.assign(kBins, 0u);
        st.hist[10] = 4096;
        stats.push_back(std::move(st));
      }
      msgs.push_back(sb->Stats(s, stats));
      FakeScalars sc;
      sc.loss = 2.0 - 0.001 * s;
      msgs.push_back(sb->Scalars(s, sc));
    }
  }

  // Best of 3 runs, each over all messages with a fresh analyzer.
  double best_pairs_per_s = 0;
  uint64_t pairs = 0;
  for (int rep = 0; rep < 3; ++rep) {
    uint64_t alerts = 0;
    Analyzer an(AnalyzerOptions{}, [&](lockstep::alerting::Alert) { ++alerts; });
    auto t0 = std::chrono::steady_clock::now();
    for (const auto& m : msgs) an.OnMessage(AsEnvelope(m), 0);
    an.Finish();
    auto t1 = std::chrono::steady_clock::now();
    pairs = an.counters().pairs_compared;
    const double secs = std::chrono::duration<double>(t1 - t0).count();
    best_pairs_per_s = std::max(best_pairs_per_s, pairs / secs);
    std::printf("rep %d: %llu tensor pairs in %.3f s, %llu alerts\n", rep, static_cast<unsigned long long>(pairs),
                secs, static_cast<unsigned long long>(alerts));
  }
  // align_pairs_per_s: matched tensor pairs decoded, aligned, evaluated and run through
  // every rule per second of one thread (best of 3), message decoding included.
  std::printf("BENCH align_pairs_per_s %.0f pairs/s\n", best_pairs_per_s);
  return pairs == static_cast<uint64_t>(kTensors) * kSteps ? 0 : 1;
}
