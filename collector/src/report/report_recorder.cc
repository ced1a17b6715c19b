#include "report/report_recorder.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "detect/alert_json.h"
#include "lockstep/common/json_out.h"

namespace lockstep::collector {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The heatmap groups rows as the job runs: forward activations (what modules produced
// and, among them, what they received that no module produced), backward activation
// gradients, parameter gradients, then anything else.
int GroupOf(Kind k) {
  switch (k) {
    case Kind::kAct:
    case Kind::kActIn: return 0;
    case Kind::kActGrad: return 1;
    case Kind::kParamGrad: return 2;
    default: return 3;
  }
}

// A drift score on the page's log scale: round(10 log10(score)); -99 for 0 (and
// anything under 1e-9.9), 999 for a NaN/Inf mismatch.
int QuantizeScore(float s, bool nonfinite) {
  if (nonfinite || std::isinf(s) || std::isnan(s)) return 999;
  if (s <= 0) return -99;
  return std::clamp(static_cast<int>(std::lround(10.0 * std::log10(static_cast<double>(s)))), -99, 99);
}

}  // namespace

ReportRecorder::ReportRecorder(ReportLimits limits) : limits_(limits) {}

void ReportRecorder::MergeCell(Cell* into, const Cell& c) {
  if (c.score < 0 && !c.nonfinite) return;
  const bool take = into->score < 0 || (c.nonfinite && !into->nonfinite) ||
                    (c.nonfinite == into->nonfinite && !(c.score <= into->score));
  if (take) *into = c;
}

// Doubles the column stride: columns 2i and 2i+1 become column i.
void ReportRecorder::Halve(Pair* p) const {
  p->stride *= 2;
  const uint32_t n = (p->ncols + 1) / 2;
  for (Row& r : p->rows) {
    for (uint32_t i = 0; i < n; ++i) {
      Cell merged = r.cells[2 * i];
      if (2 * i + 1 < p->ncols) MergeCell(&merged, r.cells[2 * i + 1]);
      r.cells[i] = merged;
    }
    std::fill(r.cells.begin() + n, r.cells.begin() + p->ncols, Cell{});
  }
  p->ncols = n;
}

void ReportRecorder::OnPairStep(const PairCtx& ctx, const PairStepView& v) {
  std::lock_guard<std::mutex> lock(mu_);
  Pair& p = pairs_[ctx.experiment];
  if (!p.started) {
    p.started = true;
    p.baseline = ctx.baseline;
    p.candidate = ctx.candidate;
    p.first_step = v.step;
    p.scalar_rank = v.rank;
  } else if (p.baseline != ctx.baseline || p.candidate != ctx.candidate) {
    return;  // a second candidate of the experiment: the page shows the first pair
  }
  ++p.steps;
  p.last_step = std::max(p.last_step, v.step);
  const uint64_t rel = v.step >= p.first_step ? v.step - p.first_step : 0;
  while (rel / p.stride >= limits_.max_cols) Halve(&p);
  const uint32_t col = static_cast<uint32_t>(rel / p.stride);
  p.ncols = std::max(p.ncols, col + 1);
  // The neighbourhood ring's slot for this step, or -1 (the ring stopped, or a late
  // rank's step whose slot a later step took).
  int near = -1;
  if (!p.near_frozen && p.near_anchor >= 0 && v.step > static_cast<uint64_t>(p.near_anchor) + kNearSteps)
    p.near_frozen = true;
  if (!p.near_frozen) {
    const uint32_t slot = static_cast<uint32_t>(v.step % kNearCols);
    uint64_t& at = p.near_step[slot];
    if (at == UINT64_MAX || v.step > at) {
      at = v.step;
      for (Row& r : p.rows) r.near[slot] = Cell{};
    }
    if (at == v.step) near = static_cast<int>(slot);
  }

  for (const MatchedTensor& m : *v.matched) {
    const uint64_t key = m.b->key;
    auto it = p.row_of.find(key);
    if (it == p.row_of.end()) {
      if (p.rows.size() >= limits_.max_tensors) {
        ++p.tensors_dropped;
        p.row_of.emplace(key, UINT32_MAX);
        continue;
      }
      Row r;
      r.key = key;
      r.name = ctx.names ? ctx.names->Name(KeyNameId(key)) : std::to_string(KeyNameId(key));
      r.kind = KeyKind(key);
      r.micro = KeyMicroStep(key);
      // All its columns at once, written now: the row's memory is taken (and made
      // resident) when the tensor is first seen, not column by column as the run goes
      // on, so the collector's RSS stays flat over a long run (a growing vector also
      // kept its doubled capacity: 512 columns' worth).
      r.cells.assign(limits_.max_cols, Cell{});
      r.near.assign(kNearCols, Cell{});
      it = p.row_of.emplace(key, static_cast<uint32_t>(p.rows.size())).first;
      p.rows.push_back(std::move(r));
    }
    if (it->second == UINT32_MAX) continue;
    Row& row = p.rows[it->second];
    row.order = m.c->order;
    Cell c;
    const double ratio = m.threshold > 0 ? m.eval.score / m.threshold : m.eval.score;
    c.score = static_cast<float>(std::isnan(ratio) ? std::numeric_limits<double>::infinity() : ratio);
    c.nonfinite = m.eval.nonfinite_mismatch || m.b->nonfinite() || m.c->nonfinite();
    c.b_l2 = static_cast<float>(m.b->l2);
    c.c_l2 = static_cast<float>(m.c->l2);
    MergeCell(&row.cells[col], c);
    if (near >= 0) MergeCell(&row.near[near], c);
    if (p.nf_step < 0 && (m.b->nonfinite() || m.c->nonfinite())) {
      p.nf_step = static_cast<int64_t>(v.step);
      p.nf_tensor = row.name;
      p.nf_side = m.c->nonfinite() ? (m.b->nonfinite() ? "both" : "candidate") : "baseline";
    }
  }

  if (v.rank == p.scalar_rank && v.b->has_scalars && v.c->has_scalars) {
    auto fill = [](const ScalarRow& s, float* out) {
      out[0] = s.loss_given ? static_cast<float>(s.loss) : kNaN;
      out[1] = static_cast<float>(s.grad_norm);
      out[2] = static_cast<float>(s.lr);
      out[3] = static_cast<float>(s.loss_scale);
      out[4] = static_cast<float>(s.step_time_s);
    };
    if (p.points.empty() || v.step >= p.points.back().step + p.pstride) {
      Point pt;
      pt.step = v.step;
      fill(v.b->scalars, pt.b);
      fill(v.c->scalars, pt.c);
      p.points.push_back(pt);
      if (p.points.size() > limits_.max_points) {
        // Keep every other point; the stride doubles.
        p.pstride *= 2;
        size_t k = 0;
        for (size_t i = 0; i < p.points.size(); i += 2) p.points[k++] = p.points[i];
        p.points.resize(k);
      }
    }
  }
}

void ReportRecorder::OnAlert(const alerting::Alert& a) {
  std::lock_guard<std::mutex> lock(mu_);
  if (a.rule == "first_divergence") {
    auto it = pairs_.find(a.experiment);
    if (it != pairs_.end() && it->second.near_anchor < 0 && a.runs.size() == 2 &&
        a.runs[0] == it->second.baseline && a.runs[1] == it->second.candidate)
      it->second.near_anchor = static_cast<int64_t>(a.step);
  }
  Alerts& al = alerts_[a.experiment];
  if (al.kept.size() >= limits_.max_alerts) {
    ++al.dropped;
    return;
  }
  al.kept.push_back(a);
}

std::vector<std::string> ReportRecorder::Experiments() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [exp, p] : pairs_) out.push_back(exp);
  return out;
}

uint64_t ReportRecorder::StepsCompared(const std::string& experiment) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pairs_.find(experiment);
  return it == pairs_.end() ? 0 : it->second.steps;
}

std::vector<alerting::Alert> ReportRecorder::AlertsOf(const std::string& experiment) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = alerts_.find(experiment);
  return it == alerts_.end() ? std::vector<alerting::Alert>{} : it->second.kept;
}

bool ReportRecorder::WriteMatrixJson(const std::string& experiment, JsonOut* j) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pairs_.find(experiment);
  if (it == pairs_.end()) return false;
  const Pair& p = it->second;
  std::vector<uint32_t> idx(p.rows.size());
  for (uint32_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&p](uint32_t x, uint32_t y) {
    const Row& a = p.rows[x];
    const Row& b = p.rows[y];
    if (GroupOf(a.kind) != GroupOf(b.kind)) return GroupOf(a.kind) < GroupOf(b.kind);
    if (a.order != b.order) return a.order < b.order;
    return a.name < b.name;
  });
  j->Key("ds").BeginObject();
  j->FieldU("stride", p.stride);
  j->FieldU("cols", p.ncols);
  j->FieldU("steps", p.steps);
  j->FieldU("first_step", p.first_step);
  j->FieldU("last_step", p.last_step);
  j->FieldU("tensors", p.rows.size() + p.tensors_dropped);
  j->FieldU("tensors_dropped", p.tensors_dropped);
  j->FieldU("point_stride", p.pstride);
  j->EndObject();
  j->Key("cols").BeginArray();
  for (uint32_t c = 0; c < p.ncols; ++c) j->Uint(p.first_step + c * p.stride);
  j->EndArray();
  j->Key("rows").BeginArray();
  for (uint32_t i : idx) {
    const Row& r = p.rows[i];
    j->BeginArray().Str(r.name).Str(KindName(r.kind)).Uint(r.micro).Uint(r.order).EndArray();
  }
  j->EndArray();
  // S: quantized scores; L: the baseline's l2; C: the candidate's l2 relative to it,
  // (c - b) / b, so the history shows both and their relative error.
  const auto write_s = [j](const Cell& c) { j->Int(QuantizeScore(c.score, c.nonfinite)); };
  const auto write_l = [j](const Cell& c) { j->Rounded(c.b_l2, 5); };
  const auto write_c = [j](const Cell& c) {
    const double b = c.b_l2, d = static_cast<double>(c.c_l2) - b;
    j->Rounded(b != 0 ? d / std::fabs(b) : (d == 0 ? 0.0 : std::numeric_limits<double>::infinity()), 3);
  };
  // One matrix, rows in the page's order: cell_at(row, k) is the row's k-th of n columns.
  auto matrix = [&](const char* key, size_t n, auto cell_at, auto cell_fn) {
    j->Key(key).BeginArray();
    for (uint32_t i : idx) {
      const Row& r = p.rows[i];
      j->BeginArray();
      for (size_t k = 0; k < n; ++k) {
        const Cell* c = cell_at(r, k);
        if (c == nullptr || (c->score < 0 && !c->nonfinite)) {
          j->Null();
        } else {
          cell_fn(*c);
        }
      }
      j->EndArray();
    }
    j->EndArray();
  };
  const auto merged = [](const Row& r, size_t k) { return k < r.cells.size() ? &r.cells[k] : nullptr; };
  matrix("S", p.ncols, merged, write_s);
  matrix("L", p.ncols, merged, write_l);
  matrix("C", p.ncols, merged, write_c);
  // The first divergence's neighbourhood, every step, once the heatmap merges columns:
  // "near": {"anchor", "cols": its steps, "S", "L", "C" as above}.
  if (p.near_anchor >= 0 && p.stride > 1) {
    const uint64_t a = static_cast<uint64_t>(p.near_anchor);
    std::vector<std::pair<uint64_t, uint32_t>> slots;  // (step, ring slot), in step order
    for (uint32_t s = 0; s < kNearCols; ++s) {
      const uint64_t st = p.near_step[s];
      if (st != UINT64_MAX && st + kNearSteps >= a && st <= a + kNearSteps) slots.emplace_back(st, s);
    }
    std::sort(slots.begin(), slots.end());
    const auto near = [&slots](const Row& r, size_t k) { return &r.near[slots[k].second]; };
    j->Key("near").BeginObject();
    j->FieldU("anchor", a);
    j->Key("cols").BeginArray();
    for (const auto& sl : slots) j->Uint(sl.first);
    j->EndArray();
    matrix("S", slots.size(), near, write_s);
    matrix("L", slots.size(), near, write_l);
    matrix("C", slots.size(), near, write_c);
    j->EndObject();
  }
  j->Key("scal").BeginObject();
  j->Key("names").BeginArray().Str("loss").Str("grad_norm").Str("lr").Str("loss_scale").Str("step_time_s").EndArray();
  j->Key("steps").BeginArray();
  for (const Point& pt : p.points) j->Uint(pt.step);
  j->EndArray();
  for (const char* side : {"b", "c"}) {
    j->Key(side).BeginArray();
    for (int k = 0; k < kScalars; ++k) {
      j->BeginArray();
      for (const Point& pt : p.points) j->Rounded(side[0] == 'b' ? pt.b[k] : pt.c[k], 6);
      j->EndArray();
    }
    j->EndArray();
  }
  j->EndObject();
  j->Key("nonfinite");
  if (p.nf_step >= 0) {
    j->BeginObject().FieldI("step", p.nf_step).Field("tensor", p.nf_tensor).Field("side", p.nf_side).EndObject();
  } else {
    j->Null();
  }
  return true;
}

void ReportRecorder::WriteAlertsJson(const std::string& experiment, JsonOut* j) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = alerts_.find(experiment);
  j->Key("alerts").BeginArray();
  if (it != alerts_.end()) {
    for (const auto& a : it->second.kept) {
      j->BeginArray()
          .Str(alerting::SeverityName(a.severity))
          .Str(a.rule)
          .Uint(a.step)
          .Str(a.runs.empty() ? std::string() : a.runs.back())
          .Str(a.tensor)
          .Str(a.message)
          .EndArray();
    }
  }
  j->EndArray();
  j->FieldU("alerts_dropped", it == alerts_.end() ? 0 : it->second.dropped);
}

}  // namespace lockstep::collector
