#include "align/pair_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace lockstep::collector {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// |c - b| / denom with NaN handled: both NaN (no finite value on either side) is
// agreement; one NaN is total disagreement.
double Diff(double b, double c) {
  const bool nb = std::isnan(b), nc = std::isnan(c);
  if (nb && nc) return 0;
  if (nb || nc) return kInf;
  return std::fabs(c - b);
}

double Ratio(double num, double den) {
  if (num == 0) return 0;
  if (den == 0 || std::isnan(den)) return kInf;
  return num / den;
}

}  // namespace

const char* MetricName(Metric m) {
  switch (m) {
    case Metric::kNone: return "none";
    case Metric::kL2: return "rel_err_l2";
    case Metric::kMean: return "rel_err_mean";
    case Metric::kAbsmax: return "rel_err_absmax";
    case Metric::kStd: return "rel_err_std";
    case Metric::kSketchDist: return "sketch_rel_dist";
    case Metric::kKl: return "hist_kl";
    case Metric::kNonfinite: return "nonfinite_mismatch";
    case Metric::kMinMax: return "rel_err_minmax";
  }
  return "unknown";
}

double SketchDistance(const float* sx, const float* sy, int k) {
  double dd = 0;
  for (int i = 0; i < k; ++i) {
    const double d = static_cast<double>(sy[i]) - sx[i];
    dd += d * d;
  }
  return std::sqrt(dd);
}

double SketchRelDist(const float* sx, const float* sy, int k, double l2_x) {
  const double d = SketchDistance(sx, sy, k);
  return Ratio(d, std::isnan(l2_x) ? 0 : l2_x);
}

double SketchCosine(const float* sx, const float* sy, int k, double l2_x, double l2_y) {
  if (std::isnan(l2_x)) l2_x = 0;
  if (std::isnan(l2_y)) l2_y = 0;
  if (l2_x == 0 && l2_y == 0) return 1.0;  // two zero tensors are the same tensor
  if (l2_x == 0 || l2_y == 0) return 0.0;
  const double d = SketchDistance(sx, sy, k);
  const double c = (l2_x * l2_x + l2_y * l2_y - d * d) / (2 * l2_x * l2_y);
  return std::clamp(c, -1.0, 1.0);
}

double HistKl(const uint32_t* p, const uint32_t* q, int bins) {
  double np = 0, nq = 0;
  for (int i = 0; i < bins; ++i) {
    np += p[i];
    nq += q[i];
  }
  if (np == 0 && nq == 0) return 0;
  const double sp = np + 0.5 * bins, sq = nq + 0.5 * bins;
  double kl = 0;
  for (int i = 0; i < bins; ++i) {
    const double pi = (p[i] + 0.5) / sp, qi = (q[i] + 0.5) / sq;
    kl += pi * std::log(pi / qi);
  }
  return kl < 0 ? 0 : kl;
}

PeerScales::PeerScales(const StepData& step) {
  // Reused across steps: once per compared step on the analyzer's thread, which
  // should not allocate once warm.
  thread_local std::vector<double> by_kind[8];
  for (auto& v : by_kind) v.clear();
  for (const StatRow& r : step.rows) {
    if (r.repeat || r.numel == 0 || !std::isfinite(r.l2)) continue;
    by_kind[static_cast<uint8_t>(KeyKind(r.key)) & 7].push_back(r.l2 / std::sqrt(static_cast<double>(r.numel)));
  }
  for (int k = 0; k < 8; ++k) {
    auto& v = by_kind[k];
    if (v.empty()) continue;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    scale_[k] = v[v.size() / 2];
  }
}

Tolerance WithContextFloor(Tolerance tol, const PeerScales& peers, uint64_t key) {
  tol.atol_rms = kContextFloor * tol.rtol * peers.Of(KeyKind(key));
  return tol;
}

PairEval EvaluatePair(const StepData& bs, const StatRow& b, const StepData& cs, const StatRow& c,
                      const Tolerance& tol) {
  PairEval e;
  e.stats_only = b.stats_only || c.stats_only;
  const double rms = b.numel > 0 && !std::isnan(b.l2) ? b.l2 / std::sqrt(static_cast<double>(b.numel)) : 0;
  const double d_l2 = Diff(b.l2, c.l2), d_mean = Diff(b.mean, c.mean);
  const double d_abs = Diff(b.absmax, c.absmax), d_std = Diff(b.std, c.std);
  e.rel_l2 = Ratio(d_l2, std::fabs(b.l2));
  e.rel_mean = Ratio(d_mean, rms);
  e.rel_absmax = Ratio(d_abs, std::fabs(b.absmax));
  e.rel_std = Ratio(d_std, rms);

  // The context floor in each metric's units: element magnitudes (mean, std, absmax)
  // take it as is, norms (l2, sketch distance) x sqrt(numel).
  const double floor_elem = tol.atol_rms;
  const double floor_norm = tol.atol_rms * std::sqrt(static_cast<double>(b.numel));
  auto consider = [&](Metric m, double diff, double scale, double rtol, double raw, double floor) {
    const double s = diff == 0 ? 0 : diff / (tol.atol + floor + rtol * (std::isnan(scale) ? 0 : scale));
    if (s > e.score || (e.dominant == Metric::kNone && s == e.score && s > 0)) {
      e.score = s;
      e.dominant = m;
      e.dominant_error = raw;
    }
  };
  consider(Metric::kL2, d_l2, std::fabs(b.l2), tol.rtol, e.rel_l2, floor_norm);
  consider(Metric::kMean, d_mean, rms, tol.rtol, e.rel_mean, floor_elem);
  if (e.stats_only) {
    // std is not in the dump; max and min are, and bound the same element's change.
    e.rel_std = std::numeric_limits<double>::quiet_NaN();
    const double d_mm = std::max(Diff(b.max, c.max), Diff(b.min, c.min));
    e.rel_minmax = Ratio(d_mm, std::fabs(b.absmax));
    consider(Metric::kMinMax, d_mm, std::fabs(b.absmax), tol.rtol * tol.absmax_factor, e.rel_minmax,
             floor_elem * tol.absmax_factor);
  } else {
    consider(Metric::kStd, d_std, rms, tol.rtol, e.rel_std, floor_elem);
  }
  consider(Metric::kAbsmax, d_abs, std::fabs(b.absmax), tol.rtol * tol.absmax_factor, e.rel_absmax,
           floor_elem * tol.absmax_factor);

  const float* sb = bs.SketchOf(b);
  const float* sc = cs.SketchOf(c);
  if (sb && sc && b.sketch_k == c.sketch_k) {
    const double d = SketchDistance(sb, sc, b.sketch_k);
    e.rel_dist = Ratio(d, std::isnan(b.l2) ? 0 : b.l2);
    e.cosine = SketchCosine(sb, sc, b.sketch_k, b.l2, c.l2);
    consider(Metric::kSketchDist, d, std::fabs(b.l2), tol.rtol, e.rel_dist, floor_norm);
  } else {
    e.cosine = std::numeric_limits<double>::quiet_NaN();
    // Statistics only: the distance is at least what the norm and the mean show.
    e.rel_dist = e.stats_only ? std::max(e.rel_l2, e.rel_mean) : std::numeric_limits<double>::quiet_NaN();
  }

  const uint32_t* hb = bs.HistOf(b);
  const uint32_t* hc = cs.HistOf(c);
  if (hb && hc && b.hist_bins == c.hist_bins) {
    e.kl = HistKl(hb, hc, b.hist_bins);
    if (tol.kl_max > 0 && e.kl > 0) {
      const double s = e.kl / tol.kl_max;
      if (s > e.score) {
        e.score = s;
        e.dominant = Metric::kKl;
        e.dominant_error = e.kl;
      }
    }
  } else {
    e.kl = std::numeric_limits<double>::quiet_NaN();
  }

  e.nonfinite_mismatch = b.nonfinite() != c.nonfinite();
  if (e.nonfinite_mismatch) {
    e.score = kInf;
    e.dominant = Metric::kNonfinite;
    e.dominant_error = static_cast<double>(c.nan_count + c.inf_count) -
                       static_cast<double>(b.nan_count + b.inf_count);
  }
  return e;
}

}  // namespace lockstep::collector
