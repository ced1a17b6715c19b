// Estimators over two runs' statistics of the same tensor (docs/statistics.md
// "Estimators"): relative Euclidean distance and cosine from the count-sketches and the
// exact norms, KL divergence of the log2-magnitude histograms, relative errors.
// Header-only, standard library only: the collector's detectors and the agent's tests
// both include it. Pure functions; safe from any thread.
//
// x is the baseline tensor, y the candidate. The sketch is linear, S(x) - S(y) = S(x - y),
// so ||S(x) - S(y)|| estimates d = ||x - y|| without bias in d^2; its relative standard
// deviation is about sqrt(1 / (2K)) (12.5 % at K = 32) for d and sqrt(2 / K) for d^2.
#ifndef LOCKSTEP_COMMON_SKETCH_MATH_H_
#define LOCKSTEP_COMMON_SKETCH_MATH_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace lockstep {

// ||sx - sy||^2 over k entries, accumulated in double: the estimate of d^2.
inline double SketchDiffSquared(const float* sx, const float* sy, int k) noexcept {
  double s = 0;
  for (int j = 0; j < k; ++j) {
    double d = static_cast<double>(sx[j]) - static_cast<double>(sy[j]);
    s += d * d;
  }
  return s;
}

// Estimated ||x - y|| / ||x||. 0 when both sketches are equal; +Inf when ||x|| = 0 and
// the sketches differ; NaN when an input is NaN.
inline double SketchRelDistance(const float* sx, const float* sy, int k, double l2x) noexcept {
  const double d = std::sqrt(SketchDiffSquared(sx, sy, k));
  if (d == 0) return std::isnan(l2x) ? l2x : 0.0;
  if (l2x == 0) return std::numeric_limits<double>::infinity();
  return d / l2x;
}

// Estimated cosine of x and y by the law of cosines from the exact norms and the
// sketched distance: (|x|^2 + |y|^2 - d^2) / (2 |x| |y|), clamped to [-1, 1]. Exact (1)
// for equal sketches; its error is that of d^2, so it shrinks with 1 - cos, unlike
// <Sx,Sy> / (|Sx| |Sy|). Both norms 0: 1; one of them 0: 0.
inline double SketchCosine(const float* sx, const float* sy, int k, double l2x, double l2y) noexcept {
  if (std::isnan(l2x) || std::isnan(l2y)) return std::numeric_limits<double>::quiet_NaN();
  if (l2x == 0 || l2y == 0) return (l2x == 0 && l2y == 0) ? 1.0 : 0.0;
  const double d2 = SketchDiffSquared(sx, sy, k);
  const double c = (l2x * l2x + l2y * l2y - d2) / (2 * l2x * l2y);
  return std::clamp(c, -1.0, 1.0);
}

// The naive estimate <Sx,Sy> / (|Sx| |Sy|), kept only to show (in tests) why it is not
// used: near cos = 1 its error is of the order of sqrt(2/K) * sin, far above 1 - cos.
inline double NaiveSketchCosine(const float* sx, const float* sy, int k) noexcept {
  double xy = 0, xx = 0, yy = 0;
  for (int j = 0; j < k; ++j) {
    xy += static_cast<double>(sx[j]) * sy[j];
    xx += static_cast<double>(sx[j]) * sx[j];
    yy += static_cast<double>(sy[j]) * sy[j];
  }
  if (xx == 0 || yy == 0) return 0;
  return xy / std::sqrt(xx * yy);
}

// One sigma of the relative error of SketchRelDistance for a spread-out difference
// (docs/statistics.md): sqrt(1 / (2K)). For SketchCosine, 1 - cos has about twice that.
inline double SketchRelDistanceSigma(int k) noexcept {
  return k > 0 ? std::sqrt(1.0 / (2.0 * k)) : std::numeric_limits<double>::infinity();
}

// KL(P || Q) in nats between two histograms of the same bins (MindStudio's KLD): p is
// the baseline, q the candidate, each smoothed P_b = (p_b + alpha) / (sum p + alpha*bins)
// so that an empty bin never gives Inf. 0 for identical histograms.
inline double HistKL(const uint32_t* p, const uint32_t* q, int bins, double alpha = 0.5) noexcept {
  if (bins <= 0) return 0;
  double sp = 0, sq = 0;
  for (int b = 0; b < bins; ++b) {
    sp += p[b];
    sq += q[b];
  }
  const double np = sp + alpha * bins, nq = sq + alpha * bins;
  if (np <= 0 || nq <= 0) return 0;
  double kl = 0;
  for (int b = 0; b < bins; ++b) {
    const double pb = (p[b] + alpha) / np, qb = (q[b] + alpha) / nq;
    if (pb > 0) kl += pb * std::log(pb / qb);
  }
  return std::max(0.0, kl);
}

// |candidate - baseline| / max(|baseline|, floor): the relative error the drift
// detectors threshold. NaN if either is NaN; Inf/Inf mismatches give Inf.
inline double RelError(double candidate, double baseline, double floor = 1e-30) noexcept {
  if (std::isnan(candidate) || std::isnan(baseline)) return std::numeric_limits<double>::quiet_NaN();
  if (candidate == baseline) return 0;  // also equal infinities
  return std::fabs(candidate - baseline) / std::max(std::fabs(baseline), floor);
}

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_SKETCH_MATH_H_
