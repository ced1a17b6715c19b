// align_bench: throughput of the aligner + detectors on one thread.
//
// Two runs (baseline, candidate) of a 1,000-tensor model with K=32 sketches and 16-bin
// histograms, 200 steps each, pre-encoded as real wire messages (tests/detect/
// stream_builder.h) so only the analyzer is timed: decoding each StepStats into
// compact rows, closing steps, the merge-join by (name, kind, micro step), PairEval
// of every matched tensor, noise floor / trend bookkeeping and every rule; then again
// with every op's inputs (act_in) and the birth rule (rules/birth.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
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

namespace {

// One stream pair through fresh analyzers, best of 3: matched tensor pairs per second.
// `with_inputs`: every op also sends what it received (kind act_in, issue 14), which
// is the output just before it (a repeat) for 9 ops in 10, so the birth rule runs on
// every step; pairs counts the outputs only, as without.
double Run(bool with_inputs) {
  constexpr int kTensors = 1000, kSteps = 200, kK = 32, kBins = 16;
  // Ids are directory positions: the outputs 0..kTensors-1, then their inputs.
  std::vector<FakeTensor> model;
  for (int in = 0; in <= (with_inputs ? 1 : 0); ++in) {
    for (int i = 0; i < kTensors; ++i) {
      model.push_back(FakeTensor{"model.layers." + std::to_string(i / 10) + ".op" + std::to_string(i % 10),
                                 in ? lockstep::wire::TensorKind::ActIn : lockstep::wire::TensorKind::Act,
                                 lockstep::wire::DType::F32, static_cast<uint32_t>(in ? 2 * i : 2 * i + 1)});
    }
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
      stats.reserve(2 * kTensors);
      for (int i = 0; i < kTensors; ++i) {
        FakeStat st;
        st.id = i;
        st.order = with_inputs ? 2 * i + 1 : i;
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
        if (with_inputs) {
          FakeStat in = i > 0 ? stats.back() : st;  // the output before it
          in.id = kTensors + i;
          in.order = 2 * i;
          in.flags = (i % 10 != 0) ? static_cast<uint8_t>(lockstep::wire::StatFlags::kRepeat) : 0;
          stats.push_back(std::move(in));
        }
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
  for (int rep = 0; rep < 3; ++rep) {
    uint64_t alerts = 0;
    Analyzer an(AnalyzerOptions{}, [&](lockstep::alerting::Alert) { ++alerts; });
    auto t0 = std::chrono::steady_clock::now();
    for (const auto& m : msgs) an.OnMessage(AsEnvelope(m), 0);
    an.Finish();
    auto t1 = std::chrono::steady_clock::now();
    const uint64_t pairs = static_cast<uint64_t>(kTensors) * kSteps;
    const uint64_t evaluated = an.counters().pairs_compared;  // + the inputs that are not repeats
    if (evaluated < pairs) return -1;
    const double secs = std::chrono::duration<double>(t1 - t0).count();
    best_pairs_per_s = std::max(best_pairs_per_s, pairs / secs);
    std::printf("rep %d%s: %llu tensor pairs (%llu evaluated) in %.3f s, %llu alerts\n", rep,
                with_inputs ? " (with inputs)" : "", static_cast<unsigned long long>(pairs),
                static_cast<unsigned long long>(evaluated), secs, static_cast<unsigned long long>(alerts));
  }
  return best_pairs_per_s;
}

}  // namespace

int main() {
  const double plain = Run(false);
  const double with_inputs = Run(true);
  // align_pairs_per_s: matched output pairs decoded, aligned, evaluated and run through
  // every rule per second of one thread (best of 3), message decoding included.
  std::printf("BENCH align_pairs_per_s %.0f pairs/s\n", plain);
  // The same stream with each op's inputs (act_in) and the birth rule on every step:
  // still per output pair, so the two figures compare directly.
  std::printf("BENCH align_pairs_per_s_with_inputs %.0f pairs/s\n", with_inputs);
  return plain > 0 && with_inputs > 0 ? 0 : 1;
}
