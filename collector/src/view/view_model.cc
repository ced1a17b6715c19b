#include "view/view_model.h"

#include <algorithm>
#include <cmath>

#include "align/pair_metrics.h"
#include "align/step_data.h"
#include "rules/detector.h"
#include "lockstep/common/wire.h"
#include "lockstep/schema/lockstep_generated.h"
#include "view/snapshot.h"
#include "view/snapshot_json.h"

namespace lockstep::collector {
namespace {

double RelDiff(double b, double c) {
  if (!std::isfinite(b) || !std::isfinite(c)) return std::nan("");
  const double d = std::fabs(c - b);
  return d == 0 ? 0 : d / std::max(std::fabs(b), 1e-12);
}

constexpr int64_t kRateWindowNs = 10'000'000'000;  // steps/s over the last 10 s
constexpr int64_t kStalledNs = 5'000'000'000;      // no new step for 5 s: 0 steps/s

}  // namespace

ViewModel::ViewModel(ViewModelOptions opt) : opt_(opt) {}

void ViewModel::OnPairStep(const PairCtx& ctx, const PairStepView& v) {
  MutexLock l(&mu_);
  PairState& p = pairs_[ctx.experiment + "\t" + ctx.baseline + "\t" + ctx.candidate];
  if (p.experiment.empty()) {
    p.experiment = ctx.experiment;
    p.baseline = ctx.baseline;
    p.candidate = ctx.candidate;
  }
  if (ctx.cfg) p.critical_factor = ctx.cfg->critical_factor;
  if (!p.setup_known && ctx.facts != nullptr && ctx.facts->setup_known) {
    p.setup_known = true;
    p.setup_differences = ctx.facts->setup.size();
    if (!ctx.facts->setup.empty()) p.setup_summary = DescribeSetup(ctx.facts->setup, 3);
  }
  p.step = std::max(p.step, v.step);
  ++p.steps_compared;
  p.ranks.insert(v.rank);
  if (v.b && v.c && v.b->has_scalars && v.c->has_scalars &&
      (p.loss.empty() || p.loss.back().step < v.step)) {
    p.loss.push_back(LossPoint{v.step, v.b->scalars.loss, v.c->scalars.loss, v.b->scalars.loss_given,
                               v.c->scalars.loss_given});
    while (p.loss.size() > opt_.loss_points) p.loss.pop_front();
  }
  if (!v.matched) return;
  p.onsets.Observe(v);
  for (const MatchedTensor& m : *v.matched) {
    if (!m.b || !m.c) continue;
    const uint64_t key = m.b->key;
    auto [it, inserted] = p.tensors.try_emplace(key);
    TensorState& t = it->second;
    if (inserted) {
      t.name = ctx.names ? ctx.names->Name(KeyNameId(key)) : std::to_string(key);
      t.kind = KindName(KeyKind(key));
      if (KeyMicroStep(key) != 0) t.name += "#" + std::to_string(KeyMicroStep(key));
      t.ring.reserve(kHistory);
    }
    const double thr = m.threshold > 0 ? m.threshold : 1.0;
    const double ratio = std::isfinite(m.eval.score) ? m.eval.score / thr : 1e30;
    // Several ranks compare the same step: the step's point is the worst of them.
    const bool same_step = !t.ring.empty() && t.step == v.step;
    t.order = m.c->order;
    if (!same_step || ratio >= t.ratio) {
      t.step = v.step;
      t.ratio = ratio;
      t.score = m.eval.score;
      t.threshold = thr;
      t.rel_l2 = m.eval.rel_l2;
      t.cosine = m.eval.cosine;
      t.b_l2 = m.b->l2;
      t.c_l2 = m.c->l2;
      t.metric = MetricName(m.eval.dominant);
    }
    const bool nf = m.eval.nonfinite_mismatch;
    if (!same_step) t.nonfinite_now = nf;
    t.nonfinite_now = t.nonfinite_now || nf;
    t.nonfinite = t.nonfinite || nf;
    if (nf && (t.first_nonfinite_step < 0 || static_cast<int64_t>(v.step) < t.first_nonfinite_step)) {
      t.first_nonfinite_step = static_cast<int64_t>(v.step);
    }
    // The producer: non-finite at the earliest step, and first in execution order there
    // (a NaN made in the backward pass reaches every forward tensor of the next step).
    if (nf && (!p.has_onset || v.step < p.onset_step || (v.step == p.onset_step && m.c->order < p.onset_order))) {
      p.has_onset = true;
      p.onset_step = v.step;
      p.onset_order = m.c->order;
      p.onset_key = key;
    }
    t.worst_ratio = std::max(t.worst_ratio, ratio);
    if (ratio > 1 && (t.first_drift_step < 0 || static_cast<int64_t>(v.step) < t.first_drift_step)) {
      t.first_drift_step = static_cast<int64_t>(v.step);
      t.onset = Point{v.step, static_cast<float>(ratio), static_cast<float>(m.b->l2), static_cast<float>(m.c->l2)};
      t.has_onset = true;
      if (!p.diverged || v.step < p.first_div_step) {
        p.diverged = true;
        p.first_div_step = v.step;
        p.first_div_rank = v.rank;
        p.first_div_tensor = t.name;
      }
    }
    const Point pt{v.step, static_cast<float>(ratio), static_cast<float>(m.b->l2), static_cast<float>(m.c->l2)};
    if (same_step) {
      Point& last = t.ring[(t.ring_pos + t.ring.size() - 1) % t.ring.size()];
      if (pt.ratio > last.ratio) last = pt;
    } else if (t.ring.size() < kHistory) {
      t.ring.push_back(pt);
    } else {
      t.ring[t.ring_pos] = pt;
      t.ring_pos = (t.ring_pos + 1) % kHistory;
    }
  }
}

void ViewModel::OnMessage(const wire::Envelope& env, int64_t recv_ns) {
  if (env.body_type() != wire::Body::StepScalars || !env.run_id()) return;
  const auto* s = env.body_as_StepScalars();
  MutexLock l(&mu_);
  RunState& r = runs_[env.run_id()->str()];
  if (!r.any_step || s->step() >= r.max_step) {
    // A NaN loss the job gave is shown as NaN; one it did not give leaves the last.
    if (ScalarIsGiven(static_cast<uint8_t>(s->given()), static_cast<uint8_t>(wire::ScalarGiven::Loss), s->loss())) {
      r.loss = s->loss();
      r.has_loss = true;
    }
    if (std::isfinite(s->step_time_s()) && s->step_time_s() > 0) {
      r.step_time_s = s->step_time_s();
      r.has_time = true;
    }
  }
  if (!r.any_step || s->step() > r.max_step) {
    r.any_step = true;
    r.max_step = s->step();
    r.progress.emplace_back(recv_ns, s->step());
    while (r.progress.size() > 2 && r.progress.front().first < recv_ns - kRateWindowNs) r.progress.pop_front();
  }
}

void ViewModel::OnAlert(const alerting::Alert& a) {
  MutexLock l(&mu_);
  ++alerts_total_;
  ++alerts_by_severity_[std::min<int>(static_cast<int>(a.severity), 2)];
  alerts_.push_back(AlertRow{a.first_seen_unix_ns, alerting::SeverityName(a.severity), a.rule, a.experiment,
                             a.tensor, a.message, a.runs, a.step});
  while (alerts_.size() > opt_.max_alerts) alerts_.pop_front();
}

std::string ViewModel::SnapshotJson(const std::vector<RankInfo>& ranks, const ViewExtras& extras,
                                    int64_t now_ns) const {
  // Per run from the registry (outside mu_).
  struct RunRow {
    std::string run, role, platform, device, experiment;
    uint32_t ranks = 0, world = 0;
    uint64_t step = 0, drops = 0, gaps = 0, bad = 0;
    bool has_step = false, ended = true;
    int64_t last_recv = 0;
  };
  std::vector<RunRow> rows;
  for (const RankInfo& ri : ranks) {
    if (rows.empty() || rows.back().run != ri.run) {
      rows.emplace_back();
      rows.back().run = ri.run;
    }
    RunRow& r = rows.back();
    ++r.ranks;
    if (ri.hello_seen) {
      r.role = ri.role;
      r.platform = ri.platform;
      r.device = ri.device_name;
      r.experiment = ri.experiment;
      r.world = std::max(r.world, ri.world_size);
    }
    if (ri.has_step) {
      r.step = r.has_step ? std::max(r.step, ri.last_step) : ri.last_step;
      r.has_step = true;
    }
    r.drops += ri.agent_records_dropped;
    r.gaps += ri.gaps;
    r.bad += ri.bad_messages;
    r.ended = r.ended && ri.goodbye;
    r.last_recv = std::max(r.last_recv, ri.last_recv_unix_ns);
  }

  view::Snapshot snap;
  snap.unix_ms = now_ns / 1'000'000;
  snap.records = extras.records;
  snap.bad = extras.bad_messages;
  snap.analyzer_errors = extras.analyzer_errors;
  // Copied under mu_ (the Snapshot is the copy), written as JSON after releasing it.
  MutexLock l(&mu_);
  // A run's partner: the other side of the first pair it is in.
  auto partner_step = [&](const std::string& run, int64_t* step) {
    mu_.AssertHeld();  // called below, with l held
    for (const auto& [k, p] : pairs_) {
      const std::string* other = run == p.baseline ? &p.candidate : run == p.candidate ? &p.baseline : nullptr;
      if (!other) continue;
      for (const RunRow& o : rows) {
        if (o.run == *other && o.has_step) {
          *step = static_cast<int64_t>(o.step);
          return true;
        }
      }
    }
    return false;
  };
  const double unknown = std::nan("");
  for (const RunRow& r : rows) {
    view::RunRow& o = snap.runs.emplace_back();
    o.run = r.run;
    o.role = r.role;
    o.platform = r.platform;
    o.device = r.device;
    o.experiment = r.experiment;
    o.ranks = r.ranks;
    o.world = r.world;
    o.drops = r.drops;
    o.gaps = r.gaps;
    o.bad = r.bad;
    o.ended = r.ended;
    o.step = r.has_step ? static_cast<int64_t>(r.step) : -1;
    o.last_seen_s = r.last_recv ? std::max<double>(0, (now_ns - r.last_recv) / 1e9) : unknown;
    int64_t ps = 0;
    o.has_lag = r.has_step && partner_step(r.run, &ps);
    o.lag = o.has_lag ? ps - static_cast<int64_t>(r.step) : 0;
    o.sps = o.step_time_s = unknown;
    auto it = runs_.find(r.run);
    if (it != runs_.end()) {
      const RunState& s = it->second;
      o.loss = s.loss;
      o.has_loss = s.has_loss;
      if (s.has_time) o.step_time_s = s.step_time_s;
      if (!s.progress.empty()) {
        const auto& [t1, s1] = s.progress.back();
        const auto& [t0, s0] = s.progress.front();
        if (now_ns - t1 > kStalledNs || r.ended) {
          o.sps = 0;
        } else if (t1 > t0) {
          o.sps = static_cast<double>(s1 - s0) / ((t1 - t0) / 1e9);
        }
      }
    }
  }

  for (const auto& [k, p] : pairs_) {
    view::PairRow& o = snap.pairs.emplace_back();
    o.experiment = p.experiment;
    o.baseline = p.baseline;
    o.candidate = p.candidate;
    o.step = static_cast<int64_t>(p.step);
    o.compared = p.steps_compared;
    o.ranks = p.ranks.size();
    o.loss_rel = unknown;
    if (!p.loss.empty()) {
      const LossPoint& last = p.loss.back();
      o.loss_b = last.b;
      o.has_loss_b = last.b_given;
      o.loss_c = last.c;
      o.has_loss_c = last.c_given;
      o.loss_rel = RelDiff(last.b, last.c);
    }
    for (const LossPoint& lp : p.loss)
      o.loss_hist.push_back({static_cast<int64_t>(lp.step), lp.b, lp.c, lp.b_given, lp.c_given});
    o.has_setup = p.setup_known;
    if (p.setup_known) {
      o.setup_differences = static_cast<int64_t>(p.setup_differences);
      o.setup_summary = p.setup_summary;
    }
    if (p.diverged) {
      o.diverged = true;
      o.first_div_step = static_cast<int64_t>(p.first_div_step);
      o.first_div_tensor = p.first_div_tensor;
      o.first_div_rank = p.first_div_rank;
      o.first_div_where = p.onsets.Where(p.first_div_step, p.first_div_rank);
    }
    const TensorState* producer = nullptr;
    if (p.has_onset) {
      auto pit = p.tensors.find(p.onset_key);
      if (pit != p.tensors.end()) producer = &pit->second;
    }
    if (producer) {
      o.has_nan_onset = true;
      o.nan_onset_step = static_cast<int64_t>(p.onset_step);
      o.nan_onset_tensor = producer->name;
      o.nan_onset_kind = producer->kind;
    }

    std::vector<const TensorState*> ts;
    ts.reserve(p.tensors.size());
    uint64_t drifting = 0;
    for (const auto& [key, t] : p.tensors) {
      ts.push_back(&t);
      if (t.ratio > 1) ++drifting;
    }
    o.tensors_total = ts.size();
    o.drifting = drifting;
    // The producer first, pinned; then by drift. Ties (every non-finite tensor drifts
    // "infinitely") go to the earliest non-finite step, then execution order.
    auto worse = [producer](const TensorState* a, const TensorState* b) {
      if ((a == producer) != (b == producer)) return a == producer;
      if (a->ratio != b->ratio) return a->ratio > b->ratio;
      if (a->worst_ratio != b->worst_ratio) return a->worst_ratio > b->worst_ratio;
      const uint64_t fa = static_cast<uint64_t>(a->first_nonfinite_step);  // -1: last
      const uint64_t fb = static_cast<uint64_t>(b->first_nonfinite_step);
      if (fa != fb) return fa < fb;
      return a->order < b->order;
    };
    const size_t n = std::min(ts.size(), opt_.max_tensors);
    std::partial_sort(ts.begin(), ts.begin() + static_cast<std::ptrdiff_t>(n), ts.end(), worse);
    for (size_t i = 0; i < n; ++i) {
      const TensorState& t = *ts[i];
      view::TensorRow& e = o.tensors.emplace_back();
      // Now (at the tensor's last compared step) vs earlier: "drifting" is beyond
      // tolerance now, "drifted" was once and is back within it.
      e.status = &t == producer                       ? "producer"
                 : t.nonfinite_now                    ? "nonfinite"
                 : t.ratio >= p.critical_factor       ? "critical"
                 : t.ratio > 1                        ? "drifting"
                 : t.first_drift_step >= 0 || t.nonfinite ? "drifted"
                                                      : "ok";
      e.name = t.name;
      e.kind = t.kind;
      e.order = t.order;
      e.step = static_cast<int64_t>(t.step);
      e.ratio = t.ratio;
      e.score = t.score;
      e.rel_l2 = t.rel_l2;
      e.cos = t.cosine;
      e.b_l2 = t.b_l2;
      e.c_l2 = t.c_l2;
      e.metric = t.metric;
      e.worst = t.worst_ratio;
      e.first = t.first_drift_step;
      e.first_nonfinite = t.first_nonfinite_step;
      if (i < opt_.history_tensors) {
        e.has_hist = true;
        auto add = [&e](const Point& pt) {
          e.hist.push_back({static_cast<int64_t>(pt.step), pt.ratio, pt.b_l2, pt.c_l2});
        };
        const size_t sz = t.ring.size();
        if (t.has_onset && sz > 0 && t.ring[t.ring_pos % sz].step > t.onset.step) add(t.onset);
        for (size_t q = 0; q < sz; ++q) add(t.ring[(t.ring_pos + q) % sz]);
      }
    }
  }

  for (auto it = alerts_.rbegin(); it != alerts_.rend(); ++it) {
    snap.alerts.push_back(view::AlertRow{it->unix_ns / 1'000'000, static_cast<int64_t>(it->step),
                                         it->severity, it->rule, it->experiment, it->tensor,
                                         it->message, it->runs});
  }
  snap.alerts_total = alerts_total_;
  snap.alerts_info = alerts_by_severity_[0];
  snap.alerts_warning = alerts_by_severity_[1];
  snap.alerts_critical = alerts_by_severity_[2];
  l.Unlock();
  return view::WriteSnapshotJson(snap);
}

}  // namespace lockstep::collector
