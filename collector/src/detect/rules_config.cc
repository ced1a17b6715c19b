#include "detect/rules_config.h"

#include "lockstep/common/flags.h"

namespace lockstep::collector {
namespace {

int Rank(DT d) {
  switch (d) {
    case DT::kF8E4M3:
    case DT::kF8E5M2: return 1;
    case DT::kBF16: return 2;
    case DT::kF16: return 3;
    case DT::kF32: return 4;
    case DT::kF64: return 5;
    default: return 0;  // not a float: no say in the precision
  }
}

}  // namespace

double ByPrecision::For(DT d) const {
  switch (d) {
    case DT::kF64: return fp64;
    case DT::kF16: return fp16;
    case DT::kBF16: return bf16;
    case DT::kF8E4M3:
    case DT::kF8E5M2: return fp8;
    default: return fp32;
  }
}

DT LowerPrecision(DT a, DT b) {
  const int ra = Rank(a), rb = Rank(b);
  if (ra == 0) return b;
  if (rb == 0) return a;
  return ra <= rb ? a : b;
}

void AddRuleFlags(cli::FlagSet* fs, RulesConfig* c) {
  fs->Double("tol-fp64", &c->rtol.fp64, "tensor_drift relative tolerance when the pair's lowest precision is fp64");
  fs->Double("tol-fp32", &c->rtol.fp32, "tensor_drift relative tolerance for fp32 pairs");
  fs->Double("tol-fp16", &c->rtol.fp16, "tensor_drift relative tolerance for fp16 pairs");
  fs->Double("tol-bf16", &c->rtol.bf16, "tensor_drift relative tolerance for bf16 pairs");
  fs->Double("tol-fp8", &c->rtol.fp8, "tensor_drift relative tolerance for fp8 pairs");
  fs->Double("atol", &c->atol, "absolute tolerance floor of every tensor comparison");
  fs->Double("tol-kl", &c->kl_max, "judge histogram KL divergence above this (0 = report only)");
  fs->Double("critical-factor", &c->critical_factor, "a drift this many times its threshold is critical");
  fs->Int("max-tensor-alerts", &c->max_tensor_alerts_per_step, "tensor_drift alerts per pair and step (earliest in execution order first)");
  fs->Int("floor-steps", &c->floor_steps, "steps over which each tensor's normal divergence (noise floor) is learned");
  fs->Double("floor-k", &c->floor_k, "a tensor drifts when its score exceeds max(1, floor-k x its noise floor)");
  fs->Double("loss-tol-fp32", &c->loss_rtol.fp32, "loss_drift relative tolerance for fp32 pairs");
  fs->Double("loss-tol-fp16", &c->loss_rtol.fp16, "loss_drift relative tolerance for fp16 pairs");
  fs->Double("loss-tol-bf16", &c->loss_rtol.bf16, "loss_drift relative tolerance for bf16 pairs");
  fs->Int("trend-window", &c->trend_window, "steps over which trend looks for a growing divergence");
  fs->Double("scalar-tol", &c->scalar_rtol, "relative tolerance of the scalars rule for lr, loss scale and samples");
  fs->Double("grad-norm-tol", &c->grad_norm_rtol, "relative tolerance of the scalars rule for the global grad norm");
  fs->Double("trend-growth", &c->trend_growth, "growth factor of the drift score over the window that makes a trend");
  fs->Bool("overflow-fp32-limit", &c->overflow_fp32_limit, "warn when fp32 tensors hold values past fp16's range");
  fs->Bool("underflow-fp32-limit", &c->underflow_fp32_limit, "also judge fp32 tensors' subnormal counts (against fp16's range)");
  fs->Double("underflow-frac", &c->underflow_frac, "fraction of subnormal values in a low-precision tensor that is an underflow");
  fs->Double("spike-loss-ratio", &c->spike_loss_ratio, "loss above ratio x its EWMA (or below EWMA / ratio) is a spike");
  fs->Double("spike-grad-ratio", &c->spike_grad_ratio, "grad norm above ratio x its EWMA (or below EWMA / ratio) is a spike");
  fs->Double("stall-seconds", &c->stall_s, "a run with no message or no new step for this long has stalled");
  // Every other number: 0 or more, finite (FlagSet's default).
  fs->Range("critical-factor", 1, 1e12);
  fs->Range("floor-steps", 0, 1e6);
  fs->Range("trend-window", 0, 1e4);  // each tensor keeps this many scores
  fs->Range("underflow-frac", 0, 1);
  fs->Range("spike-loss-ratio", 1, 1e12);
  fs->Range("spike-grad-ratio", 1, 1e12);
  fs->Range("stall-seconds", 0, 366 * 86400.0);  // held in nanoseconds
}

}  // namespace lockstep::collector
