// Thresholds of every rule, with the defaults documented in docs/rules.md. One plain
// struct, filled from flags and settings files through the table of rule settings
// (rule_settings.h), read by the detectors. Copied at start-up; never changed while running.
#ifndef LOCKSTEP_COLLECTOR_RULES_RULES_CONFIG_H_
#define LOCKSTEP_COLLECTOR_RULES_RULES_CONFIG_H_

#include <cstdint>

#include "align/pair_metrics.h"
#include "align/step_data.h"

namespace lockstep::collector {

// A tolerance per precision class. The class of a pair is the lowest-precision float
// dtype either run has shown so far (errors made in a bf16 matmul travel into the
// fp32 tensors after it), or the tensor's own dtypes if lower.
struct ByPrecision {
  double fp64, fp32, fp16, bf16, fp8;
  double For(DT d) const;
};

struct RulesConfig {
  // tensor_drift / first_divergence: relative tolerance (Tolerance::rtol) by precision.
  ByPrecision rtol{1e-6, 1e-3, 1e-2, 5e-2, 2e-1};
  double atol = 1e-12;          // absolute floor of every comparison
  double absmax_factor = 2.0;   // absmax is a single element: looser
  double kl_max = 0;            // histogram KL judged when > 0
  double critical_factor = 10;  // score >= this x threshold -> critical
  int64_t max_tensor_alerts_per_step = 5;  // tensor_drift alerts per pair and step (earliest first)

  // Noise floor: a tensor's normal divergence, learned over its first floor_steps
  // compared steps; afterwards it drifts when score > max(1, floor_k * floor).
  int64_t floor_steps = 5;
  double floor_k = 3.0;

  // first_divergence's birth point (docs/rules.md "Where the error is born"): an op adds
  // error of its own when its output's relative error exceeds birth_gain x its inputs'
  // plus the rounding its dtype explains, u x (birth_ulps + 2 sqrt(width)). 0 ulps: off.
  double birth_gain = 8.0;
  double birth_ulps = 32.0;

  // loss_drift: |loss_c - loss_b| / |loss_b| by precision.
  ByPrecision loss_rtol{1e-6, 1e-3, 1e-2, 5e-2, 2e-1};

  // scalars: lr, loss scale and samples differ when |c - b| > scalar_rtol * max(|b|, |c|)
  // (a schedule computed in float64 on both sides agrees to ~1e-15); the global grad
  // norm, which rounding moves, when beyond grad_norm_rtol.
  double scalar_rtol = 1e-6;
  double grad_norm_rtol = 1e-2;

  // trend: over trend_window steps the score grew trend_growth-fold, is still below
  // the threshold and at least trend_min of it.
  int64_t trend_window = 8;
  double trend_growth = 4.0;
  double trend_min = 0.25;

  // overflow
  bool overflow_fp32_limit = true;   // fp32 tensors: values past fp16's range (warning)
  double overflow_absmax_frac = 0.5; // own low-precision dtype: absmax >= frac * max finite
  int64_t loss_scale_drops = 3;          // drops within loss_scale_window steps -> warning
  int64_t loss_scale_window = 50;

  // underflow
  double underflow_frac = 0.01;      // subnormal / numel in a low-precision tensor
  bool underflow_fp32_limit = false; // also judge fp32 tensors against their limit dtype
  bool underflow_zero_grad = true;   // a param_grad that was non-zero becomes all zeros

  // spike: EWMA of loss and grad norm; both directions.
  double spike_alpha = 0.1;
  int64_t spike_warmup = 10;
  double spike_loss_ratio = 2.0;     // x > r * ewma or x < ewma / r
  double spike_grad_ratio = 5.0;
  double spike_z = 6.0;              // and |x - ewma| > z * ewm stddev

  // stall: no message (heartbeat included) or no new step for stall_s seconds.
  double stall_s = 120;

  Tolerance TensorTolerance(DT precision) const {
    return Tolerance{rtol.For(precision), absmax_factor, atol, kl_max};
  }
};

// The lower precision of two dtypes (fp8 < bf16 < fp16 < fp32 < fp64); non-float
// dtypes do not lower it.
DT LowerPrecision(DT a, DT b);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RULES_RULES_CONFIG_H_
