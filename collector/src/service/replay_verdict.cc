#include "service/replay_verdict.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "lockstep/common/wire.h"

namespace lockstep::collector {
namespace {

// Mantissa bits of a dtype as the agent names it (agent/python/lockstep/_replay_op.py
// MANTISSA); an unknown one counts as float32.
int Mantissa(const std::string& dtype) {
  static const std::map<std::string, int> kBits = {{"float64", 52}, {"float32", 23},      {"float16", 10},
                                                   {"bfloat16", 7}, {"float8_e4m3fn", 3}, {"float8_e5m2", 2}};
  auto it = kBits.find(dtype);
  return it == kBits.end() ? 23 : it->second;
}

std::string G3(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

// "key: A (baseline) vs B (candidate)" for each setting that differs, as replay says it.
std::vector<std::string> Diff(const std::vector<std::pair<std::string, std::string>>& b,
                              const std::vector<std::pair<std::string, std::string>>& c) {
  std::map<std::string, std::pair<std::string, std::string>> all;
  for (const auto& [k, v] : b) all[k].first = v;
  for (const auto& [k, v] : c) all[k].second = v;
  std::vector<std::string> out;
  for (const auto& [k, vs] : all) {
    if (vs.first == vs.second) continue;
    out.push_back(k + ": " + (vs.first.empty() ? "<unset>" : vs.first) + " (baseline) vs " +
                  (vs.second.empty() ? "<unset>" : vs.second) + " (candidate)");
  }
  return out;
}

std::string Join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

}  // namespace

ReplayVerdict JudgeReplays(const ReplayCase& rc) {
  ReplayVerdict v;
  const std::string command = "python -m lockstep replay " + rc.file_b + " " + rc.file_c;
  auto needs_both = [&](const std::string& why) {
    v.verdict = "needs_both_files";
    v.message = why + ": the verdict needs both files: " + command;
    return v;
  };
  if (!rc.b || !rc.c) {
    const std::string run = !rc.b ? rc.baseline : rc.candidate;
    return needs_both("run " + run + " did not replay its capture" +
                      (rc.why_missing.empty() ? "" : " (" + rc.why_missing + ")"));
  }
  const SelfReplayResult& b = *rc.b;
  const SelfReplayResult& c = *rc.c;
  if (!b.error.empty() || !c.error.empty()) {
    const bool base = !b.error.empty();
    return needs_both("run " + (base ? rc.baseline : rc.candidate) + " could not replay its capture on its host (" +
                      (base ? b.error : c.error) + ")");
  }
  // (a) different functions: the settings replay compares differ.
  if (b.settings_digest != c.settings_digest) {
    std::vector<std::string> diffs = Diff(b.settings, c.settings);
    v.verdict = "different_functions";
    v.cause = "config";
    v.message = "the two runs compute different functions: " +
                (diffs.empty() ? std::string("their settings differ") : Join(diffs, "; ")) + ": cause config";
    return v;
  }
  // Both errors in ULPs of the finer of the two runs' coarsest dtypes (replay's pair
  // dtype): a run's own ULPs scale by 2^(mantissa difference).
  const bool b_finer = Mantissa(b.coarsest) >= Mantissa(c.coarsest);
  v.pair_dtype = b_finer ? b.coarsest : c.coarsest;
  const int m_pair = Mantissa(v.pair_dtype);
  v.ulps_b = std::ldexp(b.ulps, m_pair - Mantissa(b.dtype));
  v.ulps_c = std::ldexp(c.ulps, m_pair - Mantissa(c.dtype));
  v.budget = kReplayUlps + std::sqrt(static_cast<double>(std::max<uint32_t>(1, b.width)));
  const bool cand_worse = v.ulps_c >= v.ulps_b;
  const double worse = cand_worse ? v.ulps_c : v.ulps_b;
  const double other = cand_worse ? v.ulps_b : v.ulps_c;
  const double k = worse / std::max(other, 0.5);
  const std::string pair = " ULPs of " + v.pair_dtype;
  // (b) one run less accurate than the other and than the pair's dtype explains.
  if (worse > v.budget && k >= kReplayFactor) {
    const SelfReplayResult& w = cand_worse ? c : b;
    const SelfReplayResult& o = cand_worse ? b : c;
    std::vector<std::string> why = Diff(b.precision, c.precision);
    if (w.dtype != o.dtype) why.push_back("it hands on " + w.dtype + ", the other run " + o.dtype);
    v.verdict = "less_accurate";
    v.cause = why.empty() ? "platform" : "precision";
    v.less_accurate = cand_worse ? "candidate" : "baseline";
    const std::string tail = why.empty() ? "; no setting explains it: the platform's kernel is less accurate; report it with " +
                                               w.file
                                         : "; cause precision: " + Join(why, "; ");
    char kx[32];
    std::snprintf(kx, sizeof kx, "%.0f", k);
    v.message = "the " + v.less_accurate + "'s op is less accurate: its error against float64 is " + G3(worse) + pair +
                " (" + G3(w.ulps) + " ULPs of its own " + w.dtype + "), " + kx + "x the " +
                (cand_worse ? "baseline" : "candidate") + "'s (" + G3(other) + "), beyond the " + G3(v.budget) +
                " its dtype explains" + tail;
    return v;
  }
  if (worse > v.budget) {
    v.verdict = "inconclusive";
    v.message = "both runs are off float64 by more than " + v.pair_dtype + " explains (" + G3(v.ulps_b) + " and " +
                G3(v.ulps_c) + " ULPs, budget " + G3(v.budget) + "), neither " + G3(kReplayFactor) +
                "x the other: the op is inaccurate in both, or this dtype budget is too small for it (--ulps of " +
                command + ")";
    return v;
  }
  const std::string accurate = "(" + G3(v.ulps_b) + " and " + G3(v.ulps_c) + pair + ", budget " + G3(v.budget) + ")";
  if (b.inputs_digest != c.inputs_digest) {
    v.verdict = "needs_both_files";
    v.message = "the op is accurate in both runs " + accurate +
                " and its inputs differ: whether its output's difference is born in the op or comes with its inputs "
                "needs both files: " +
                command;
    return v;
  }
  if (b.output_digest == c.output_digest) {
    v.verdict = "identical";
    v.message = "the two runs' inputs and outputs are bit-identical: nothing is born here";
    return v;
  }
  v.verdict = "within_rounding";
  v.message = "both runs are within rounding of float64 " + accurate +
              " on bit-identical inputs, so the birth-point budget took rounding for an error of the op: raise "
              "birth-ulps (--birth-ulps of lockstep collect and compare, birth-ulps in the settings file's [rules]); "
              "by how much: " +
              command;
  return v;
}

std::string CaptureMessage(const ReplayCase& rc, uint16_t minor_b, uint16_t minor_c) {
  const uint16_t older = std::min(minor_b, minor_c);
  return "captured " + rc.row + " at step " + std::to_string(rc.step) + " in runs " + rc.baseline + " and " +
         rc.candidate + ": " + rc.file_b + " and " + rc.file_c +
         (older < kSelfReplayMinor ? "; run " + (minor_b < kSelfReplayMinor ? rc.baseline : rc.candidate) +
                                         "'s agent does not replay its own capture (schema minor " +
                                         std::to_string(older) + " < " + std::to_string(kSelfReplayMinor) +
                                         "), so the verdict needs both files: "
                                   : "; which run is wrong: ") +
         "python -m lockstep replay " + rc.file_b + " " + rc.file_c;
}

alerting::Alert OpInfoAlert(const ReplayCase& rc, const char* rule) {
  alerting::Alert a;
  a.rule = rule;
  a.severity = alerting::Severity::kInfo;
  a.experiment = rc.experiment;
  a.runs = {rc.baseline, rc.candidate};
  a.step = rc.step;
  a.tensor = rc.row;
  a.kind = "act";
  return a;
}

alerting::Alert ReplayAlert(const ReplayCase& rc, const ReplayVerdict& v, int64_t now_unix_ns) {
  alerting::Alert a = OpInfoAlert(rc, "replay");
  a.metric = v.verdict;
  a.cause = v.cause;
  a.baseline_value = v.ulps_b;
  a.candidate_value = v.ulps_c;
  a.error = std::max(v.ulps_b, v.ulps_c);
  a.threshold = v.budget;
  a.message = "replayed " + rc.row + " at step " + std::to_string(rc.step) + " in float64 on each run's host: " +
              v.verdict + (v.cause.empty() ? "" : " (cause " + v.cause + ")") + ": " + v.message;
  a.first_seen_unix_ns = now_unix_ns;
  a.id = a.DedupKey() + "@" + std::to_string(rc.step);
  return a;
}

std::vector<ReplayCase> PairReplays(const LogScan& base, const LogScan& cand, const std::string& experiment,
                                    const std::string& baseline, const std::string& candidate) {
  // The latest answer of each (row, step): an agent answers once, a log may repeat it.
  auto latest = [](const LogScan& s) {
    std::map<std::pair<std::string, uint64_t>, const LogScan::Replay*> out;
    for (const LogScan::Replay& r : s.replays) out[{r.result.row, r.step}] = &r;
    return out;
  };
  const auto b = latest(base);
  const auto c = latest(cand);
  std::vector<std::pair<int64_t, ReplayCase>> found;
  for (const auto& [key, rb] : b) {
    auto it = c.find(key);
    if (it == c.end()) continue;
    ReplayCase rc;
    rc.experiment = experiment;
    rc.baseline = baseline;
    rc.candidate = candidate;
    rc.row = key.first;
    rc.step = key.second;
    rc.file_b = rb->result.file;
    rc.file_c = it->second->result.file;
    rc.b = rb->result;
    rc.c = it->second->result;
    rc.answered_unix_ns = std::max(rb->sent_unix_ns, it->second->sent_unix_ns);
    found.emplace_back(rc.answered_unix_ns, std::move(rc));
  }
  std::stable_sort(found.begin(), found.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<ReplayCase> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

}  // namespace lockstep::collector
