#include "detect/analyzer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <spdlog/spdlog.h>

#include "align/pair_metrics.h"
#include "rules/pair_rules.h"
#include "rules/run_rules.h"
#include "lockstep/common/clock.h"

namespace lockstep::collector {

struct Analyzer::RunDet {
  RunCtx ctx;
  DT precision = DT::kUnknown;  // lowest float dtype seen: the pair's tolerance
  std::vector<std::unique_ptr<RunDetector>> detectors;
};

// One compare-table row: a tensor over all ranks of a pair. Report only; the rules
// never read it.
struct TensorRow {
  uint32_t order = 0;          // execution order (candidate's) at the last compared step
  uint64_t compared = 0;       // (rank, step) comparisons
  int64_t first_drift_step = -1;
  double worst_score = -1;     // score / threshold at worst_step
  uint64_t worst_step = 0;
  uint32_t worst_rank = 0;
  PairEval worst;
  double worst_b_l2 = 0, worst_c_l2 = 0;
  // Both runs' max, min, mean at worst_step (compare --format msprobe-csv).
  double worst_b[3] = {0, 0, 0}, worst_c[3] = {0, 0, 0};
  double worst_threshold = 1;
  DT dtype_b = DT::kUnknown, dtype_c = DT::kUnknown;
};

struct Analyzer::PairDet {
  const AlignedPair* aligned = nullptr;
  PairCtx ctx;
  std::vector<std::unique_ptr<PairDetector>> detectors;
  // Rule state: rank -> tensor key -> track (node-based: MatchedTensor points into it).
  std::unordered_map<uint32_t, std::unordered_map<uint64_t, TensorTrack>> tracks;
  std::unordered_map<uint64_t, TensorRow> table;  // tensor key -> compare-table row
  struct Unmatched {
    bool in_baseline = false;
    uint64_t first_step = 0, steps = 0;
  };
  std::unordered_map<uint64_t, Unmatched> unmatched;
  std::vector<MatchedTensor> matched;  // reused per step
  // Where the error is born: per rank, the rule's state; the step's rows it reads and
  // its result (reused per step); the ranked ops of each compared step for the report
  // (at most kMaxBirthSteps steps, kBirthOpsPerStep ops each).
  std::unordered_map<uint32_t, std::unique_ptr<BirthFinder>> finders;
  std::vector<BirthRow> birth_rows;
  std::vector<OpBirth> births;
  std::vector<StepBirths> birth_log;
  PairOutcome outcome;
  bool divergence_told = false;  // divergence_observer_ was called
  bool refined_told = false;     // ... and again for the refined first divergence
  PairFacts facts;  // setup differences and scalar findings: first_divergence's cause
  RankOnsets onsets;  // PairReport::onsets
  double loss_b = std::nan(""), loss_c = std::nan("");
  bool loss_b_given = false, loss_c_given = false;
};

Analyzer::Analyzer(AnalyzerOptions options, AlertFn alerts, const Clock* clock)
    : opt_(std::move(options)),
      clock_(RealClockOr(clock)),
      emitter_(std::move(alerts), clock_),
      aligner_(static_cast<const AlignerOptions&>(opt_), &names_, &sink_) {}

Analyzer::~Analyzer() = default;

void Analyzer::OnMessage(const wire::Envelope& env, int64_t recv_ns) { aligner_.OnMessage(env, recv_ns); }
void Analyzer::Tick(int64_t now_ns) {
  aligner_.Tick(now_ns);
  for (auto& p : pairs_) {
    for (auto& d : p->detectors) d->OnTick(now_ns);
    NoteDivergence(p.get());
  }
}

void Analyzer::NoteDivergence(PairDet* p) {
  if (!p->outcome.diverged || !divergence_observer_) return;
  if (p->divergence_told && (p->refined_told || !p->outcome.refined)) return;
  p->divergence_told = true;
  p->refined_told = p->outcome.refined;
  divergence_observer_(p->ctx);
}
void Analyzer::Resume(int64_t now_ns) { aligner_.Resume(now_ns); }
void Analyzer::Finish() { aligner_.Finish(); }

Analyzer::RunDet* Analyzer::Det(const AlignedRun& run) {
  auto& d = runs_[&run];
  if (!d) {
    d = std::make_unique<RunDet>();
    d->ctx.run = run.id;
    d->ctx.names = &names_;
    d->ctx.cfg = &opt_.rules;
    d->ctx.out = &emitter_;
    d->ctx.world_size = run.world_size;
    d->detectors = MakeRunDetectors(&d->ctx);
  }
  if (d->ctx.experiment != run.experiment) d->ctx.experiment = run.experiment;
  return d.get();
}

void Analyzer::Sink::OnRunActivity(const AlignedRun& run, int64_t recv_ns, bool goodbye) {
  if (!run.run_rules) return;
  for (auto& d : a_->Det(run)->detectors) d->OnActivity(recv_ns, goodbye);
}

void Analyzer::Sink::OnRunTick(const AlignedRun& run, int64_t now_ns) {
  if (!run.run_rules) return;
  for (auto& d : a_->Det(run)->detectors) d->OnTick(now_ns);
}

void Analyzer::Sink::OnRunResume(const AlignedRun& run, int64_t now_ns) {
  for (auto& d : a_->Det(run)->detectors) d->OnResume(now_ns);
}

void Analyzer::Sink::OnRunRewind(const AlignedRun& run, const Rewind& rewind) {
  if (!run.run_rules) return;
  if (rewind.what == Rewind::What::kDuplicate) {
    EmitDuplicateRank(a_->Det(run)->ctx, rewind);
  } else {
    EmitRestart(a_->Det(run)->ctx, rewind);
  }
}

void Analyzer::Sink::OnRunStep(const AlignedRun& run, const StepData& step) {
  RunDet* det = a_->Det(run);
  for (const StatRow& row : step.rows) det->precision = LowerPrecision(det->precision, row.dtype);
  if (!run.run_rules) return;
  for (auto& d : det->detectors) d->OnStep(step);
}

void Analyzer::Sink::OnPairStart(const AlignedPair& pair) {
  auto p = std::make_unique<PairDet>();
  p->aligned = &pair;
  p->ctx.experiment = pair.experiment;
  p->ctx.baseline = pair.baseline->id;
  p->ctx.candidate = pair.candidate->id;
  p->ctx.names = &a_->names_;
  p->ctx.cfg = &a_->opt_.rules;
  p->ctx.out = &a_->emitter_;
  p->ctx.facts = &p->facts;
  p->ctx.outcome = &p->outcome;
  p->ctx.world_b = pair.baseline->world_size;
  p->ctx.world_c = pair.candidate->world_size;
  p->detectors = MakePairDetectors(&p->ctx);
  if (a_->pairs_.size() <= pair.index) a_->pairs_.resize(pair.index + 1);
  a_->pairs_[pair.index] = std::move(p);
}

void Analyzer::Sink::OnPairStep(const AlignedPair& pair, uint32_t rank, const StepData& b, const StepData& c) {
  a_->Compare(a_->pairs_.at(pair.index).get(), rank, b, c);
}

void Analyzer::Sink::OnPairEnd(const AlignedPair& pair) {
  PairDet* p = a_->pairs_.at(pair.index).get();
  for (auto& d : p->detectors) d->OnEnd();
  a_->CheckSetup(p, 0, 0);
}

void Analyzer::NoteUnmatched(PairDet* p, uint64_t key, bool in_baseline, uint64_t step) {
  auto [it, inserted] = p->unmatched.try_emplace(key);
  ++it->second.steps;
  if (!inserted) return;
  it->second.in_baseline = in_baseline;
  it->second.first_step = step;
  ++unmatched_tensors_;
  spdlog::info("experiment {}: tensor {} ({}) exists only in the {} run {} (first at step {}); it is listed, not compared",
               p->ctx.experiment, names_.Name(KeyNameId(key)), KindName(KeyKind(key)),
               in_baseline ? "baseline" : "candidate", in_baseline ? p->ctx.baseline : p->ctx.candidate, step);
}

void Analyzer::CheckSetup(PairDet* p, uint64_t step, uint32_t rank) {
  if (p->facts.setup_known) return;
  const Fingerprint& fb = *p->aligned->baseline->fingerprint;
  const Fingerprint& fc = *p->aligned->candidate->fingerprint;
  if (fb.empty() || fc.empty()) return;  // an agent without fingerprints: nothing to say
  p->facts.setup_known = true;
  p->facts.setup = DiffFingerprints(fb, fc, &p->facts.setup_note);
  if (p->facts.setup.empty()) return;
  bool warn = false;
  for (const SetupDiff& d : p->facts.setup) warn = warn || d.severity != alerting::Severity::kInfo;
  auto a = p->ctx.Make("setup", warn ? alerting::Severity::kWarning : alerting::Severity::kInfo, step, rank);
  a.metric = "setup_differences";
  a.error = static_cast<double>(p->facts.setup.size());
  a.message = "runs " + p->ctx.baseline + " and " + p->ctx.candidate +
              " are set up differently: " + DescribeSetup(p->facts.setup);
  if (!p->facts.setup_note.empty()) a.message += "; " + p->facts.setup_note;
  emitter_.Emit(std::move(a));
}

void Analyzer::Compare(PairDet* p, uint32_t rank, const StepData& bs, const StepData& cs) {
  CheckSetup(p, cs.step, rank);
  if (p->facts.first_step < 0) p->facts.first_step = static_cast<int64_t>(cs.step);
  const RulesConfig& cfg = opt_.rules;
  const DT pair_precision = LowerPrecision(Det(*p->aligned->baseline)->precision, Det(*p->aligned->candidate)->precision);
  auto& tracks = p->tracks[rank];
  auto& matched = p->matched;
  matched.clear();
  const PeerScales peers(bs);  // the noise-level floor's context (pair_metrics.h)
  const auto& br = bs.rows;
  const auto& cr = cs.rows;
  const bool judge_birth = cfg.birth_ulps > 0;
  bool has_act_in = false;
  p->birth_rows.clear();
  size_t i = 0, j = 0;
  while (i < br.size() || j < cr.size()) {
    // A replica check's rows (grad_reduced) are judged within their run (rule
    // `replicas`), never against the other run's: either run may check or not.
    if (i < br.size() && KeyKind(br[i].key) == Kind::kGradReduced) {
      ++i;
      continue;
    }
    if (j < cr.size() && KeyKind(cr[j].key) == Kind::kGradReduced) {
      ++j;
      continue;
    }
    if (j == cr.size() || (i < br.size() && br[i].key < cr[j].key)) {
      NoteUnmatched(p, br[i].key, true, bs.step);
      ++i;
    } else if (i == br.size() || cr[j].key < br[i].key) {
      NoteUnmatched(p, cr[j].key, false, cs.step);
      ++j;
    } else if (br[i].repeat && cr[j].repeat) {
      // The same tensor as the row before it, under another name (a container whose
      // output is its child's): compared once, as its producer, which shows the alias.
      // The birth rule reads it as what that module produced or received. A repeat in
      // one run only is another tensor in the other (a parent's own code changed what
      // it hands on: x * 1.01 before a child): compared, as the first place it shows.
      if (judge_birth && IsBirthKind(KeyKind(br[i].key))) p->birth_rows.push_back(BirthRow{&br[i], &cr[j]});
      has_act_in = has_act_in || KeyKind(br[i].key) == Kind::kActIn;
      ++i;
      ++j;
    } else {
      if (judge_birth && IsBirthKind(KeyKind(br[i].key))) p->birth_rows.push_back(BirthRow{&br[i], &cr[j]});
      has_act_in = has_act_in || KeyKind(br[i].key) == Kind::kActIn;
      const StatRow& b = br[i];
      const StatRow& c = cr[j];
      const DT prec = LowerPrecision(pair_precision, LowerPrecision(b.dtype, c.dtype));
      MatchedTensor m;
      m.b = &b;
      m.c = &c;
      m.eval = EvaluatePair(bs, b, cs, c,
                            WithContextFloor(cfg.TensorTolerance(prec == DT::kUnknown ? DT::kF32 : prec), peers, b.key));
      auto [tit, inserted] = tracks.try_emplace(b.key);
      m.track = &tit->second;
      if (inserted) {
        m.track->key = b.key;
        m.track->rank = rank;
      }
      m.threshold = m.track->Threshold(cfg);
      matched.push_back(m);
      ++i;
      ++j;
    }
  }
  std::sort(matched.begin(), matched.end(),
            [](const MatchedTensor& x, const MatchedTensor& y) { return x.c->order < y.c->order; });

  PairStepView v;
  v.step = cs.step;
  v.rank = rank;
  v.b = &bs;
  v.c = &cs;
  v.precision = pair_precision == DT::kUnknown ? DT::kF32 : pair_precision;
  v.matched = &matched;
  if (judge_birth && has_act_in) {
    auto& finder = p->finders[rank];
    if (!finder) finder = std::make_unique<BirthFinder>(&names_, &opt_.rules);
    v.birth = finder->Analyze(bs, cs, p->birth_rows, peers, &p->births);
    v.births = &p->births;
    v.birth_state = finder.get();
    if (p->birth_log.size() < kMaxBirthSteps && !p->births.empty()) {
      StepBirths sb;
      sb.step = cs.step;
      sb.rank = rank;
      sb.ops.assign(p->births.begin(),
                    p->births.begin() + static_cast<std::ptrdiff_t>(std::min(p->births.size(), kBirthOpsPerStep)));
      for (OpBirth& o : sb.ops) o.out_b = o.out_c = nullptr;  // rows of this step only
      p->birth_log.push_back(std::move(sb));
    }
  }
  for (auto& d : p->detectors) d->OnPairStep(v);

  for (MatchedTensor& m : matched) {
    m.track->Learn(m.eval.score, cfg);
    auto [rit, fresh] = p->table.try_emplace(m.c->key);
    TensorRow& t = rit->second;
    if (fresh) {
      t.dtype_b = m.b->dtype;
      t.dtype_c = m.c->dtype;
    }
    t.order = m.c->order;
    ++t.compared;
    if (m.drifting() && (t.first_drift_step < 0 || static_cast<int64_t>(cs.step) < t.first_drift_step)) {
      t.first_drift_step = static_cast<int64_t>(cs.step);
    }
    const double ratio = m.eval.score / m.threshold;
    // Worst over ranks; equal scores go to the earlier step, then the lower rank, so
    // the table does not depend on the order the ranks arrived in.
    if (ratio > t.worst_score ||
        (ratio == t.worst_score && (cs.step < t.worst_step || (cs.step == t.worst_step && rank < t.worst_rank)))) {
      t.worst_score = ratio;
      t.worst_step = cs.step;
      t.worst_rank = rank;
      t.worst = m.eval;
      t.worst_b_l2 = m.b->l2;
      t.worst_c_l2 = m.c->l2;
      t.worst_b[0] = m.b->max, t.worst_b[1] = m.b->min, t.worst_b[2] = m.b->mean;
      t.worst_c[0] = m.c->max, t.worst_c[1] = m.c->min, t.worst_c[2] = m.c->mean;
      t.worst_threshold = m.threshold;
    }
  }
  if (bs.has_scalars && cs.has_scalars) {
    p->loss_b = bs.scalars.loss;
    p->loss_c = cs.scalars.loss;
    p->loss_b_given = bs.scalars.loss_given;
    p->loss_c_given = cs.scalars.loss_given;
  }
  pairs_compared_ += matched.size();
  p->onsets.Observe(v);
  if (observer_) observer_(p->ctx, v);
  NoteDivergence(p);
}

std::vector<PairReport> Analyzer::Reports() const {
  std::vector<PairReport> out;
  for (const auto& p : pairs_) {
    if (!p) continue;
    const AlignedPair& al = *p->aligned;
    PairReport r;
    r.experiment = p->ctx.experiment;
    r.baseline = p->ctx.baseline;
    r.candidate = p->ctx.candidate;
    r.steps_compared = al.steps_matched;
    r.ranks = static_cast<uint32_t>(al.ranks.size());
    r.steps_only_baseline = al.only_baseline;
    r.steps_only_candidate = al.only_candidate;
    r.steps_evicted = al.evicted;
    r.loss_b = p->loss_b;
    r.loss_c = p->loss_c;
    r.loss_b_given = p->loss_b_given;
    r.loss_c_given = p->loss_c_given;
    r.diverged = p->outcome.diverged;
    if (r.diverged) r.first_divergence = p->outcome.first_divergence;
    r.trends_downstream = p->outcome.trends_downstream;
    r.setup_known = p->facts.setup_known;
    r.setup = p->facts.setup;
    r.setup_note = p->facts.setup_note;
    r.onsets = p->onsets;
    for (const StepBirths& sb : p->birth_log) {
      BirthReport br;
      br.step = sb.step;
      br.rank = sb.rank;
      for (const OpBirth& o : sb.ops) {
        br.ops.push_back(OpBirthReport{names_.Name(o.op), names_.ModuleType(o.op), o.backward ? "backward" : "forward",
                                       o.input_error, o.output_error, o.explained, o.ratio, o.born});
      }
      r.births.push_back(std::move(br));
    }
    r.births_truncated = p->birth_log.size() >= kMaxBirthSteps;
    for (const auto& [key, t] : p->table) {
      TensorReport tr;
      tr.name = names_.Name(KeyNameId(key));
      tr.label = names_.Label(KeyNameId(key), static_cast<uint8_t>(KeyKind(key)));
      tr.aliases = names_.Aliases(KeyNameId(key), static_cast<uint8_t>(KeyKind(key)));
      tr.kind = KindName(KeyKind(key));
      tr.micro_step = KeyMicroStep(key);
      tr.order = t.order;
      tr.dtype_b = DTypeName(t.dtype_b);
      tr.dtype_c = DTypeName(t.dtype_c);
      tr.steps = t.compared;
      tr.worst_step = t.worst_step;
      tr.rank = t.worst_rank;
      tr.b_l2 = t.worst_b_l2;
      tr.c_l2 = t.worst_c_l2;
      tr.b_max = t.worst_b[0], tr.b_min = t.worst_b[1], tr.b_mean = t.worst_b[2];
      tr.c_max = t.worst_c[0], tr.c_min = t.worst_c[1], tr.c_mean = t.worst_c[2];
      tr.rel_minmax = t.worst.rel_minmax;
      tr.stats_only = t.worst.stats_only;
      r.stats_only = r.stats_only || t.worst.stats_only;
      tr.rel_l2 = t.worst.rel_l2;
      tr.rel_mean = t.worst.rel_mean;
      tr.rel_absmax = t.worst.rel_absmax;
      tr.rel_std = t.worst.rel_std;
      tr.cosine = t.worst.cosine;
      tr.rel_dist = t.worst.rel_dist;
      tr.kl = t.worst.kl;
      tr.score = t.worst.score;
      tr.threshold = t.worst_threshold;
      tr.metric = MetricName(t.worst.dominant);
      tr.first_drift_step = t.first_drift_step;
      if (t.worst.nonfinite_mismatch) {
        tr.status = "nonfinite";
      } else if (t.worst_score >= opt_.rules.critical_factor) {
        tr.status = "critical";
      } else if (t.first_drift_step >= 0) {
        tr.status = "drift";
      } else {
        tr.status = "ok";
      }
      r.tensors.push_back(std::move(tr));
    }
    std::sort(r.tensors.begin(), r.tensors.end(), [](const TensorReport& a, const TensorReport& b) {
      return a.order != b.order ? a.order < b.order : a.name < b.name;
    });
    for (const auto& [key, u] : p->unmatched) {
      r.unmatched.push_back(UnmatchedReport{names_.Name(KeyNameId(key)), KindName(KeyKind(key)),
                                            u.in_baseline ? "baseline" : "candidate", u.first_step, u.steps});
    }
    std::sort(r.unmatched.begin(), r.unmatched.end(), [](const UnmatchedReport& a, const UnmatchedReport& b) {
      return a.first_step != b.first_step ? a.first_step < b.first_step : a.name < b.name;
    });
    out.push_back(std::move(r));
  }
  return out;
}

AnalyzerCounters Analyzer::counters() const {
  AnalyzerCounters c;
  static_cast<AlignerCounters&>(c) = aligner_.counters();
  c.pairs_compared = pairs_compared_;
  c.steps_compared = c.steps_matched;
  c.unmatched_tensors = unmatched_tensors_;
  return c;
}

}  // namespace lockstep::collector
