#include "view/snapshot_json.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

namespace lockstep::collector::view {
namespace {

using nlohmann::json;

// ---- Values: each encoding written and read side by side ----

// Rounded to ~5 significant digits; NaN/Inf null.
json Short(double v) {
  if (!std::isfinite(v)) return json(nullptr);
  if (v == 0) return json(0);
  const double mag = std::pow(10.0, 4 - static_cast<int>(std::floor(std::log10(std::fabs(v)))));
  return json(std::round(v * mag) / mag);
}
double D(const json& j, const char* k) {
  auto it = j.find(k);
  return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
}
double At(const json& a, size_t i) {
  return i < a.size() && a[i].is_number() ? a[i].get<double>() : std::nan("");
}

int64_t I(const json& j, const char* k, int64_t def = 0) {
  auto it = j.find(k);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : def;
}
uint64_t U(const json& j, const char* k) {
  auto it = j.find(k);
  return it != j.end() && it->is_number() ? it->get<uint64_t>() : 0;
}
std::string S(const json& j, const char* k) {
  auto it = j.find(k);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// A loss: null when the run gave none, "NaN" / "inf" / "-inf" when it gave a non-finite
// one, else the number.
json LossJson(double v, bool given) {
  if (!given) return json(nullptr);
  if (std::isnan(v)) return json("NaN");
  if (std::isinf(v)) return json(v > 0 ? "inf" : "-inf");
  return Short(v);
}
double LossOf(const json& v, bool* given) {
  *given = true;
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string t = v.get<std::string>();
    if (t == "inf") return INFINITY;
    if (t == "-inf") return -INFINITY;
    return std::nan("");
  }
  *given = false;
  return std::nan("");
}

// [step, loss_b, loss_c]
json LossPointJson(const LossPoint& lp) {
  return json::array({lp.step, LossJson(lp.b, lp.b_given), LossJson(lp.c, lp.c_given)});
}
bool ReadLossPoint(const json& h, LossPoint* lp) {
  if (!h.is_array() || h.size() < 3) return false;
  *lp = {static_cast<int64_t>(At(h, 0)), 0, 0};
  lp->b = LossOf(h[1], &lp->b_given);
  lp->c = LossOf(h[2], &lp->c_given);
  return true;
}

// [step, ratio, b_l2, c_l2]
json HistPointJson(const HistPoint& p) {
  return json::array({p.step, Short(p.ratio), Short(p.b_l2), Short(p.c_l2)});
}
bool ReadHistPoint(const json& q, HistPoint* p) {
  if (!q.is_array()) return false;
  *p = {static_cast<int64_t>(At(q, 0)), At(q, 1), At(q, 2), At(q, 3)};
  return true;
}

// ---- The two directions: the same calls, one writes a field, the other reads it ----

class Writer {
 public:
  explicit Writer(json* j) : j_(*j) {}
  void Str(const char* k, const std::string& v) { j_[k] = v; }
  template <typename T>
  void Int(const char* k, const T& v) {
    j_[k] = v;
  }
  void Num(const char* k, const double& v) { j_[k] = Short(v); }
  // A step, -1 unknown (null).
  void Step(const char* k, const int64_t& v) { j_[k] = v >= 0 ? json(v) : json(nullptr); }
  void OptInt(const char* k, const int64_t& v, const bool& has) {
    j_[k] = has ? json(v) : json(nullptr);
  }
  void Bool(const char* k, const bool& v) { j_[k] = v; }
  void Loss(const char* k, const double& v, const bool& given) { j_[k] = LossJson(v, given); }
  void StrList(const char* k, const std::vector<std::string>& v) { j_[k] = v; }
  void LossHist(const char* k, const std::vector<LossPoint>& v) {
    json a = json::array();
    for (const LossPoint& lp : v) a.push_back(LossPointJson(lp));
    j_[k] = std::move(a);
  }
  // Present only when `has`.
  void DriftHist(const char* k, const std::vector<HistPoint>& v, const bool& has) {
    if (!has) return;
    json a = json::array();
    for (const HistPoint& p : v) a.push_back(HistPointJson(p));
    j_[k] = std::move(a);
  }
  // An object when `present`, else null.
  template <typename F>
  void Object(const char* k, const bool& present, F&& fields) {
    if (!present) {
      j_[k] = nullptr;
      return;
    }
    json o = json::object();
    Writer w(&o);
    fields(w);
    j_[k] = std::move(o);
  }
  template <typename Row, typename F>
  void Rows(const char* k, const std::vector<Row>& rows, F&& fields) {
    json a = json::array();
    for (const Row& r : rows) {
      json o = json::object();
      Writer w(&o);
      fields(w, r);
      a.push_back(std::move(o));
    }
    j_[k] = std::move(a);
  }

 private:
  json& j_;
};

// Tolerant: a missing or mistyped field keeps its default (unknown: NaN, -1, "").
class Reader {
 public:
  explicit Reader(const json& j) : j_(j) {}
  void Str(const char* k, std::string& v) { v = S(j_, k); }
  template <typename T>
  void Int(const char* k, T& v) {
    if constexpr (std::is_signed_v<T>) {
      v = static_cast<T>(I(j_, k));
    } else {
      v = static_cast<T>(U(j_, k));
    }
  }
  void Num(const char* k, double& v) { v = D(j_, k); }
  void Step(const char* k, int64_t& v) { v = I(j_, k, -1); }
  void OptInt(const char* k, int64_t& v, bool& has) {
    has = j_.contains(k) && j_[k].is_number();
    v = I(j_, k);
  }
  void Bool(const char* k, bool& v) { v = j_.value(k, false); }
  void Loss(const char* k, double& v, bool& given) {
    auto it = j_.find(k);
    given = false;
    v = it == j_.end() ? std::nan("") : LossOf(*it, &given);
  }
  void StrList(const char* k, std::vector<std::string>& v) {
    for (const json& x : j_.value(k, json::array()))
      if (x.is_string()) v.push_back(x.get<std::string>());
  }
  void LossHist(const char* k, std::vector<LossPoint>& v) {
    for (const json& h : j_.value(k, json::array())) {
      LossPoint lp;
      if (ReadLossPoint(h, &lp)) v.push_back(lp);
    }
  }
  void DriftHist(const char* k, std::vector<HistPoint>& v, bool& has) {
    auto h = j_.find(k);
    if (h == j_.end() || !h->is_array()) return;
    has = true;
    for (const json& q : *h) {
      HistPoint p;
      if (ReadHistPoint(q, &p)) v.push_back(p);
    }
  }
  template <typename F>
  void Object(const char* k, bool& present, F&& fields) {
    auto o = j_.find(k);
    if (o == j_.end() || !o->is_object()) return;
    present = true;
    Reader r(*o);
    fields(r);
  }
  template <typename Row, typename F>
  void Rows(const char* k, std::vector<Row>& rows, F&& fields) {
    for (const json& o : j_.value(k, json::array())) {
      Row row;
      Reader r(o);
      fields(r, row);
      rows.push_back(std::move(row));
    }
  }

 private:
  const json& j_;
};

// ---- The fields, once: `Row` is const for the writer ----

template <typename Io, typename Row>
void RunFields(Io& io, Row& r) {
  io.Str("run", r.run);
  io.Str("role", r.role);
  io.Str("platform", r.platform);
  io.Str("device", r.device);
  io.Str("experiment", r.experiment);
  io.Int("ranks", r.ranks);
  io.Int("world", r.world);
  io.Step("step", r.step);
  io.OptInt("lag", r.lag, r.has_lag);
  io.Bool("ended", r.ended);
  io.Num("sps", r.sps);
  io.Loss("loss", r.loss, r.has_loss);
  io.Num("step_time_s", r.step_time_s);
  io.Num("last_seen_s", r.last_seen_s);
  io.Int("drops", r.drops);
  io.Int("gaps", r.gaps);
  io.Int("bad", r.bad);
}

template <typename Io, typename Row>
void TensorFields(Io& io, Row& t) {
  io.Str("name", t.name);
  io.Str("kind", t.kind);
  io.Str("metric", t.metric);
  io.Str("status", t.status);
  io.Int("order", t.order);
  io.Int("step", t.step);
  io.Step("first", t.first);
  io.Step("first_nonfinite", t.first_nonfinite);
  io.Num("ratio", t.ratio);
  io.Num("score", t.score);
  io.Num("rel_l2", t.rel_l2);
  io.Num("cos", t.cos);
  io.Num("b_l2", t.b_l2);
  io.Num("c_l2", t.c_l2);
  io.Num("worst", t.worst);
  io.DriftHist("hist", t.hist, t.has_hist);
}

template <typename Io, typename Row>
void PairFields(Io& io, Row& p) {
  io.Str("experiment", p.experiment);
  io.Str("baseline", p.baseline);
  io.Str("candidate", p.candidate);
  io.Int("step", p.step);
  io.Int("compared", p.compared);
  io.Int("ranks", p.ranks);
  io.Int("tensors_total", p.tensors_total);
  io.Int("drifting", p.drifting);
  io.Loss("loss_b", p.loss_b, p.has_loss_b);
  io.Loss("loss_c", p.loss_c, p.has_loss_c);
  io.Num("loss_rel", p.loss_rel);
  io.LossHist("loss_hist", p.loss_hist);
  io.Object("setup", p.has_setup, [&p](auto& o) {
    o.Int("differences", p.setup_differences);
    o.Str("summary", p.setup_summary);
  });
  io.Object("first_div", p.diverged, [&p](auto& o) {
    o.Int("step", p.first_div_step);
    o.Str("tensor", p.first_div_tensor);
    o.Int("rank", p.first_div_rank);
    o.Str("where", p.first_div_where);
  });
  io.Object("nan_onset", p.has_nan_onset, [&p](auto& o) {
    o.Int("step", p.nan_onset_step);
    o.Str("tensor", p.nan_onset_tensor);
    o.Str("kind", p.nan_onset_kind);
  });
  io.Rows("tensors", p.tensors, [](auto& o, auto& t) { TensorFields(o, t); });
}

template <typename Io, typename Row>
void AlertFields(Io& io, Row& a) {
  io.Int("t", a.unix_ms);
  io.Str("sev", a.severity);
  io.Str("rule", a.rule);
  io.Str("experiment", a.experiment);
  io.StrList("runs", a.runs);
  io.Int("step", a.step);
  io.Str("tensor", a.tensor);
  io.Str("msg", a.message);
}

// Everything but "v", which the reader checks first.
template <typename Io, typename Snap>
void SnapshotFields(Io& io, Snap& s) {
  bool collector = true;  // always written; read when present
  io.Int("t", s.unix_ms);
  io.Object("collector", collector, [&s](auto& o) {
    o.Int("records", s.records);
    o.Int("bad", s.bad);
    o.Int("analyzer_errors", s.analyzer_errors);
  });
  io.Rows("runs", s.runs, [](auto& o, auto& r) { RunFields(o, r); });
  io.Rows("pairs", s.pairs, [](auto& o, auto& p) { PairFields(o, p); });
  bool alerts = true;
  io.Object("alerts", alerts, [&s](auto& o) {
    o.Int("total", s.alerts_total);
    o.Int("info", s.alerts_info);
    o.Int("warning", s.alerts_warning);
    o.Int("critical", s.alerts_critical);
    o.Rows("recent", s.alerts, [](auto& r, auto& a) { AlertFields(r, a); });
  });
}

}  // namespace

std::string WriteSnapshotJson(const Snapshot& s) {
  json out = json::object();
  out["v"] = kFeedVersion;
  Writer w(&out);
  SnapshotFields(w, s);
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

StatusOr<Snapshot> ReadSnapshotJson(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument(
        "the view feed sent something that is not JSON; is this a lockstep collector?");
  }
  if (I(j, "v") != kFeedVersion) {
    return Status::InvalidArgument(
        "the view feed speaks version " + std::to_string(I(j, "v")) +
        ", this lockstep top reads version 1; use the same lockstep version");
  }
  Snapshot s;
  try {
    Reader r(j);
    SnapshotFields(r, s);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("the view feed's snapshot is malformed (") +
                                   e.what() +
                                   "); use the same lockstep version for collect and top");
  }
  return s;
}

}  // namespace lockstep::collector::view
