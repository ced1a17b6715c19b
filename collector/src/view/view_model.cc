#include "view/view_model.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "align/pair_metrics.h"
#include "align/step_data.h"
#include "rules/detector.h"
#include "lockstep/common/wire.h"
#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::collector {
namespace {

using nlohmann::json;

// Rounded to ~5 significant digits: the feed is for eyes and sparklines, and short
// numbers keep a 2 Hz snapshot small.
json Short(double v) {
  if (!std::isfinite(v)) return json(nullptr);
  if (v == 0) return json(0);
  const double mag = std::pow(10.0, 4 - static_cast<int>(std::floor(std::log10(std::fabs(v)))));
  return json(std::round(v * mag) / mag);
}

// A loss: null when the run gave none, "NaN" / "inf" / "-inf" when it gave a non-finite
// one (JSON has no NaN), else the number.
json Loss(double v, bool given) {
  if (!given) return json(nullptr);
  if (std::isnan(v)) return json("NaN");
  if (std::isinf(v)) return json(v > 0 ? "inf" : "-inf");
  return Short(v);
}

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

  json out;
  out["v"] = 1;
  out["t"] = now_ns / 1'000'000;
  out["collector"] = {{"records", extras.records}, {"bad", extras.bad_messages},
                      {"analyzer_errors", extras.analyzer_errors}};
  // Built under mu_ (the json tree is the copy), serialized after releasing it.
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
  json jruns = json::array();
  for (const RunRow& r : rows) {
    json j = {{"run", r.run},         {"role", r.role},         {"platform", r.platform},
              {"device", r.device},   {"experiment", r.experiment}, {"ranks", r.ranks},
              {"world", r.world},     {"drops", r.drops},       {"gaps", r.gaps},
              {"bad", r.bad},         {"ended", r.ended}};
    j["step"] = r.has_step ? json(r.step) : json(nullptr);
    j["last_seen_s"] = r.last_recv ? Short(std::max<double>(0, (now_ns - r.last_recv) / 1e9)) : json(nullptr);
    int64_t ps = 0;
    j["lag"] = r.has_step && partner_step(r.run, &ps) ? json(ps - static_cast<int64_t>(r.step)) : json(nullptr);
    auto it = runs_.find(r.run);
    json sps = nullptr, loss = nullptr, st = nullptr;
    if (it != runs_.end()) {
      const RunState& s = it->second;
      loss = Loss(s.loss, s.has_loss);
      if (s.has_time) st = Short(s.step_time_s);
      if (!s.progress.empty()) {
        const auto& [t1, s1] = s.progress.back();
        const auto& [t0, s0] = s.progress.front();
        if (now_ns - t1 > kStalledNs || r.ended) {
          sps = 0;
        } else if (t1 > t0) {
          sps = Short(static_cast<double>(s1 - s0) / ((t1 - t0) / 1e9));
        }
      }
    }
    j["sps"] = sps;
    j["loss"] = loss;
    j["step_time_s"] = st;
    jruns.push_back(std::move(j));
  }
  out["runs"] = std::move(jruns);

  json jpairs = json::array();
  for (const auto& [k, p] : pairs_) {
    json j = {{"experiment", p.experiment}, {"baseline", p.baseline}, {"candidate", p.candidate},
              {"step", p.step},             {"compared", p.steps_compared},
              {"ranks", p.ranks.size()}};
    const LossPoint* last = p.loss.empty() ? nullptr : &p.loss.back();
    j["loss_b"] = last ? Loss(last->b, last->b_given) : json(nullptr);
    j["loss_c"] = last ? Loss(last->c, last->c_given) : json(nullptr);
    j["loss_rel"] = last ? Short(RelDiff(last->b, last->c)) : json(nullptr);
    json hist = json::array();
    for (const LossPoint& lp : p.loss) {
      hist.push_back(json::array({lp.step, Loss(lp.b, lp.b_given), Loss(lp.c, lp.c_given)}));
    }
    j["loss_hist"] = std::move(hist);
    j["setup"] = p.setup_known ? json{{"differences", p.setup_differences}, {"summary", p.setup_summary}}
                               : json(nullptr);
    j["first_div"] = p.diverged ? json{{"step", p.first_div_step},
                                       {"tensor", p.first_div_tensor},
                                       {"rank", p.first_div_rank},
                                       {"where", p.onsets.Where(p.first_div_step, p.first_div_rank)}}
                                : json(nullptr);
    const TensorState* producer = nullptr;
    if (p.has_onset) {
      auto pit = p.tensors.find(p.onset_key);
      if (pit != p.tensors.end()) producer = &pit->second;
    }
    j["nan_onset"] = producer ? json{{"step", p.onset_step}, {"tensor", producer->name}, {"kind", producer->kind}}
                              : json(nullptr);

    std::vector<const TensorState*> ts;
    ts.reserve(p.tensors.size());
    uint64_t drifting = 0;
    for (const auto& [key, t] : p.tensors) {
      ts.push_back(&t);
      if (t.ratio > 1) ++drifting;
    }
    j["tensors_total"] = ts.size();
    j["drifting"] = drifting;
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
    json jt = json::array();
    for (size_t i = 0; i < n; ++i) {
      const TensorState& t = *ts[i];
      // Now (at the tensor's last compared step) vs earlier: "drifting" is beyond
      // tolerance now, "drifted" was once and is back within it.
      const char* status = &t == producer                       ? "producer"
                           : t.nonfinite_now                    ? "nonfinite"
                           : t.ratio >= p.critical_factor       ? "critical"
                           : t.ratio > 1                        ? "drifting"
                           : t.first_drift_step >= 0 || t.nonfinite ? "drifted"
                                                                : "ok";
      json e = {{"name", t.name},         {"kind", t.kind},           {"order", t.order},
                {"step", t.step},         {"ratio", Short(t.ratio)},  {"score", Short(t.score)},
                {"rel_l2", Short(t.rel_l2)}, {"cos", Short(t.cosine)}, {"b_l2", Short(t.b_l2)},
                {"c_l2", Short(t.c_l2)},  {"metric", t.metric},       {"worst", Short(t.worst_ratio)},
                {"status", status}};
      e["first"] = t.first_drift_step >= 0 ? json(t.first_drift_step) : json(nullptr);
      e["first_nonfinite"] = t.first_nonfinite_step >= 0 ? json(t.first_nonfinite_step) : json(nullptr);
      if (i < opt_.history_tensors) {
        json h = json::array();
        const size_t sz = t.ring.size();
        if (t.has_onset && sz > 0 && t.ring[t.ring_pos % sz].step > t.onset.step) {
          h.push_back(json::array({t.onset.step, Short(t.onset.ratio), Short(t.onset.b_l2), Short(t.onset.c_l2)}));
        }
        for (size_t q = 0; q < sz; ++q) {
          const Point& pt = t.ring[(t.ring_pos + q) % sz];
          h.push_back(json::array({pt.step, Short(pt.ratio), Short(pt.b_l2), Short(pt.c_l2)}));
        }
        e["hist"] = std::move(h);
      }
      jt.push_back(std::move(e));
    }
    j["tensors"] = std::move(jt);
    jpairs.push_back(std::move(j));
  }
  out["pairs"] = std::move(jpairs);

  json ja = json::array();
  for (auto it = alerts_.rbegin(); it != alerts_.rend(); ++it) {
    ja.push_back({{"t", it->unix_ns / 1'000'000}, {"sev", it->severity}, {"rule", it->rule},
                  {"experiment", it->experiment}, {"runs", it->runs}, {"step", it->step},
                  {"tensor", it->tensor}, {"msg", it->message}});
  }
  out["alerts"] = {{"total", alerts_total_},
                   {"info", alerts_by_severity_[0]},
                   {"warning", alerts_by_severity_[1]},
                   {"critical", alerts_by_severity_[2]},
                   {"recent", std::move(ja)}};
  l.Unlock();
  // Invalid UTF-8 in a name (agents send bytes) must not throw: replace it.
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace lockstep::collector
