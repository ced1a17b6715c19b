// How far apart one tensor is in two runs at one step (docs/design.md "Aligner",
// docs/rules.md "tensor_drift").
//
// Raw metrics, for people and for the compare table:
//   rel_l2, rel_absmax   |c - b| / |b| of the norm and of the largest magnitude
//   rel_mean, rel_std    |c - b| / rms(b) with rms = l2 / sqrt(numel): the mean of a
//                        gradient sits near 0, so it is measured against the
//                        tensor's scale, not against itself
//   cosine, rel_dist     count-sketch estimates (docs/statistics.md "Estimators"):
//                        d = ||S(b) - S(c)|| (sketches are linear), rel_dist = d / l2_b,
//                        cosine by the law of cosines from l2_b, l2_c and d
//   kl                   KL(baseline || candidate) of the log2-magnitude histograms
//                        (Jeffreys smoothing: +0.5 per bin)
//   nonfinite_mismatch   one side holds NaN/Inf, the other does not
//   rel_minmax           max(|c - b| of max, of min) / absmax(b): only for a
//                        statistics-only pair
// A statistics-only pair (a row with StatFlags::kStatsOnly on either side: an msprobe
// import, docs/msprobe.md) is judged on what both sides have: l2, mean, absmax, min and
// max. std, the sketch and the histogram are left out (NaN), and rel_dist is the lower
// bound max(rel_l2, rel_mean) of the distance (||x - y|| >= | |x| - |y| | and
// >= sqrt(n) |mean_x - mean_y|): a difference that keeps those four statistics is not seen.
// The drift score is max over metrics of |c - b| / (atol + rtol_m * scale_m): above
// 1 the tensor is beyond the hard tolerance. `dominant` names the metric that set it.
//
// The noise-level floor (docs/rules.md "Noise-level tensors"): a tensor whose magnitude
// is noise next to its peers (the baseline step's tensors of the same kind) is judged
// against an absolute floor from that context, not against its own scale: a gradient
// of ~1e-8 where the other gradients are ~1e-2 (a mathematically-zero gradient, e.g. a
// conv bias before BatchNorm) differs by rounding, and that is not a divergence.
// PeerScales gives each kind's typical element magnitude (the median rms of the
// step's tensors of that kind); WithContextFloor sets Tolerance::atol_rms to
// kContextFloor x rtol x that magnitude. A tensor at its peers' scale loses ~1 % of
// sensitivity; one 100x below them, half; one 1e6x below is judged at its peers'
// resolution.
//
// Pure functions; any thread.
#ifndef LOCKSTEP_COLLECTOR_ALIGN_PAIR_METRICS_H_
#define LOCKSTEP_COLLECTOR_ALIGN_PAIR_METRICS_H_

#include <cstdint>

#include "align/step_data.h"

namespace lockstep::collector {

enum class Metric : uint8_t { kNone = 0, kL2, kMean, kAbsmax, kStd, kSketchDist, kKl, kNonfinite, kMinMax };
const char* MetricName(Metric m);

// Tolerances of one comparison; see rules/rules_config.h for the defaults by dtype.
struct Tolerance {
  double rtol = 1e-3;         // relative tolerance of l2, mean, std, sketch distance
  double absmax_factor = 2.0; // absmax is one element: rtol * this
  double atol = 1e-12;        // absolute floor, so all-zero and denormal tensors compare equal
  double kl_max = 0;          // 0 = KL reported but not judged
  // The context floor, in element units (rms): added to the tolerance of every metric,
  // scaled to it (x sqrt(numel) for norms). 0 = none. Set by WithContextFloor.
  double atol_rms = 0;
};

inline constexpr double kContextFloor = 0.01;

// Each kind's typical element magnitude in one step: the (upper) median over the
// step's finite, non-repeat rows of that kind of rms = l2 / sqrt(numel).
class PeerScales {
 public:
  explicit PeerScales(const StepData& step);
  double Of(Kind kind) const { return scale_[static_cast<uint8_t>(kind) & 7]; }

 private:
  double scale_[8] = {0, 0, 0, 0, 0, 0, 0, 0};
};

// `tol` with atol_rms = kContextFloor x rtol x the peers' scale of the row's kind.
Tolerance WithContextFloor(Tolerance tol, const PeerScales& peers, uint64_t key);

struct PairEval {
  double rel_l2 = 0, rel_mean = 0, rel_absmax = 0, rel_std = 0;
  double cosine = 1, rel_dist = 0;  // NaN when either side has no sketch
  double kl = 0;                    // NaN when either side has no histogram
  bool nonfinite_mismatch = false;
  bool stats_only = false;          // judged on the statistics only (see above)
  double rel_minmax = 0;            // statistics-only pairs; else 0
  double score = 0;                 // normalized: > 1 is beyond the hard tolerance
  Metric dominant = Metric::kNone;
  double dominant_error = 0;        // the dominant metric's raw value
};

// Count-sketch estimators as defined in docs/statistics.md (the agent's sketch has a
// fixed hash, so both runs' sketches of equal tensors are equal). `l2_x`, `l2_y` are
// the exact norms from the statistics, x the baseline.
double SketchDistance(const float* sx, const float* sy, int k);  // ||S(x) - S(y)||
// d / |x|; 0 when d == 0, +inf when only |x| is zero.
double SketchRelDist(const float* sx, const float* sy, int k, double l2_x);
// (|x|^2 + |y|^2 - d^2) / (2 |x| |y|) clamped to [-1, 1]; 1 for two zero tensors, 0
// when exactly one is zero.
double SketchCosine(const float* sx, const float* sy, int k, double l2_x, double l2_y);
// KL(p || q) in nats with +0.5 smoothing per bin.
double HistKl(const uint32_t* p, const uint32_t* q, int bins);

PairEval EvaluatePair(const StepData& bs, const StatRow& b, const StepData& cs, const StatRow& c,
                      const Tolerance& tol);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_ALIGN_PAIR_METRICS_H_
