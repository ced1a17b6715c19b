#include "detect/compare_gate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ingest/control_requests.h"
#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_reader.h"

namespace lockstep::collector {
namespace {

std::string G(double x, const char* fmt = "%.6g") {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, x);
  return buf;
}

std::string Percent(uint64_t a, uint64_t b) {
  if (b == 0) return "-";
  return G(100.0 * static_cast<double>(a) / static_cast<double>(b), "%.0f") + " %";
}

// The first divergence's alert message without its "runs A and B part ways: first
// divergent tensor " preamble (the verdict names the runs once, in its headline).
std::string Tail(const std::string& msg, const std::string& marker) {
  auto at = msg.find(marker);
  return at == std::string::npos ? msg : msg.substr(at + marker.size());
}

}  // namespace

void LogScan::Add(const wire::Envelope& env) {
  if (run_id.empty() && env.run_id()) run_id = env.run_id()->str();
  switch (env.body_type()) {
    case wire::Body::StepStats:
      steps.emplace(env.rank(), env.body_as_StepStats()->step());
      break;
    case wire::Body::StepScalars:
      steps.emplace(env.rank(), env.body_as_StepScalars()->step());
      break;
    case wire::Body::ControlAck:
      if (env.rank() == 0) {
        if (auto r = ControlRequests::SelfReplayOf(*env.body_as_ControlAck())) {
          replays.push_back({env.body_as_ControlAck()->step(), env.sent_unix_ns(), std::move(*r)});
        }
      }
      break;
    case wire::Body::Goodbye:
      goodbye = true;
      goodbye_last_step = std::max<uint64_t>(goodbye_last_step, env.body_as_Goodbye()->last_step());
      break;
    default:
      break;
  }
}

std::string LogScan::InputProblem(const std::string& role) const {
  std::string s;
  if (corrupt || truncated) {
    s = "the " + role + " log '" + path + "' is " + (corrupt ? "corrupt" : "truncated") + " (" + problem +
        "); only the " + std::to_string(records) + " records before it were compared";
  }
  if (unreadable > 0) {
    if (!s.empty()) s += "; ";
    s += std::to_string(unreadable) + " record(s) of the " + role + " log '" + path +
         "' do not hold a readable message and were skipped";
  }
  return s;
}

StatusOr<LogScan> ScanLog(const std::string& path) {
  auto r = LogReader::Open(path);
  if (!r.ok()) return r.status();  // names the path and the reason
  LogScan scan;
  scan.path = path;
  LogReader::Record rec;
  while (true) {
    auto res = (*r)->Next(&rec);
    if (res == LogReader::Result::kRecord) {
      ++scan.records;
      auto env = LogReader::Envelope(rec);
      if (!env.ok()) {
        ++scan.unreadable;
        continue;
      }
      scan.Add(**env);
      continue;
    }
    if (res == LogReader::Result::kCorrupt) scan.corrupt = true;
    if (res == LogReader::Result::kTruncated) scan.truncated = true;
    if (res != LogReader::Result::kEnd) scan.problem = (*r)->problem();
    break;
  }
  scan.thinned = LogReader::DescribeThinning((*r)->thinned());
  return scan;
}

uint64_t ExpectedSteps(const LogScan& base, const LogScan& cand) {
  uint64_t first = UINT64_MAX, last = 0;
  for (const auto& [rank, step] : cand.steps) {
    first = std::min(first, step);
    last = std::max(last, step);
  }
  if (cand.steps.empty()) first = 0;
  const bool whole = cand.goodbye && !cand.corrupt && !cand.truncated;
  if (whole) {
    last = std::max(last, cand.goodbye_last_step);
  } else {
    for (const auto& [rank, step] : base.steps) last = std::max(last, step);
  }
  std::set<std::pair<uint32_t, uint64_t>> all;
  for (const auto* s : {&base, &cand}) {
    for (const auto& rs : s->steps) {
      if (rs.second >= first && rs.second <= last) all.insert(rs);
    }
  }
  return all.size();
}

std::string FirstDivergenceWhere(const alerting::Alert& a, const RankOnsets* onsets) {
  return onsets ? onsets->Where(a.step, a.rank) : "rank " + std::to_string(a.rank);
}

std::string WithWhere(const std::string& message, const alerting::Alert& a, const RankOnsets* onsets) {
  const std::string where = FirstDivergenceWhere(a, onsets);
  const std::string one = "rank " + std::to_string(a.rank);
  const std::string at = "at step " + std::to_string(a.step) + " " + one;
  const auto pos = message.find(at);
  if (where == one || pos == std::string::npos) return message;
  return message.substr(0, pos) + "at step " + std::to_string(a.step) + " on " + where +
         message.substr(pos + at.size());
}

GateVerdict JudgeCompare(const PairReport& r, const LogScan& base, const LogScan& cand,
                         const std::vector<alerting::Alert>& alerts, bool critical) {
  const RankOnsets* onsets = &r.onsets;
  GateVerdict v;
  // Input: a log not read whole.
  std::vector<std::string> bad_input;
  for (const auto& [scan, role] : {std::pair{&base, "baseline"}, std::pair{&cand, "candidate"}}) {
    std::string p = scan->InputProblem(role);
    if (!p.empty()) bad_input.push_back(p);
  }
  // Tensor names: shared, and each side's.
  std::set<std::string> shared, only_b, only_c;
  for (const auto& t : r.tensors) shared.insert(t.name);
  for (const auto& u : r.unmatched) (u.side == "baseline" ? only_b : only_c).insert(u.name);
  std::set<std::string> nb = shared, nc = shared;
  nb.insert(only_b.begin(), only_b.end());
  nc.insert(only_c.begin(), only_c.end());
  v.tensors_shared = shared.size();
  v.tensors_baseline = nb.size();
  v.tensors_candidate = nc.size();
  const uint64_t smaller = std::min(nb.size(), nc.size());
  const bool any_tensors = !nb.empty() || !nc.empty();
  const bool same_model = !any_tensors || (smaller > 0 && static_cast<double>(shared.size()) >=
                                                              kMinTensorsSharedFraction * static_cast<double>(smaller));
  // Steps.
  v.steps_compared = r.steps_compared;
  v.steps_expected = std::max<uint64_t>(ExpectedSteps(base, cand), r.steps_compared);
  const bool enough_steps = v.steps_expected > 0 &&
                            static_cast<double>(v.steps_compared) >=
                                kMinStepsComparedFraction * static_cast<double>(v.steps_expected);

  // A restart without start_step: steps went uncompared because their numbers repeat.
  // Two live processes on one rank: one's data was set apart.
  const alerting::Alert* restart = nullptr;
  const alerting::Alert* duplicate = nullptr;
  for (const auto& a : alerts) {
    if (a.rule == "restart" && restart == nullptr) restart = &a;
    if (a.rule == "duplicate_rank" && duplicate == nullptr) duplicate = &a;
  }
  for (auto& p : bad_input) v.problems.push_back(std::move(p));
  if (restart != nullptr) v.problems.push_back("restart: " + restart->message);
  if (duplicate != nullptr) v.problems.push_back("duplicate_rank: " + duplicate->message);
  if (restart == nullptr) restart = duplicate;  // either is a finding
  if (!same_model) {
    v.problems.push_back("these do not look like the same model: they share " + std::to_string(shared.size()) +
                         " of " + std::to_string(smaller) + " tensor names (under half; a --name-map may be missing)");
  }
  if (!enough_steps) {
    v.problems.push_back("only " + std::to_string(v.steps_compared) + " of " + std::to_string(v.steps_expected) +
                         " expected steps were compared (" + Percent(v.steps_compared, v.steps_expected) +
                         ", under " + G(100 * kMinStepsComparedFraction, "%.0f") + " %)");
  }
  if (!bad_input.empty()) {
    v.outcome = GateOutcome::kBadInput;
  } else if (!same_model) {
    v.outcome = GateOutcome::kNotSameModel;
  } else if (!enough_steps) {
    v.outcome = GateOutcome::kTooFewSteps;
  } else if (critical || restart != nullptr) {
    v.outcome = GateOutcome::kFinding;
  }

  // The headline.
  std::string head;
  if (!v.problems.empty()) {
    for (const auto& p : v.problems) head += (head.empty() ? "" : "; ") + p;
    if (critical) head += "; and a critical finding (below)";
  } else if (critical) {
    const alerting::Alert* first_crit = nullptr;
    for (const auto& a : alerts) {
      if (a.severity == alerting::Severity::kCritical) {
        first_crit = &a;
        break;
      }
    }
    head = "a critical finding between " + r.baseline + " and " + r.candidate;
    // Where the runs part (the birth point, else the earliest drifting tensor) comes
    // first when a later critical alert is not that alert: the culprit, not a tensor
    // downstream of it that crossed the critical line later.
    const alerting::Alert* fd = r.diverged ? &r.first_divergence : nullptr;
    if (fd != nullptr && first_crit != nullptr && first_crit->rule != "first_divergence") {
      head += ": first divergence at " + (fd->tensor.empty() ? std::string("?") : fd->tensor) + " (" + fd->kind +
              ") at step " + std::to_string(fd->step);
      if (r.ranks > 1) {
        head += onsets ? " on " + FirstDivergenceWhere(*fd, onsets) : " rank " + std::to_string(fd->rank);
      }
      head += "; first critical";
    }
    if (first_crit) {
      head += ": " + first_crit->rule;
      if (!first_crit->tensor.empty()) head += " of " + first_crit->tensor + " (" + first_crit->kind + ")";
      head += " at step " + std::to_string(first_crit->step);
      if (r.ranks > 1) {
        head += first_crit->rule == "first_divergence" && onsets
                    ? " on " + FirstDivergenceWhere(*first_crit, onsets)
                    : " rank " + std::to_string(first_crit->rank);
      }
    }
  } else {
    head = r.baseline + " and " + r.candidate + " agree within their tolerances";
  }
  v.lines.push_back(head);

  // First divergence and its cause: the op where the error is born, else the earliest
  // tensor in execution order that drifts.
  if (r.diverged) {
    const auto& a = r.first_divergence;
    v.lines.push_back("first divergence (" + std::string(alerting::SeverityName(a.severity)) +
                      "): " + Tail(Tail(WithWhere(a.message, a, onsets), "first divergent tensor "),
                                   "the error is born in "));
  } else {
    v.lines.push_back("first divergence: none (no tensor drifted beyond its tolerance, no op added error of its own)");
  }
  // First NaN/Inf and the tensor that produced it (the earliest non-finite in order).
  const alerting::Alert* nf = nullptr;
  for (const auto& a : alerts) {
    if (a.rule == "nonfinite" && (nf == nullptr || a.step < nf->step)) nf = &a;
  }
  if (nf == nullptr) {
    v.lines.push_back("first NaN/Inf: none");
  } else if (const std::string marker = ": first NaN/Inf in "; nf->message.find(marker) != std::string::npos) {
    v.lines.push_back("first NaN/Inf: step " + std::to_string(nf->step) + " rank " + std::to_string(nf->rank) +
                      " in " + (nf->runs.empty() ? std::string("?") : nf->runs.back()) + ", produced by " +
                      Tail(nf->message, marker));
  } else {
    v.lines.push_back("first NaN/Inf: " + nf->message);
  }
  // Loss gap.
  // "-" is a run that gave no loss; a NaN the job gave is spelt NaN (G).
  auto loss = [](double x, bool given) { return given ? G(x) : std::string("-"); };
  if (!r.loss_b_given && !r.loss_c_given) {
    v.lines.push_back("loss: not recorded at the compared steps");
  } else {
    std::string gap;
    if (std::isfinite(r.loss_b) && std::isfinite(r.loss_c)) {
      const double d = std::fabs(r.loss_c - r.loss_b);
      gap = ", relative gap " + G(d == 0 ? 0 : d / std::max(std::fabs(r.loss_b), 1e-12), "%.3g");
    }
    v.lines.push_back("loss at the last compared step: " + loss(r.loss_b, r.loss_b_given) + " (baseline) vs " +
                    loss(r.loss_c, r.loss_c_given) +
                      " (candidate)" + gap);
  }
  v.lines.push_back("steps compared: " + std::to_string(v.steps_compared) + " of " +
                    std::to_string(v.steps_expected) + " expected (" + Percent(v.steps_compared, v.steps_expected) +
                    (r.ranks > 1 ? ", " + StepsTimesRanks(v.steps_compared, r.ranks) : std::string()) +
                    "); tensor names shared: " + std::to_string(v.tensors_shared) + " (baseline " +
                    std::to_string(v.tensors_baseline) + ", candidate " + std::to_string(v.tensors_candidate) + ")");
  // A log thinned by retention says so: the verdict over those steps rests on the steps
  // kept in full and on every step's scalars (docs/runlog.md "Segments and retention").
  for (const auto& [scan, role] : {std::pair{&base, "baseline"}, std::pair{&cand, "candidate"}}) {
    if (!scan->thinned.empty()) v.lines.push_back(std::string(role) + " log: " + scan->thinned);
  }
  return v;
}

}  // namespace lockstep::collector
