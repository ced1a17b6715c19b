#include "rules/pair_rules.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>
#include <algorithm>

namespace lockstep::collector {
namespace {

using alerting::Severity;

std::string G(double x) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

// The pair's raw value of the metric that set the score, for both runs.
void MetricValues(const MatchedTensor& m, double* b, double* c) {
  switch (m.eval.dominant) {
    case Metric::kMean: *b = m.b->mean; *c = m.c->mean; return;
    case Metric::kAbsmax: *b = m.b->absmax; *c = m.c->absmax; return;
    case Metric::kStd: *b = m.b->std; *c = m.c->std; return;
    case Metric::kMinMax: {  // the extreme that moved more
      const bool max = std::fabs(m.c->max - m.b->max) >= std::fabs(m.c->min - m.b->min);
      *b = max ? m.b->max : m.b->min;
      *c = max ? m.c->max : m.c->min;
      return;
    }
    case Metric::kNonfinite:
      *b = static_cast<double>(m.b->nan_count + m.b->inf_count);
      *c = static_cast<double>(m.c->nan_count + m.c->inf_count);
      return;
    default: *b = m.b->l2; *c = m.c->l2; return;
  }
}

}  // namespace

alerting::Alert PairCtx::Make(const char* rule, Severity sev, uint64_t step, uint32_t rank) const {
  alerting::Alert a;
  a.rule = rule;
  a.severity = sev;
  a.experiment = experiment;
  a.runs = {baseline, candidate};
  a.step = step;
  a.rank = rank;
  return a;
}

void DescribeTensorPair(const PairCtx& ctx, const PairStepView& v, const MatchedTensor& m,
                        alerting::Alert* a) {
  a->tensor = ctx.names->Name(KeyNameId(m.c->key));
  a->kind = KindName(KeyKind(m.c->key));
  a->micro_step = KeyMicroStep(m.c->key);
  MetricValues(m, &a->baseline_value, &a->candidate_value);
  a->metric = MetricName(m.eval.dominant);
  a->error = m.eval.dominant_error;
  // The raw threshold of the dominant metric: the score is error / threshold-ish, so
  // report the raw error at score == threshold.
  a->threshold = m.eval.score > 0 && std::isfinite(m.eval.score) ? m.eval.dominant_error * m.threshold / m.eval.score
                                                                  : std::nan("");
  std::string label = ctx.names->Label(KeyNameId(m.c->key), static_cast<uint8_t>(KeyKind(m.c->key))) + " (" + a->kind;
  if (KeyMicroStep(m.c->key) != 0) label += ", micro step " + std::to_string(KeyMicroStep(m.c->key));
  label += ", order " + std::to_string(m.c->order) + ")";
  a->message = label + " at step " + std::to_string(v.step) + " rank " + std::to_string(v.rank) + ": ";
  if (m.eval.dominant == Metric::kNonfinite) {
    a->message += "non-finite in " + std::string(m.c->nonfinite() ? "the candidate only" : "the baseline only") +
                  " (" + G(a->baseline_value) + " vs " + G(a->candidate_value) + " NaN/Inf)";
  } else {
    a->message += "l2 " + G(m.b->l2) + " vs " + G(m.c->l2) + ", " + a->metric + " " + G(a->error) +
                  " (threshold " + G(a->threshold) + ")";
    if (!std::isnan(m.eval.cosine)) a->message += ", cosine " + G(m.eval.cosine);
    if (m.eval.stats_only) a->message += " (statistics only: a lower bound)";
  }
}

void LossDriftDetector::OnPairStep(const PairStepView& v) {
  if (!v.b->has_scalars || !v.c->has_scalars) return;
  const double lb = v.b->scalars.loss, lc = v.c->scalars.loss;
  if (std::isnan(lb) || std::isnan(lc)) return;  // NaN = not given
  const double tol = ctx_->cfg->loss_rtol.For(v.precision);
  double rel;
  if (std::isinf(lb) || std::isinf(lc)) {
    rel = (lb == lc) ? 0 : INFINITY;
  } else {
    const double d = std::fabs(lc - lb);
    rel = d == 0 ? 0 : d / std::max(std::fabs(lb), 1e-12);
  }
  if (!(rel > tol)) return;
  const int lvl = rel >= ctx_->cfg->critical_factor * tol ? 2 : 1;
  int& cur = level_[v.rank];
  if (lvl <= cur) return;
  cur = lvl;
  auto a = ctx_->Make(rule(), lvl == 2 ? Severity::kCritical : Severity::kWarning, v.step, v.rank);
  a.tensor = "loss";
  a.kind = "loss";
  a.baseline_value = lb;
  a.candidate_value = lc;
  a.metric = "rel_err_loss";
  a.error = rel;
  a.threshold = tol;
  a.message = "loss differs at step " + std::to_string(v.step) + ": " + G(lb) + " (" + ctx_->baseline + ") vs " +
              G(lc) + " (" + ctx_->candidate + "), relative error " + G(rel) + " > " + G(tol);
  ctx_->out->Emit(std::move(a));
}

void TensorDriftDetector::OnPairStep(const PairStepView& v) {
  const RulesConfig& cfg = *ctx_->cfg;
  int64_t emitted = 0, suppressed = 0;
  alerting::Alert last;
  bool have_last = false;
  for (MatchedTensor& m : *v.matched) {
    if (!m.drifting()) continue;
    const int lvl = m.eval.score >= cfg.critical_factor * m.threshold ? 2 : 1;
    if (lvl <= m.track->drift_level) continue;
    if (emitted >= cfg.max_tensor_alerts_per_step) {
      ++suppressed;
      continue;  // reported later, when it is among the earliest new ones
    }
    m.track->drift_level = static_cast<uint8_t>(lvl);
    auto a = ctx_->Make(rule(), lvl == 2 ? Severity::kCritical : Severity::kWarning, v.step, v.rank);
    DescribeTensorPair(*ctx_, v, m, &a);
    if (have_last) ctx_->out->Emit(std::move(last));
    last = std::move(a);
    have_last = true;
    ++emitted;
  }
  if (have_last) {
    if (suppressed > 0) last.message += "; " + std::to_string(suppressed) + " more tensor(s) start drifting at this step";
    ctx_->out->Emit(std::move(last));
  }
}

void FirstDivergenceDetector::OnPairStep(const PairStepView& v) {
  if (fired_) {
    Refine(v);
    return;
  }
  onsets_.Observe(v);
  compared_[v.rank] = static_cast<int64_t>(v.step);
  // Steps without tensors before this one (a sampled run): an onset here may have
  // begun at any of them, and by now the optimizer has carried it into the weights,
  // so what this step names is where it shows first (docs/rules.md "Sampling that
  // follows the runs' state").
  std::string unseen;
  auto seen = with_tensors_.find(v.rank);
  if (seen != with_tensors_.end() && seen->second + 1 < static_cast<int64_t>(v.step))
    unseen = "; steps " + std::to_string(seen->second + 1) + ".." + std::to_string(v.step - 1) +
             " had no tensors (sampled): the change may have begun at any of them, and this is where it shows first";
  for (const MatchedTensor& m : *v.matched) {
    if (KeyKind(m.c->key) != Kind::kLoss) {
      with_tensors_[v.rank] = static_cast<int64_t>(v.step);
      break;
    }
  }
  const MatchedTensor* first = nullptr;
  size_t n = 0;
  double worst_ratio = 0;
  for (const MatchedTensor& m : *v.matched) {
    if (!m.drifting()) continue;
    ++n;
    worst_ratio = std::max(worst_ratio, m.eval.score / m.threshold);
    if (first == nullptr || m.c->order < first->c->order) first = &m;
  }
  const OpBirth* birth = v.births != nullptr && v.birth >= 0 ? &(*v.births)[static_cast<size_t>(v.birth)] : nullptr;
  const bool onset = (first != nullptr || birth != nullptr) &&
                     (pending_step_ < 0 || static_cast<int64_t>(v.step) <= pending_step_) && !pending_.count(v.rank);
  if (onset) {
    if (static_cast<int64_t>(v.step) < pending_step_) {  // an earlier onset on a lagging rank
      pending_.clear();
      zoom_of_.clear();
    }
    if (pending_.empty()) pending_since_ns_ = ctx_->out->Now();
    pending_step_ = static_cast<int64_t>(v.step);
    if (birth != nullptr) {
      auto& born = pending_.emplace(v.rank, std::make_pair(birth->order, BirthAlert(v, *birth, n))).first->second;
      born.second.message += unseen;
      // Born in a container's own code: which call inside it is for a zoom to find.
      const std::string op = ctx_->names->Name(birth->op);
      if (birth->container && !birth->backward && op.find('/') == std::string::npos) zoom_of_[v.rank] = op;
      Decide(false);
      return;
    }
    const bool critical = worst_ratio >= ctx_->cfg->critical_factor;
    auto a = ctx_->Make(rule(), critical ? Severity::kCritical : Severity::kWarning, v.step, v.rank);
    DescribeTensorPair(*ctx_, v, *first, &a);
    const std::string why = Cause(v, *first, &a);
    a.message = "runs " + ctx_->baseline + " and " + ctx_->candidate + " part ways: first divergent tensor " +
                a.message;
    if (n > 1) a.message += "; " + std::to_string(n) + " tensors drift at this step";
    a.message += "; cause: " + a.cause + " (" + why + ")" + unseen;
    pending_.emplace(v.rank, std::make_pair(first->c->order, std::move(a)));
  }
  Decide(false);
}

void FirstDivergenceDetector::OnTick(int64_t now_ns) {
  if (!fired_ && !pending_.empty() && now_ns - pending_since_ns_ >= kWaitNs) Decide(true);
}

void FirstDivergenceDetector::OnEnd() { Decide(true); }

void FirstDivergenceDetector::Decide(bool force) {
  if (fired_ || pending_.empty()) return;
  if (!force) {
    // Every rank the runs have, not only those seen so far: which rank speaks first
    // is arrival order, and the alert (its rank, its id) must not follow it.
    if (compared_.size() < ctx_->WorldSize()) return;
    for (const auto& [rank, step] : compared_) {
      if (step < pending_step_) return;  // a rank not yet compared at the onset step
    }
  }
  fired_ = true;
  auto best = pending_.begin();
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->second.first < best->second.first) best = it;  // ties: the lowest rank (map order)
  }
  alerting::Alert a = std::move(best->second.second);
  auto zoom = zoom_of_.find(best->first);
  if (zoom != zoom_of_.end() && ctx_->outcome != nullptr) ctx_->outcome->zoom = zoom->second;
  pending_.clear();
  zoom_of_.clear();
  // "at step S rank R" -> "at step S on all 4 ranks" when several ranks part there.
  const std::string where = onsets_.Where(a.step, a.rank);
  const std::string at = "at step " + std::to_string(a.step) + " rank " + std::to_string(a.rank);
  const auto pos = a.message.find(at);
  if (where != "rank " + std::to_string(a.rank) && pos != std::string::npos) {
    a.message = a.message.substr(0, pos) + "at step " + std::to_string(a.step) + " on " + where +
                a.message.substr(pos + at.size());
  }
  const alerting::Alert& sent = ctx_->out->Emit(std::move(a));
  if (ctx_->outcome != nullptr) {
    ctx_->outcome->diverged = true;
    ctx_->outcome->first_divergence = sent;
  }
}

namespace {

// A row of a call inside zoomed module `z`: "attn/softmax#0", or a later call's
// "attn#1/softmax#0".
bool InsideZoom(const std::string& name, const std::string& z) {
  return name.size() > z.size() && name.compare(0, z.size(), z) == 0 &&
         (name[z.size()] == '/' || name[z.size()] == '#') && name.find('/', z.size()) != std::string::npos;
}

// The act rows of calls inside `z` at micro step 0 that `side` has and `other` does not,
// in execution order.
std::vector<const StatRow*> OneSidedCalls(const StepData& side, const StepData& other, const NameTable& names,
                                          const std::string& z) {
  std::vector<const StatRow*> out;
  for (const StatRow& r : side.rows) {
    if (r.repeat || KeyKind(r.key) != Kind::kAct || KeyMicroStep(r.key) != 0) continue;
    if (!InsideZoom(names.Name(KeyNameId(r.key)), z)) continue;
    auto it = std::lower_bound(other.rows.begin(), other.rows.end(), r.key,
                               [](const StatRow& x, uint64_t k) { return x.key < k; });
    if (it == other.rows.end() || it->key != r.key) out.push_back(&r);
  }
  std::sort(out.begin(), out.end(), [](const StatRow* a, const StatRow* b) { return a->order < b->order; });
  return out;
}

}  // namespace

void FirstDivergenceDetector::Refine(const PairStepView& v) {
  PairOutcome* out = ctx_->outcome;
  if (out == nullptr || out->zoom.empty() || out->refined) return;
  const std::string& z = out->zoom;
  if (v.births == nullptr || v.birth < 0 ||
      !InsideZoom(ctx_->names->Name((*v.births)[static_cast<size_t>(v.birth)].op), z) ||
      (*v.births)[static_cast<size_t>(v.birth)].backward) {
    RefineByOneSidedCalls(v);
    return;
  }
  const OpBirth& b = (*v.births)[static_cast<size_t>(v.birth)];
  size_t drifting = 0;
  for (const MatchedTensor& m : *v.matched) drifting += m.drifting();
  alerting::Alert a = BirthAlert(v, b, drifting);
  a.message = "zoomed into " + z + ": " + a.message;
  out->refined = true;
  out->first_divergence = ctx_->out->Emit(std::move(a));
}

void FirstDivergenceDetector::RefineByOneSidedCalls(const PairStepView& v) {
  // Only at a zoomed step: some call inside the module paired in both runs.
  PairOutcome* out = ctx_->outcome;
  const std::string& z = out->zoom;
  const NameTable& names = *ctx_->names;
  bool zoomed = false;
  for (const MatchedTensor& m : *v.matched) {
    if (InsideZoom(names.Name(KeyNameId(m.c->key)), z)) {
      zoomed = true;
      break;
    }
  }
  if (!zoomed || v.b == nullptr || v.c == nullptr) return;
  // Every call both runs make agrees (no birth inside), yet the module's output does
  // not: the difference is in the calls only one run makes (a cast, an extra scaling).
  const auto only_c = OneSidedCalls(*v.c, *v.b, names, z);
  const auto only_b = OneSidedCalls(*v.b, *v.c, names, z);
  if (only_c.empty() && only_b.empty()) return;
  const bool cand = !only_c.empty();
  const auto& rows = cand ? only_c : only_b;
  auto list = [&](const std::vector<const StatRow*>& rs) {
    std::string s;
    for (size_t i = 0; i < rs.size() && i < 4; ++i) {
      s += (i ? ", " : "") + names.Name(KeyNameId(rs[i]->key)) + " (" + DTypeName(rs[i]->dtype) + ")";
    }
    if (rs.size() > 4) s += " and " + std::to_string(rs.size() - 4) + " more";
    return s;
  };
  bool coarse = false;
  for (const StatRow* r : rows) coarse |= BirthFinder::UnitRoundoff(r->dtype) > BirthFinder::UnitRoundoff(DT::kF32);
  auto a = ctx_->Make(rule(), Severity::kWarning, v.step, v.rank);
  a.tensor = names.Name(KeyNameId(rows.front()->key));
  a.kind = "act";
  a.metric = "one_sided_calls";
  a.cause = coarse ? "precision" : "op";
  a.message = "zoomed into " + z + ": runs " + ctx_->baseline + " and " + ctx_->candidate + " part ways at step " +
              std::to_string(v.step) + " rank " + std::to_string(v.rank) + ": every call both runs make in " + z +
              "'s own code agrees, and " + (cand ? ctx_->candidate : ctx_->baseline) + " alone makes " + list(rows) +
              (only_b.empty() || !cand ? "" : "; " + ctx_->baseline + " alone makes " + list(only_b)) +
              ": the error is born in the calls only one run makes; cause: " + a.cause;
  out->refined = true;
  out->first_divergence = ctx_->out->Emit(std::move(a));
}

alerting::Alert FirstDivergenceDetector::BirthAlert(const PairStepView& v, const OpBirth& b, size_t drifting) const {
  // Critical when the op's own output (its passed-on gradient) is also beyond the hard
  // tolerance. A repeat row is not among the matched (it is not judged twice): an op
  // whose output repeats another's stays a warning here.
  bool crosses = false;
  for (const MatchedTensor& m : *v.matched) {
    if (m.c == b.out_c) crosses = m.drifting();
  }
  auto a = ctx_->Make(rule(), crosses ? Severity::kCritical : Severity::kWarning, v.step, v.rank);
  a.tensor = ctx_->names->Name(b.op);
  a.kind = b.backward ? "act_grad" : "act";
  a.baseline_value = b.out_b->l2;
  a.candidate_value = b.out_c->l2;
  a.metric = "added_error";
  a.error = b.output_error;
  a.threshold = b.explained;
  // As every tensor is named in messages: "name (Type, = alias) (kind, order N)".
  const std::string label = ctx_->names->Label(b.op, static_cast<uint8_t>(Kind::kAct)) + " (" + a.kind +
                            ", order " + std::to_string(b.out_c->order) + ")";
  const std::string at = " at step " + std::to_string(v.step) + " rank " + std::to_string(v.rank) + ": ";
  a.message = "runs " + ctx_->baseline + " and " + ctx_->candidate + " part ways: the error is born in ";
  if (b.backward) {
    a.message += "the backward of " + label + at + "the gradient it received agrees (rel. distance " +
                 G(b.input_error) + "), the gradient it passed on differs by " + G(b.output_error) + ", " +
                 G(b.ratio) + "x what rounding explains (" + G(b.explained) + "): its backward computes differently";
  } else {
    a.message += label + at + "its inputs agree (rel. distance " + G(b.input_error) + "), its output differs by " +
                 G(b.output_error) + ", " + G(b.ratio) + "x what rounding explains (" + G(b.explained) + "): ";
    if (b.precision) {
      a.message += std::string("it hands on ") + DTypeName(b.dtype_c) + " in " + ctx_->candidate + ", " +
                   DTypeName(b.dtype_b) + " in " + ctx_->baseline + ": this operation rounds to another precision";
    } else {
      a.message += "this operation computes differently";
      if (b.container) {
        a.message += " (in its own code: none of its submodules does";
        if (b.has_fed) {
          a.message += "; " + ctx_->names->Display(b.fed) + " is the first to receive a different input from it";
        }
        a.message += ")";
      }
    }
  }
  if (drifting > 0) a.message += "; " + std::to_string(drifting) + " tensor(s) beyond the tolerance at this step";
  const std::string why = SetupCause(v, &a, true);
  if (b.precision) {
    a.cause = "precision";
    a.message += "; cause: precision" + (why.empty() ? std::string() : " (" + why + ")");
  } else if (why.empty()) {
    a.cause = "op";
    a.message += "; cause: op";
  } else {
    a.message += "; cause: " + a.cause + " (" + why + ")";
  }
  return a;
}

std::string FirstDivergenceDetector::SetupCause(const PairStepView& v, alerting::Alert* a, bool at_op) const {
  const PairFacts* f = ctx_->facts;
  // At a birth point the setup explains the op; otherwise it explains the whole drift.
  const std::string consequence = at_op ? "" : "; the drift downstream is its consequence, no layer is to blame";
  if (f != nullptr && f->samples_step >= 0 && f->samples_step <= static_cast<int64_t>(v.step)) {
    a->cause = "data";
    return f->samples + consequence;
  }
  if (f != nullptr && f->config_scalar_step >= 0 && f->config_scalar_step <= static_cast<int64_t>(v.step)) {
    a->cause = "config";
    return f->config_scalar + consequence;
  }
  if (f != nullptr && f->setup_known) {
    std::vector<SetupDiff> config, precision;
    for (const SetupDiff& d : f->setup) {
      if (d.category == "config") config.push_back(d);
      if (d.category == "precision") precision.push_back(d);
    }
    if (!config.empty() || !precision.empty()) {
      a->cause = config.empty() ? "precision" : "config";
      const auto& list = config.empty() ? precision : config;
      return "the setup differs: " + DescribeSetup(list, 3) + consequence;
    }
  }
  return "";
}

bool FirstDivergenceDetector::ForwardAgrees(const PairStepView& v) {
  for (const MatchedTensor& m : *v.matched) {
    const Kind k = KeyKind(m.c->key);
    if ((k == Kind::kAct || k == Kind::kActIn || k == Kind::kInput) && m.drifting()) return false;
  }
  return true;
}

std::string FirstDivergenceDetector::ParentOf(uint32_t input) const {
  // "frozen(1)" / "frozen[1]" (an input of frozen) -> frozen -> its enclosing module.
  std::string name = ctx_->names->Name(input);
  auto cut = name.find('(');
  if (cut == std::string::npos && !name.empty() && name.back() == ']') cut = name.find('[');
  if (cut != std::string::npos) name.resize(cut);
  for (cut = name.find_last_of("./"); cut != std::string::npos; cut = name.find_last_of("./")) {
    name.resize(cut);  // "attn/softmax#0" (a call in attn's code) -> attn
    const int64_t id = ctx_->names->Find(name);
    if (id >= 0) return ctx_->names->Display(static_cast<uint32_t>(id));
  }
  const int64_t root = ctx_->names->Find("<root>");
  return root >= 0 ? ctx_->names->Display(static_cast<uint32_t>(root)) : "the model's forward";
}

std::string FirstDivergenceDetector::Cause(const PairStepView& v, const MatchedTensor& first,
                                           alerting::Alert* a) const {
  const PairFacts* f = ctx_->facts;
  const std::string consequence = "; the drift downstream is its consequence, no layer is to blame";
  // Initial weights: a parameter drifts at the pair's first step, before any update.
  const bool first_step = f == nullptr || f->first_step < 0 || static_cast<int64_t>(v.step) <= f->first_step;
  if (KeyKind(first.c->key) == Kind::kParam && first_step) {
    a->cause = "weights";
    return "the initial weights differ at step " + std::to_string(v.step) + ", first " + ctx_->names->Display(KeyNameId(first.c->key)) + consequence;
  }
  // Data: the model's inputs differ at this step.
  bool inputs = false, inputs_agree = true;
  for (const MatchedTensor& m : *v.matched) {
    if (KeyKind(m.c->key) != Kind::kInput) continue;
    inputs = true;
    if (m.drifting()) {
      a->cause = "data";
      return "the runs are fed different data from step " + std::to_string(v.step) + ": " +
             ctx_->names->Display(KeyNameId(m.c->key)) + " differs" + consequence;
    }
    inputs_agree = inputs_agree && !m.drifting();
  }
  if (std::string why = SetupCause(v, a, false); !why.empty()) return why;
  // Its module's weights moved apart during training (a parameter's gradient differed
  // earlier, even by rounding: Adam turns a gradient that is only rounding into full
  // steps): that, not the op, makes its output differ.
  const Kind kind = KeyKind(first.c->key);
  if (v.birth_state != nullptr && (kind == Kind::kAct || kind == Kind::kActGrad)) {
    const int64_t since = v.birth_state->WeightsMovedSince(KeyNameId(first.c->key));
    if (since >= 0 && since <= static_cast<int64_t>(v.step)) {
      a->cause = "weights";
      return "the weights of " + ctx_->names->Display(KeyNameId(first.c->key)) + " have differed since step " +
             std::to_string(since) +
             " (a gradient of its parameters differed before: training moved them apart), so its output "
             "differs without the op computing differently";
    }
  }
  const uint32_t name = KeyNameId(first.c->key);
  if (kind == Kind::kActIn) {
    // What a module received differs while everything recorded before it agrees: the
    // tensor was made by its parent's own code between its children, not by the module.
    a->cause = "op";
    const std::string parent = ParentOf(name);
    return ctx_->names->Display(name) + " receives a different input from its parent's own code: the computation of " +
           parent + " between its children differs (everything recorded before it agrees)";
  }
  if (kind == Kind::kActGrad && v.birth_state != nullptr && ForwardAgrees(v)) {
    std::vector<uint32_t> consumers;
    if (v.birth_state->ConsumersOf(name, &consumers)) {
      const std::string grad = "the gradient of " + ctx_->names->Display(name);
      if (consumers.empty()) {
        // No watched module received this output: its gradient comes from the loss (or
        // code outside the modules), and every tensor the model computed agrees.
        a->cause = "data";
        return "every forward tensor agrees while " + grad +
               ", which comes from the loss, differs: the loss's other inputs (the labels or targets) differ, "
               "or the loss computation itself" + consequence;
      }
      a->cause = "op";
      if (consumers.size() == 1) {
        return "every forward tensor agrees; " + grad + " is what " + ctx_->names->Display(consumers[0]) +
               " passes on, and the gradient it received agrees: its backward computes differently";
      }
      std::string list;
      for (size_t i = 0; i < consumers.size(); ++i) {
        list += (i == 0 ? "" : i + 1 == consumers.size() ? " and " : ", ") + ctx_->names->Display(consumers[i]);
      }
      return "every forward tensor agrees; " + grad + " is the sum of what " + list +
             " pass on (they all receive it), and the gradients they received agree: the backward of one of them "
             "computes differently, which one the sum does not tell";
    }
  }
  if (inputs && inputs_agree) {
    a->cause = "op";
    return "the inputs and the setup agree: " + ctx_->names->Display(KeyNameId(first.c->key)) +
           " computes differently";
  }
  a->cause = "unknown";
  return inputs ? "no setup difference found" : "no input statistics to tell data from an op";
}

void ScalarsDetector::Check(const char* what, double b, double c, double rtol, const PairStepView& v,
                            int bit) {
  if (fired_ & (1u << bit)) return;
  if (std::isnan(b) || std::isnan(c)) return;  // NaN = not given
  const double scale = std::max(std::fabs(b), std::fabs(c));
  if (b == c || std::fabs(c - b) <= rtol * scale) return;
  if (!std::isfinite(b) || !std::isfinite(c)) return;  // a non-finite value is the nonfinite rule's
  fired_ |= 1u << bit;
  auto a = ctx_->Make(rule(), Severity::kWarning, v.step, v.rank);
  a.tensor = what;
  a.kind = "scalar";
  a.baseline_value = b;
  a.candidate_value = c;
  a.metric = "rel_err";
  a.error = std::fabs(c - b) / scale;
  a.threshold = rtol;
  a.message = std::string(what) + " differs from step " + std::to_string(v.step) + ": " + G(b) + " vs " + G(c);
  if (PairFacts* f = ctx_->facts) {
    if (bit <= 1 && f->config_scalar_step < 0) {
      f->config_scalar_step = static_cast<int64_t>(v.step);
      f->config_scalar = a.message;
    } else if (bit == 2 && f->samples_step < 0) {
      f->samples_step = static_cast<int64_t>(v.step);
      f->samples = a.message;
    }
  }
  // lr / loss scale are settings (the setup incident); samples and grad norm go with
  // the divergence they start or show.
  if (bit <= 1) a.incident = "setup/" + a.experiment + "/" + ctx_->baseline + "/" + ctx_->candidate;
  else a.incident = "divergence/" + a.experiment + "/" + ctx_->baseline + "/" + ctx_->candidate;
  ctx_->out->Emit(std::move(a));
}

void ScalarsDetector::OnPairStep(const PairStepView& v) {
  if (!v.b->has_scalars || !v.c->has_scalars) return;
  const ScalarRow& b = v.b->scalars;
  const ScalarRow& c = v.c->scalars;
  const double rtol = ctx_->cfg->scalar_rtol;
  Check("lr", b.lr, c.lr, rtol, v, 0);
  Check("loss_scale", b.loss_scale, c.loss_scale, rtol, v, 1);
  if (b.samples != 0 && c.samples != 0) {
    Check("samples", static_cast<double>(b.samples), static_cast<double>(c.samples), rtol, v, 2);
  }
  Check("grad_norm", b.grad_norm, c.grad_norm, ctx_->cfg->grad_norm_rtol, v, 3);
}

void TrendDetector::OnPairStep(const PairStepView& v) {
  const RulesConfig& cfg = *ctx_->cfg;
  const size_t w = static_cast<size_t>(std::max<int64_t>(cfg.trend_window, 3));
  if (onset_.find(v.rank) == onset_.end()) {
    uint32_t first = UINT32_MAX;
    for (const MatchedTensor& m : *v.matched) {
      if (m.drifting()) first = std::min(first, m.c->order);
    }
    if (v.births != nullptr && v.birth >= 0) first = std::min(first, (*v.births)[static_cast<size_t>(v.birth)].order);
    if (first != UINT32_MAX) onset_[v.rank] = Onset{v.step, first};
  }
  const auto onset = onset_.find(v.rank);
  for (MatchedTensor& m : *v.matched) {
    TensorTrack& t = *m.track;
    const float s = std::isfinite(m.eval.score) ? static_cast<float>(m.eval.score) : 1e30f;
    // The score is the difference over the tensor's scale: a gradient converging to
    // zero scores more and more while its rounding differences stay as they were. A
    // growing divergence is a difference that grows, so both must grow.
    const double l2 = std::isfinite(m.b->l2) ? m.b->l2 : 0.0;
    const float raw = static_cast<float>(std::min(1e30, static_cast<double>(s) * l2));
    if (t.recent.size() < w) {
      t.recent.push_back(s);
      t.recent_raw.push_back(raw);
      t.recent_pos = static_cast<uint32_t>(t.recent.size() % w);
      if (t.recent.size() < w) continue;
    } else {
      t.recent[t.recent_pos] = s;
      t.recent_raw[t.recent_pos] = raw;
      t.recent_pos = static_cast<uint32_t>((t.recent_pos + 1) % w);
    }
    if (t.trend_fired || t.drift_level > 0 || m.drifting()) continue;
    // Oldest is at recent_pos (the slot to be overwritten next).
    const float oldest = t.recent[t.recent_pos];
    if (!(s >= cfg.trend_min * m.threshold) || !(oldest > 0) || s < cfg.trend_growth * oldest) continue;
    const float oldest_raw = t.recent_raw[t.recent_pos];
    if (oldest_raw > 0 && raw < cfg.trend_growth * oldest_raw) continue;
    size_t ups = 0;
    for (size_t i = 1; i < w; ++i) {
      if (t.recent[(t.recent_pos + i) % w] >= t.recent[(t.recent_pos + i - 1) % w]) ++ups;
    }
    if (ups * 10 < (w - 1) * 7) continue;  // at least 70% of the steps went up
    t.trend_fired = true;
    if (onset != onset_.end() &&
        (v.step > onset->second.step || (v.step == onset->second.step && m.c->order > onset->second.order))) {
      if (ctx_->outcome != nullptr) ++ctx_->outcome->trends_downstream;
      continue;
    }
    auto a = ctx_->Make(rule(), Severity::kWarning, v.step, v.rank);
    DescribeTensorPair(*ctx_, v, m, &a);
    a.message = "divergence growing: " + a.message + "; score grew " + G(s / oldest) + "x over " +
                std::to_string(w) + " steps, now " + G(s / m.threshold) + " of its threshold";
    ctx_->out->Emit(std::move(a));
  }
}

std::vector<std::unique_ptr<PairDetector>> MakePairDetectors(const PairCtx* ctx) {
  std::vector<std::unique_ptr<PairDetector>> v;
  v.push_back(std::make_unique<ScalarsDetector>(ctx));  // before first_divergence: its facts
  v.push_back(std::make_unique<FirstDivergenceDetector>(ctx));
  v.push_back(std::make_unique<TensorDriftDetector>(ctx));
  v.push_back(std::make_unique<LossDriftDetector>(ctx));
  v.push_back(std::make_unique<TrendDetector>(ctx));
  return v;
}

}  // namespace lockstep::collector
