#include "view/snapshot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

namespace lockstep::collector::view {
namespace {

using nlohmann::json;

double D(const json& j, const char* k) {
  auto it = j.find(k);
  return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
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
double At(const json& a, size_t i) { return i < a.size() && a[i].is_number() ? a[i].get<double>() : std::nan(""); }

std::string Clip(const std::string& s, size_t w) {
  if (s.size() <= w) return s;
  if (w <= 1) return s.substr(0, w);
  // Keep the end of a tensor name: "...layers.11.mlp.fc2" says more than its start.
  return "~" + s.substr(s.size() - (w - 1));
}

std::string ClipEnd(const std::string& s, size_t w) { return s.size() <= w ? s : s.substr(0, w); }

std::string Pad(const std::string& s, size_t w) {
  std::string c = Clip(s, w);
  c.resize(w, ' ');
  return c;
}

}  // namespace

StatusOr<Snapshot> ParseSnapshot(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument("the view feed sent something that is not JSON; is this a lockstep collector?");
  }
  if (I(j, "v") != 1) {
    return Status::InvalidArgument("the view feed speaks version " + std::to_string(I(j, "v")) +
                                   ", this lockstep top reads version 1; use the same lockstep version");
  }
  Snapshot s;
  try {
    s.unix_ms = I(j, "t");
    if (auto c = j.find("collector"); c != j.end() && c->is_object()) {
      s.records = U(*c, "records");
      s.bad = U(*c, "bad");
    }
    for (const json& r : j.value("runs", json::array())) {
      RunRow row;
      row.run = S(r, "run");
      row.role = S(r, "role");
      row.platform = S(r, "platform");
      row.device = S(r, "device");
      row.experiment = S(r, "experiment");
      row.ranks = static_cast<uint32_t>(U(r, "ranks"));
      row.world = static_cast<uint32_t>(U(r, "world"));
      row.step = I(r, "step", -1);
      row.has_lag = r.contains("lag") && r["lag"].is_number();
      row.lag = I(r, "lag");
      row.ended = r.value("ended", false);
      row.sps = D(r, "sps");
      row.loss = D(r, "loss");
      row.step_time_s = D(r, "step_time_s");
      row.last_seen_s = D(r, "last_seen_s");
      row.drops = U(r, "drops");
      row.gaps = U(r, "gaps");
      row.bad = U(r, "bad");
      s.runs.push_back(std::move(row));
    }
    for (const json& p : j.value("pairs", json::array())) {
      PairRow pr;
      pr.experiment = S(p, "experiment");
      pr.baseline = S(p, "baseline");
      pr.candidate = S(p, "candidate");
      pr.step = I(p, "step");
      pr.compared = U(p, "compared");
      pr.tensors_total = U(p, "tensors_total");
      pr.drifting = U(p, "drifting");
      pr.loss_b = D(p, "loss_b");
      pr.loss_c = D(p, "loss_c");
      pr.loss_rel = D(p, "loss_rel");
      for (const json& h : p.value("loss_hist", json::array())) {
        if (h.is_array()) pr.loss_hist.push_back({static_cast<int64_t>(At(h, 0)), At(h, 1), At(h, 2)});
      }
      if (auto f = p.find("setup"); f != p.end() && f->is_object()) {
        pr.setup_differences = I(*f, "differences");
        pr.setup_summary = S(*f, "summary");
      }
      if (auto f = p.find("first_div"); f != p.end() && f->is_object()) {
        pr.diverged = true;
        pr.first_div_step = I(*f, "step");
        pr.first_div_tensor = S(*f, "tensor");
      }
      for (const json& t : p.value("tensors", json::array())) {
        TensorRow tr;
        tr.name = S(t, "name");
        tr.kind = S(t, "kind");
        tr.metric = S(t, "metric");
        tr.status = S(t, "status");
        tr.order = static_cast<uint32_t>(U(t, "order"));
        tr.step = I(t, "step");
        tr.first = I(t, "first", -1);
        tr.ratio = D(t, "ratio");
        tr.score = D(t, "score");
        tr.rel_l2 = D(t, "rel_l2");
        tr.cos = D(t, "cos");
        tr.b_l2 = D(t, "b_l2");
        tr.c_l2 = D(t, "c_l2");
        tr.worst = D(t, "worst");
        if (auto h = t.find("hist"); h != t.end() && h->is_array()) {
          tr.has_hist = true;
          for (const json& q : *h) {
            if (q.is_array()) tr.hist.push_back({static_cast<int64_t>(At(q, 0)), At(q, 1), At(q, 2), At(q, 3)});
          }
        }
        pr.tensors.push_back(std::move(tr));
      }
      s.pairs.push_back(std::move(pr));
    }
    if (auto a = j.find("alerts"); a != j.end() && a->is_object()) {
      s.alerts_total = U(*a, "total");
      s.alerts_info = U(*a, "info");
      s.alerts_warning = U(*a, "warning");
      s.alerts_critical = U(*a, "critical");
      for (const json& r : a->value("recent", json::array())) {
        AlertRow ar;
        ar.unix_ms = I(r, "t");
        ar.step = I(r, "step");
        ar.severity = S(r, "sev");
        ar.rule = S(r, "rule");
        ar.experiment = S(r, "experiment");
        ar.tensor = S(r, "tensor");
        ar.message = S(r, "msg");
        for (const json& x : r.value("runs", json::array())) {
          if (x.is_string()) ar.runs.push_back(x.get<std::string>());
        }
        s.alerts.push_back(std::move(ar));
      }
    }
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("the view feed's snapshot is malformed (") + e.what() +
                                   "); use the same lockstep version for collect and top");
  }
  return s;
}

std::string FormatNum(double v, int width) {
  if (!std::isfinite(v)) return std::isnan(v) ? "-" : (v > 0 ? "inf" : "-inf");
  // JSON has no Inf: the view model sends a non-finite drift (NaN/Inf on one side) as 1e30.
  if (std::fabs(v) >= 1e29) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const double a = std::fabs(v);
  if (v == 0) {
    return "0";
  } else if (a >= 1e5 || a < 1e-3) {
    std::snprintf(buf, sizeof(buf), "%.*e", width >= 9 ? 2 : 1, v);
  } else if (a >= 100) {
    std::snprintf(buf, sizeof(buf), "%.1f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.4g", v);
  }
  std::string s = buf;
  if (static_cast<int>(s.size()) > width) s.resize(static_cast<size_t>(width));
  return s;
}

std::string Sparkline(const std::vector<double>& values, int width, bool unicode) {
  static const char* kBlocks[] = {"\u2581", "\u2582", "\u2583", "\u2584", "\u2585", "\u2586", "\u2587", "\u2588"};
  static const char kAscii[] = "_.-:=+*#";
  if (width <= 0 || values.empty()) return "";
  const size_t n = std::min(values.size(), static_cast<size_t>(width));
  const size_t start = values.size() - n;
  double lo = INFINITY, hi = -INFINITY;
  for (size_t i = start; i < values.size(); ++i) {
    if (std::isfinite(values[i])) {
      lo = std::min(lo, values[i]);
      hi = std::max(hi, values[i]);
    }
  }
  std::string out;
  for (size_t i = start; i < values.size(); ++i) {
    const double v = values[i];
    if (!std::isfinite(v)) {
      out += ' ';
      continue;
    }
    int level = hi > lo ? static_cast<int>(std::lround((v - lo) / (hi - lo) * 7)) : 0;
    level = std::clamp(level, 0, 7);
    if (unicode) {
      out += kBlocks[level];
    } else {
      out += kAscii[level];
    }
  }
  return out;
}

std::string FormatAge(double s) {
  if (!std::isfinite(s)) return "-";
  char buf[32];
  if (s < 10) {
    std::snprintf(buf, sizeof(buf), "%.1fs", s);
  } else if (s < 120) {
    std::snprintf(buf, sizeof(buf), "%.0fs", s);
  } else if (s < 7200) {
    std::snprintf(buf, sizeof(buf), "%.0fm", s / 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0fh", s / 3600);
  }
  return buf;
}

std::string FormatPlain(const Snapshot& s, const std::string& endpoint, int width, bool unicode) {
  width = std::max(width, 60);
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "lockstep top  %s  records %llu  bad %llu  alerts %llu (%llu critical)\n",
                endpoint.c_str(), (unsigned long long)s.records, (unsigned long long)s.bad,
                (unsigned long long)s.alerts_total, (unsigned long long)s.alerts_critical);
  out += line;
  out += "\nRUNS\n";
  const size_t name_w = static_cast<size_t>(std::clamp(width - 72, 12, 40));
  out += Pad("run", name_w) + " role      platform ranks     step steps/s  lag drops gaps  seen step_t\n";
  for (const RunRow& r : s.runs) {
    std::snprintf(line, sizeof(line), " %-9.9s %-8.8s %2u/%-2u %8s %7s %4s %5llu %4llu %5s %6s\n", r.role.c_str(),
                  r.platform.c_str(), r.ranks, r.world, r.step >= 0 ? std::to_string(r.step).c_str() : "-",
                  FormatNum(r.sps, 7).c_str(), r.has_lag ? std::to_string(r.lag).c_str() : "-",
                  (unsigned long long)r.drops, (unsigned long long)r.gaps,
                  r.ended ? "ended" : FormatAge(r.last_seen_s).c_str(), FormatNum(r.step_time_s, 6).c_str());
    out += Pad(r.run, name_w) + line;
  }
  for (const PairRow& p : s.pairs) {
    std::snprintf(line, sizeof(line), "\nPAIR %s: %s vs %s  step %lld  compared %llu\n", p.experiment.c_str(),
                  p.baseline.c_str(), p.candidate.c_str(), (long long)p.step, (unsigned long long)p.compared);
    out += line;
    std::vector<double> rel;
    for (const LossPoint& lp : p.loss_hist) {
      rel.push_back(std::isfinite(lp.b) && std::isfinite(lp.c) ? std::fabs(lp.c - lp.b) / std::max(std::fabs(lp.b), 1e-12)
                                                               : std::nan(""));
    }
    std::snprintf(line, sizeof(line), "  loss baseline %s  candidate %s  rel diff %s  ", FormatNum(p.loss_b).c_str(),
                  FormatNum(p.loss_c).c_str(), FormatNum(p.loss_rel).c_str());
    out += line;
    const int spark_w = std::max(8, width - static_cast<int>(std::string(line).size()) - 1);
    out += Sparkline(rel, spark_w, unicode) + "\n";
    if (p.setup_differences > 0) {
      out += "  setup: " + p.setup_summary + "\n";
    } else if (p.setup_differences == 0) {
      out += "  setup: the same\n";
    }
    if (p.diverged) {
      std::snprintf(line, sizeof(line), "  first divergence: step %lld at %s\n", (long long)p.first_div_step,
                    p.first_div_tensor.c_str());
      out += line;
    }
    std::snprintf(line, sizeof(line), "  TOP DRIFTING (%llu of %llu tensors drifting now)\n",
                  (unsigned long long)p.drifting, (unsigned long long)p.tensors_total);
    out += line;
    const size_t tw = static_cast<size_t>(std::max(16, width - 56));
    out += "  " + Pad("tensor", tw) + " kind       drift   rel_l2      cos first status\n";
    size_t shown = 0;
    for (const TensorRow& t : p.tensors) {
      if (++shown > 10) break;
      std::snprintf(line, sizeof(line), " %-9.9s %7s %8s %8s %5s %s\n", t.kind.c_str(), FormatNum(t.ratio, 7).c_str(),
                    FormatNum(t.rel_l2).c_str(), FormatNum(t.cos).c_str(),
                    t.first >= 0 ? std::to_string(t.first).c_str() : "-", t.status.c_str());
      out += "  " + Pad(t.name, tw) + line;
    }
  }
  out += "\nALERTS\n";
  size_t shown = 0;
  for (const AlertRow& a : s.alerts) {
    if (++shown > 8) break;
    std::time_t tt = static_cast<std::time_t>(a.unix_ms / 1000);
    std::tm tm{};
    localtime_r(&tt, &tm);
    char ts[16];
    std::strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
    std::string l = std::string(ts) + " " + a.severity + " " + a.rule + " step " + std::to_string(a.step) +
                    (a.tensor.empty() || a.message.rfind(a.tensor, 0) == 0 ? "" : " " + a.tensor) + ": " + a.message;
    out += "  " + ClipEnd(l, static_cast<size_t>(width - 2)) + "\n";
  }
  if (s.alerts.empty()) out += "  (none)\n";
  return out;
}

}  // namespace lockstep::collector::view
