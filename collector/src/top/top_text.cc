#include "top/top_text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "view/snapshot_json.h"

namespace lockstep::collector::view {
namespace {

std::string PadCols(std::string s, size_t w) {
  const size_t n = Cols(s);
  if (n > w) return ClipCols(s, w);
  s.append(w - n, ' ');
  return s;
}
std::string Right(const std::string& s, size_t w) {
  const size_t n = Cols(s);
  return n >= w ? s : std::string(w - n, ' ') + s;
}
const char* RoleShort(const std::string& role) {
  if (role == "baseline") return "base";
  if (role == "candidate") return "cand";
  if (role == "solo") return "solo";
  return role.empty() ? "?" : role.c_str();
}
std::string ClockText(int64_t unix_ms) {
  std::time_t tt = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  localtime_r(&tt, &tm);
  char ts[16];
  std::strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
  return ts;
}

}  // namespace

// Display columns of a UTF-8 string (every code point one column: ours are).
size_t Cols(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}
// The first `w` columns.
std::string ClipCols(const std::string& s, size_t w) {
  size_t n = 0, i = 0;
  for (; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {
      if (n == w) break;
      ++n;
    }
  }
  return s.substr(0, i);
}

StatusOr<Snapshot> ParseSnapshot(std::string_view text) {
  auto read = ReadSnapshotJson(text);
  if (!read.ok()) return read.status();
  Snapshot& s = *read;
  // Display order: what is running first (an 80x24 screen shows only a few runs).
  auto ended = [&s](const std::string& run) {
    for (const RunRow& r : s.runs) {
      if (r.run == run) return r.ended;
    }
    return true;
  };
  for (PairRow& p : s.pairs) p.active = !ended(p.baseline) || !ended(p.candidate);
  std::string baselines;
  for (const RunRow& r : s.runs) {
    if (r.role == "baseline") baselines += (baselines.empty() ? "'" : ", '") + r.experiment + "' (" + r.run + ")";
  }
  for (const RunRow& r : s.runs) {
    if (r.role != "candidate" || r.ended) continue;
    bool has_baseline = false;
    for (const RunRow& b : s.runs) has_baseline = has_baseline || (b.role == "baseline" && b.experiment == r.experiment);
    if (has_baseline) continue;
    s.unpaired.push_back("candidate " + r.run + " is not paired: no baseline of experiment '" + r.experiment + "'" +
                         (baselines.empty() ? std::string(" yet") : "; baselines: " + baselines));
  }
  std::stable_sort(s.pairs.begin(), s.pairs.end(),
                   [](const PairRow& a, const PairRow& b) { return a.active > b.active; });
  auto rank = [&s](const RunRow& r) {
    int pair_pos = static_cast<int>(s.pairs.size());
    for (size_t i = 0; i < s.pairs.size(); ++i) {
      if (s.pairs[i].baseline == r.run || s.pairs[i].candidate == r.run) {
        pair_pos = static_cast<int>(i);
        break;
      }
    }
    const bool paired = pair_pos < static_cast<int>(s.pairs.size());
    const int group = r.ended ? (paired ? 2 : 3) : (paired ? 0 : 1);
    return group * 1'000'000 + (paired ? pair_pos : 0);
  };
  std::stable_sort(s.runs.begin(), s.runs.end(), [&](const RunRow& a, const RunRow& b) { return rank(a) < rank(b); });
  return read;
}

bool AlertOfPair(const AlertRow& a, const PairRow& p) {
  for (const std::string& r : a.runs) {
    if (r == p.baseline || r == p.candidate) return true;
  }
  return false;
}

std::string AlertLabel(const AlertRow& a) {
  std::string l;
  for (const std::string& r : a.runs) l += (l.empty() ? "" : "/") + r;
  return l.empty() ? a.experiment : l;
}

std::string FormatNum(double v, int width) {
  if (!std::isfinite(v)) return std::isnan(v) ? "-" : (v > 0 ? "inf" : "-inf");
  // JSON has no Inf: the view model sends a non-finite drift (NaN/Inf on one side) as 1e30.
  if (std::fabs(v) >= 1e29) return v > 0 ? "inf" : "-inf";
  if (v == 0) return "0";
  const double a = std::fabs(v);
  const size_t w = static_cast<size_t>(std::max(width, 3));
  char buf[64];
  std::string s;
  if (a >= 1e-3 && a < 1e5) {
    // Fewer significant digits until it fits; never cut a number's tail off.
    for (int prec = 5; prec >= 1; --prec) {
      std::snprintf(buf, sizeof(buf), "%.*g", prec, v);
      s = buf;
      if (s.size() <= w) return s;
    }
  }
  for (int prec = 2; prec >= 0; --prec) {
    std::snprintf(buf, sizeof(buf), "%.*e", prec, v);
    // "7.8e-03" -> "7.8e-3": a short exponent, so narrow columns keep it whole.
    s = buf;
    const size_t e = s.find('e');
    std::string mant = s.substr(0, e), ex = s.substr(e + 1);
    const bool neg = ex[0] == '-';
    size_t i = (ex[0] == '-' || ex[0] == '+') ? 1 : 0;
    while (i + 1 < ex.size() && ex[i] == '0') ++i;
    s = mant + "e" + (neg ? "-" : "") + ex.substr(i);
    if (s.size() <= w) return s;
  }
  return s;
}

std::string FormatLoss(double v, bool given, int width) {
  if (!given) return "-";
  if (std::isnan(v)) return "NaN";
  return FormatNum(v, width);
}

std::string ComparedText(uint64_t compared, uint64_t ranks, bool unicode) {
  const std::string n = std::to_string(compared);
  if (ranks == 0) return n;
  if (ranks == 1) return n + (compared == 1 ? " step" : " steps");
  const std::string r = std::to_string(ranks) + " ranks";
  if (compared % ranks == 0) return std::to_string(compared / ranks) + " steps " + (unicode ? "\u00d7 " : "x ") + r;
  return n + " rank-steps over " + r;
}

std::string FormatSeconds(double s) {
  if (!std::isfinite(s) || s < 0) return "-";
  char buf[32];
  if (s < 0.01) {
    std::snprintf(buf, sizeof(buf), "%.2fms", s * 1e3);
  } else if (s < 0.1) {
    std::snprintf(buf, sizeof(buf), "%.1fms", s * 1e3);
  } else if (s < 0.9995) {
    std::snprintf(buf, sizeof(buf), "%.0fms", s * 1e3);
  } else if (s < 10) {
    std::snprintf(buf, sizeof(buf), "%.2fs", s);
  } else if (s < 100) {
    std::snprintf(buf, sizeof(buf), "%.1fs", s);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0fs", s);
  }
  return buf;
}

std::string ShortName(const std::string& name, size_t w, bool unicode) {
  if (Cols(name) <= w) return name;
  const std::string ell = unicode ? "\u2026" : "~";
  if (w <= 1) return ClipCols(name, w);
  // The last w-1 columns, not starting inside a UTF-8 sequence.
  size_t start = name.size(), cols = 0;
  while (start > 0 && cols < w - 1) {
    --start;
    while (start > 0 && (static_cast<unsigned char>(name[start]) & 0xC0) == 0x80) --start;
    ++cols;
  }
  std::string tail = name.substr(start);
  // Start at a component boundary when one is in view: "…11.mlp.fc2", not "…s.11.mlp.fc2".
  const size_t dot = tail.find('.');
  if (dot != std::string::npos && dot + 1 < tail.size()) tail = tail.substr(dot + 1);
  return ell + tail;
}

size_t TensorNameWidth(int width) { return static_cast<size_t>(std::clamp(width - 53, 12, 60)); }

// ">" or " ", NAME, KIND (10: "param_grad" whole), DRIFT, REL_L2, COSINE, FIRST, STATUS.
std::string TensorHeader(size_t name_w) {
  return PadCols("NAME", name_w) + " KIND        DRIFT   REL_L2  COSINE FIRST STATUS";
}

std::string TensorLine(const TensorRow& t, size_t name_w, bool unicode) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), " %-10s %6s %8s %7s %5s %s", t.kind.c_str(), FormatNum(t.ratio, 6).c_str(),
                FormatNum(t.rel_l2, 8).c_str(), FormatNum(t.cos, 7).c_str(),
                t.first >= 0 ? std::to_string(t.first).c_str() : "-", t.status.c_str());
  return PadCols(ShortName(t.name, name_w, unicode), name_w) + buf;
}

// PLAT only from 90 columns: at 80 the run's name needs the room more.
bool RunShowsPlatform(int width) { return width >= 90; }
size_t RunNameWidth(int width) {
  return static_cast<size_t>(std::clamp(width - (RunShowsPlatform(width) ? 70 : 64), 10, 40));
}

std::string RunHeader(size_t name_w, bool platform) {
  return PadCols("RUN", name_w) + " ROLE" + (platform ? " PLAT " : "") +
         " RANKS    STEP STEP/S  LAG DROPS GAPS  SEEN STEP_T     LOSS";
}

std::string RunLine(const RunRow& r, size_t name_w, bool platform, bool unicode) {
  char plat[16] = "";
  if (platform) std::snprintf(plat, sizeof(plat), " %-5.5s", r.platform.c_str());
  char buf[200];
  std::snprintf(buf, sizeof(buf), " %-4.4s%s %2u/%-2u %7s %6s %4s %5llu %4llu %5s %6s %8s", RoleShort(r.role),
                plat, r.ranks, r.world, r.step >= 0 ? std::to_string(r.step).c_str() : "-",
                FormatNum(r.sps, 6).c_str(), r.has_lag ? std::to_string(r.lag).c_str() : "-",
                (unsigned long long)r.drops, (unsigned long long)r.gaps,
                r.ended ? "ended" : FormatAge(r.last_seen_s).c_str(), FormatSeconds(r.step_time_s).c_str(),
                FormatLoss(r.loss, r.has_loss).c_str());
  return PadCols(ShortName(r.run, name_w, unicode), name_w) + buf;
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
  auto line = [&out](const std::string& l) { out += l + "\n"; };
  // One alert count, here; the sections below list alerts per pair.
  line("lockstep top  alerts " + std::to_string(s.alerts_total) + " (" + std::to_string(s.alerts_critical) +
       " critical)  records " + std::to_string(s.records) + "  bad " + std::to_string(s.bad) + "  " + endpoint);
  line("");
  line("RUNS");
  const size_t run_w = RunNameWidth(width);
  const bool plat = RunShowsPlatform(width);
  line(RunHeader(run_w, plat));
  for (const RunRow& r : s.runs) line(RunLine(r, run_w, plat, unicode));
  for (const std::string& u : s.unpaired) {
    // Wrapped, not clipped: the experiments it names are the point.
    std::string rest = "! " + u;
    const size_t w = static_cast<size_t>(width);
    while (Cols(rest) > w) {
      size_t cut = rest.rfind(' ', w);
      if (cut == std::string::npos || cut <= 2) cut = w;
      line(rest.substr(0, cut));
      rest = "   " + rest.substr(cut + (rest[cut] == ' ' ? 1 : 0));
    }
    line(rest);
  }
  auto alert_line = [&](const AlertRow& a, bool label) {
    return " " + ClockText(a.unix_ms) + " " + a.severity + " " + (label ? "[" + AlertLabel(a) + "] " : std::string()) +
           a.rule + " step " + std::to_string(a.step) +
           // Most messages begin with the tensor's name already.
           (a.tensor.empty() || a.message.rfind(a.tensor, 0) == 0 ? "" : " " + a.tensor) + ": " + a.message;
  };
  const size_t tw = TensorNameWidth(width);
  for (const PairRow& p : s.pairs) {
    line("");
    line("PAIR " + p.experiment + ": " + p.baseline + " vs " + p.candidate + "  step " + std::to_string(p.step) +
         "  compared " + ComparedText(p.compared, p.ranks, unicode) + (p.active ? "" : "  (ended)"));
    std::vector<double> rel;
    for (const LossPoint& lp : p.loss_hist) {
      rel.push_back(std::isfinite(lp.b) && std::isfinite(lp.c) ? std::fabs(lp.c - lp.b) / std::max(std::fabs(lp.b), 1e-12)
                                                               : std::nan(""));
    }
    const std::string l = " loss baseline " + FormatLoss(p.loss_b, p.has_loss_b) + "  candidate " +
                          FormatLoss(p.loss_c, p.has_loss_c) + "  rel diff " + FormatNum(p.loss_rel) + "  ";
    line(l + Sparkline(rel, std::max(8, width - static_cast<int>(Cols(l)) - 1), unicode));
    if (p.setup_differences > 0) {
      line(" setup: " + p.setup_summary);
    } else if (p.setup_differences == 0) {
      line(" setup: the same");
    }
    if (p.has_nan_onset) {
      line(" first NaN/Inf: step " + std::to_string(p.nan_onset_step) + " in " + p.nan_onset_tensor + " (" +
           p.nan_onset_kind + ")");
    }
    if (p.diverged)
      line(" first divergence: step " + std::to_string(p.first_div_step) + p.FirstDivWhere() + " at " + p.first_div_tensor);
    line(" TENSORS (" + std::to_string(p.drifting) + " of " + std::to_string(p.tensors_total) + " drifting now)");
    line(" " + TensorHeader(tw));
    size_t shown = 0;
    for (const TensorRow& t : p.tensors) {
      if (++shown > 10) break;
      line(" " + TensorLine(t, tw, unicode));
    }
    line(" ALERTS of this pair");
    shown = 0;
    for (const AlertRow& a : s.alerts) {
      if (!AlertOfPair(a, p)) continue;
      if (++shown > 6) break;
      line(alert_line(a, false));
    }
    if (shown == 0) line(" (none)");
  }
  // Alerts of no pair (solo runs, the collector itself), labelled with their runs.
  std::vector<const AlertRow*> other;
  for (const AlertRow& a : s.alerts) {
    bool paired = false;
    for (const PairRow& p : s.pairs) paired = paired || AlertOfPair(a, p);
    if (!paired) other.push_back(&a);
  }
  if (!other.empty() || s.pairs.empty()) {
    line("");
    line(s.pairs.empty() ? "ALERTS" : "ALERTS of no pair");
    size_t shown = 0;
    for (const AlertRow* a : other) {
      if (++shown > 8) break;
      line(alert_line(*a, true));
    }
    if (other.empty()) line(" (none)");
  }
  // Every line within the width.
  std::string clipped;
  size_t pos = 0;
  while (pos < out.size()) {
    const size_t nl = out.find('\n', pos);
    clipped += ClipCols(out.substr(pos, nl - pos), static_cast<size_t>(width)) + "\n";
    pos = nl + 1;
  }
  return clipped;
}

}  // namespace lockstep::collector::view
