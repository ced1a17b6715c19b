#include "rules/run_rules.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "rules/replica_rule.h"

namespace lockstep::collector {
namespace {

using alerting::Severity;

std::string Fmt(const char* fmt, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, a);
  return buf;
}

std::string TensorLabel(const RunCtx& ctx, const StatRow& r) {
  std::string s = ctx.names->Label(KeyNameId(r.key), static_cast<uint8_t>(KeyKind(r.key)));
  s += " (";
  s += KindName(KeyKind(r.key));
  if (KeyMicroStep(r.key) != 0) s += ", micro step " + std::to_string(KeyMicroStep(r.key));
  s += ")";
  return s;
}

// A tensor that holds its own dtype's extreme finite value on purpose: an additive
// attention mask (transformers' causal mask is torch.finfo(dtype).min where a position is
// masked, built in the run's own dtype: an fp32 run's mask would be fp16's minimum in an
// fp16 run, not an overflow). In fp32 or fp64 nothing computed lands exactly on the
// extreme (an overflow gives inf), so any such tensor is one. In fp16/bf16/fp8 a
// saturating cast (an NPU in saturation mode) gives exactly +-max too, so only a tensor
// made outside every module (a module input no module produced, act_in, or the model's
// input) holding the negative extreme is read as a mask; a module that saturates is still
// reported on its own output.
bool HoldsOwnExtreme(const StatRow& r) {
  const double m = DTypeMaxFinite(r.dtype);
  if (m <= 0) return false;
  if (!IsLowPrecisionFloat(r.dtype)) return r.min == -m || r.max == m;
  const Kind k = KeyKind(r.key);
  return r.min == -m && r.max < m && (k == Kind::kActIn || k == Kind::kInput);
}

void FillTensor(const RunCtx& ctx, const StatRow& r, alerting::Alert* a) {
  a->tensor = ctx.names->Name(KeyNameId(r.key));
  a->kind = KindName(KeyKind(r.key));
  a->micro_step = KeyMicroStep(r.key);
}

// Rows in execution order (rows are stored sorted by key), without repeats: a tensor
// seen under several names is judged once, under its producer's name. Without the
// replica check's rows either (grad_reduced: the parameter gradients again, after the
// all-reduce; rule `replicas`), which would say what their param_grad rows said.
std::vector<const StatRow*> InOrder(const StepData& s) {
  std::vector<const StatRow*> v;
  v.reserve(s.rows.size());
  for (const StatRow& r : s.rows)
    if (!r.repeat && KeyKind(r.key) != Kind::kGradReduced) v.push_back(&r);
  std::sort(v.begin(), v.end(), [](const StatRow* a, const StatRow* b) { return a->order < b->order; });
  return v;
}

}  // namespace

alerting::Alert RunCtx::Make(const char* rule, Severity sev, uint64_t step, uint32_t rank) const {
  alerting::Alert a;
  a.rule = rule;
  a.severity = sev;
  a.experiment = experiment;
  a.runs = {run};
  a.step = step;
  a.rank = rank;
  return a;
}

void NonfiniteDetector::OnStep(const StepData& s) {
  const StatRow* first = nullptr;
  size_t n_bad = 0;
  for (const StatRow& r : s.rows) {
    if (!r.nonfinite() || r.repeat) continue;
    ++n_bad;
    if (first == nullptr || r.order < first->order) first = &r;
  }
  // A NaN loss counts when the job gave it (an agent that says so on the wire); from an
  // older agent a NaN loss means "not given".
  const bool loss_bad = s.has_scalars && (std::isinf(s.scalars.loss) || (s.scalars.loss_given && std::isnan(s.scalars.loss)));
  const bool loss_nan = s.has_scalars && std::isnan(s.scalars.loss) && first != nullptr;
  bool& active = active_[s.rank];
  if (first == nullptr && !loss_bad) {
    active = false;
    return;
  }
  if (active) return;
  active = true;
  auto a = ctx_->Make(rule(), Severity::kCritical, s.step, s.rank);
  a.metric = "nonfinite_count";
  if (first != nullptr) {
    FillTensor(*ctx_, *first, &a);
    a.candidate_value = static_cast<double>(first->nan_count + first->inf_count);
    a.error = a.candidate_value;
    a.threshold = 0;
    a.message = "run " + ctx_->run + " step " + std::to_string(s.step) + " rank " +
                std::to_string(s.rank) + ": first NaN/Inf in " + TensorLabel(*ctx_, *first) + ", " +
                std::to_string(first->nan_count) + " NaN and " + std::to_string(first->inf_count) +
                " Inf of " + std::to_string(first->numel) + " values";
    if (n_bad > 1) a.message += "; " + std::to_string(n_bad - 1) + " later tensor(s) also non-finite";
    if (loss_nan || loss_bad) a.message += std::string("; the loss is ") + (std::isnan(s.scalars.loss) ? "NaN" : "inf") + " too";
  } else {
    a.tensor = "loss";
    a.kind = "loss";
    a.candidate_value = s.scalars.loss;
    a.message = "run " + ctx_->run + " step " + std::to_string(s.step) + ": the loss is " +
                (std::isnan(s.scalars.loss) ? "NaN" : "infinite") + " (no watched tensor was non-finite)";
  }
  ctx_->out->Emit(std::move(a));
}

void OverflowDetector::OnStep(const StepData& s) {
  const RulesConfig& cfg = *ctx_->cfg;
  for (const StatRow* r : InOrder(s)) {
    if (fired_.count(r->key) || HoldsOwnExtreme(*r)) continue;
    const bool own_low = IsLowPrecisionFloat(r->dtype);
    Severity sev = Severity::kWarning;
    std::string why;
    double limit = 0;
    if (r->sat_count > 0 && (own_low || r->limit_dtype == r->dtype)) {
      sev = Severity::kCritical;
      limit = DTypeMaxFinite(r->limit_dtype);
      why = std::to_string(r->sat_count) + " value(s) past " + DTypeName(r->limit_dtype) + "'s range";
    } else if (r->sat_count > 0 && cfg.overflow_fp32_limit) {
      limit = DTypeMaxFinite(r->limit_dtype);
      why = std::to_string(r->sat_count) + " value(s) would overflow " + DTypeName(r->limit_dtype) +
            " (|x| > " + Fmt("%g", limit) + ")";
    } else if (own_low && !std::isnan(r->absmax) &&
               r->absmax >= cfg.overflow_absmax_frac * DTypeMaxFinite(r->dtype)) {
      limit = DTypeMaxFinite(r->dtype);
      why = "absmax " + Fmt("%g", r->absmax) + " is near " + DTypeName(r->dtype) + "'s limit " + Fmt("%g", limit);
    } else {
      continue;
    }
    fired_.insert(r->key);
    auto a = ctx_->Make(rule(), sev, s.step, s.rank);
    FillTensor(*ctx_, *r, &a);
    a.candidate_value = r->absmax;
    a.metric = "absmax";
    a.error = r->absmax;
    a.threshold = limit;
    a.message = "run " + ctx_->run + " step " + std::to_string(s.step) + ": " + TensorLabel(*ctx_, *r) +
                " overflows: " + why;
    ctx_->out->Emit(std::move(a));
  }
  // Loss-scale drops (AMP halves the scale on every overflowing step).
  if (s.has_scalars && !std::isnan(s.scalars.loss_scale)) {
    auto it = last_scale_.find(s.rank);
    if (it != last_scale_.end() && s.scalars.loss_scale < it->second) {
      auto& d = drops_[s.rank];
      d.push_back(s.step);
      while (!d.empty() && d.front() + static_cast<uint64_t>(cfg.loss_scale_window) <= s.step) d.pop_front();
      auto fired = scale_fired_step_.find(s.rank);
      const bool cooled = fired == scale_fired_step_.end() ||
                          fired->second + cfg.loss_scale_window <= static_cast<int64_t>(s.step);
      if (static_cast<int64_t>(d.size()) >= cfg.loss_scale_drops && cooled) {
        scale_fired_step_[s.rank] = static_cast<int64_t>(s.step);
        auto a = ctx_->Make(rule(), Severity::kWarning, s.step, s.rank);
        a.tensor = "loss_scale";
        a.kind = "";
        a.baseline_value = it->second;
        a.candidate_value = s.scalars.loss_scale;
        a.metric = "loss_scale_drops";
        a.error = static_cast<double>(d.size());
        a.threshold = static_cast<double>(cfg.loss_scale_drops);
        a.message = "run " + ctx_->run + " step " + std::to_string(s.step) + ": the loss scale dropped " +
                    std::to_string(d.size()) + " times in " + std::to_string(cfg.loss_scale_window) +
                    " steps (now " + Fmt("%g", s.scalars.loss_scale) + "): gradients keep overflowing";
        ctx_->out->Emit(std::move(a));
      }
    }
    last_scale_[s.rank] = s.scalars.loss_scale;
  }
}

void UnderflowDetector::OnStep(const StepData& s) {
  const RulesConfig& cfg = *ctx_->cfg;
  for (const StatRow* r : InOrder(s)) {
    if (r->numel == 0) continue;
    const bool zero_grad = KeyKind(r->key) == Kind::kParamGrad && r->zero_count == r->numel;
    if (!zero_grad && r->zero_count < r->numel) seen_nonzero_.insert(r->key);
    if (fired_.count(r->key)) continue;
    const bool judged = IsLowPrecisionFloat(r->dtype) || (cfg.underflow_fp32_limit && IsLowPrecisionFloat(r->limit_dtype));
    const double frac = static_cast<double>(r->subnormal_count) / static_cast<double>(r->numel);
    std::string why;
    if (judged && frac > cfg.underflow_frac) {
      why = Fmt("%.1f%%", 100 * frac) + " of its values are subnormal in " + DTypeName(r->limit_dtype);
    } else if (zero_grad && cfg.underflow_zero_grad && seen_nonzero_.count(r->key)) {
      why = "the gradient became all zeros after having been non-zero";
    } else {
      continue;
    }
    fired_.insert(r->key);
    auto a = ctx_->Make(rule(), Severity::kWarning, s.step, s.rank);
    FillTensor(*ctx_, *r, &a);
    a.candidate_value = frac;
    a.metric = "subnormal_fraction";
    a.error = frac;
    a.threshold = cfg.underflow_frac;
    a.message = "run " + ctx_->run + " step " + std::to_string(s.step) + ": " + TensorLabel(*ctx_, *r) +
                " underflows: " + why;
    ctx_->out->Emit(std::move(a));
  }
}

void SpikeDetector::Check(const char* what, double x, double ratio, Ewma* e, const StepData& s) {
  if (!std::isfinite(x)) return;
  const RulesConfig& cfg = *ctx_->cfg;
  if (e->n >= cfg.spike_warmup) {
    const double m = e->mean, sd = std::sqrt(e->var);
    bool far = std::fabs(x - m) > cfg.spike_z * sd;
    bool jump = (m > 0 && x > 0) ? (x > ratio * m || x < m / ratio) : std::fabs(x - m) > (ratio - 1) * std::fabs(m);
    if (far && jump) {
      if (++e->consecutive >= 3) {
        // Not a spike but a new level (a schedule change, a resumed run): adopt it.
        *e = Ewma{x, 0, e->n, 0};
        return;
      }
      if (e->consecutive > 1) return;  // the same excursion, already reported
      auto a = ctx_->Make(rule(), Severity::kWarning, s.step, s.rank);
      a.tensor = what;
      a.kind = "";
      a.baseline_value = m;
      a.candidate_value = x;
      a.metric = std::string(what) + "_over_ewma";
      a.error = m != 0 ? x / m : x;
      a.threshold = ratio;
      a.message = "run " + ctx_->run + " step " + std::to_string(s.step) + ": " + what + " " +
                  (x > m ? "jumped" : "dropped") + " to " + Fmt("%g", x) + " from its recent average " + Fmt("%g", m);
      ctx_->out->Emit(std::move(a));
      return;  // a spike does not move the average it is judged against
    }
    e->consecutive = 0;
  }
  // Update after the check, so a spike is judged against the past only.
  const double alpha = e->n == 0 ? 1.0 : cfg.spike_alpha;
  const double d = x - e->mean;
  e->mean += alpha * d;
  e->var = (1 - alpha) * (e->var + alpha * d * d);
  ++e->n;
}

void SpikeDetector::OnStep(const StepData& s) {
  if (!s.has_scalars) return;
  Check("loss", s.scalars.loss, ctx_->cfg->spike_loss_ratio, &loss_[s.rank], s);
  Check("grad_norm", s.scalars.grad_norm, ctx_->cfg->spike_grad_ratio, &grad_[s.rank], s);
}

void StallDetector::OnStep(const StepData& s) {
  if (!steps_seen_ || s.step > last_step_) {
    last_step_ = s.step;
    last_step_ns_ = std::max(last_step_ns_, s.last_recv_ns);
    step_fired_ = false;
  }
  steps_seen_ = true;
}

void StallDetector::OnActivity(int64_t now_ns, bool goodbye) {
  last_msg_ns_ = std::max(last_msg_ns_, now_ns);
  if (last_step_ns_ == 0) last_step_ns_ = now_ns;
  msg_fired_ = false;
  if (goodbye) ended_ = true;
}

void StallDetector::OnResume(int64_t now_ns) {
  // The clocks restart; a stall already reported stays reported until the run speaks.
  if (last_msg_ns_ != 0) last_msg_ns_ = std::max(last_msg_ns_, now_ns);
  if (last_step_ns_ != 0) last_step_ns_ = std::max(last_step_ns_, now_ns);
}

void StallDetector::OnTick(int64_t now_ns) {
  if (ended_ || last_msg_ns_ == 0) return;
  const int64_t limit = static_cast<int64_t>(ctx_->cfg->stall_s * 1e9);
  const char* what = nullptr;
  if (!msg_fired_ && now_ns - last_msg_ns_ > limit) {
    msg_fired_ = true;
    what = "no message (not even a heartbeat)";
  } else if (!step_fired_ && !msg_fired_ && steps_seen_ && now_ns - last_step_ns_ > limit) {
    step_fired_ = true;
    what = "heartbeats but no new step";
  }
  if (what == nullptr) return;
  auto a = ctx_->Make(rule(), Severity::kWarning, last_step_, 0);
  a.metric = "seconds_silent";
  a.error = (now_ns - (msg_fired_ ? last_msg_ns_ : last_step_ns_)) / 1e9;
  a.threshold = ctx_->cfg->stall_s;
  a.message = "run " + ctx_->run + " stalled: " + what + " for " + Fmt("%.0f", a.error) +
              " s (last step " + std::to_string(last_step_) + ")";
  ctx_->out->Emit(std::move(a));
}

void EmitRestart(const RunCtx& ctx, const Rewind& r) {
  auto a = ctx.Make("restart", Severity::kWarning, r.to_step, r.rank);
  a.metric = "step_went_back_from";
  a.baseline_value = static_cast<double>(r.from_step);
  a.candidate_value = static_cast<double>(r.to_step);
  a.message = "run " + ctx.run + " rank " + std::to_string(r.rank) + " restarted: a new session began at step " +
              std::to_string(r.to_step) + " after the previous one reached step " + std::to_string(r.from_step) +
              ", so steps " + std::to_string(r.to_step) + ".." + std::to_string(r.from_step) +
              " repeat numbers already used and are not compared; when resuming a job, pass "
              "start_step=<the step it resumes at> to lockstep.Monitor (or give the new job its own run id)";
  ctx.out->Emit(std::move(a));
}

void EmitDuplicateRank(const RunCtx& ctx, const Rewind& r) {
  auto a = ctx.Make("duplicate_rank", Severity::kWarning, r.from_step, r.rank);
  a.metric = "live_sessions";
  a.candidate_value = 2;
  a.message = "run " + ctx.run + " rank " + std::to_string(r.rank) + " is claimed by two live processes: " + r.kept +
              ", and " + r.apart + ". Only the first one's data is compared as rank " + std::to_string(r.rank) +
              "; the other's is logged but set apart. Give every process its own rank and run id: create "
              "lockstep.Monitor after torch.distributed.init_process_group (or pass rank= and world_size=), "
              "and do not reuse a live run's run id";
  ctx.out->Emit(std::move(a));
}

std::vector<std::unique_ptr<RunDetector>> MakeRunDetectors(const RunCtx* ctx) {
  std::vector<std::unique_ptr<RunDetector>> v;
  v.push_back(std::make_unique<NonfiniteDetector>(ctx));
  v.push_back(std::make_unique<OverflowDetector>(ctx));
  v.push_back(std::make_unique<UnderflowDetector>(ctx));
  v.push_back(std::make_unique<SpikeDetector>(ctx));
  v.push_back(std::make_unique<StallDetector>(ctx));
  v.push_back(std::make_unique<ReplicaDetector>(ctx));
  return v;
}

}  // namespace lockstep::collector
