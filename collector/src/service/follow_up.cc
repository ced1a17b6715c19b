#include "service/follow_up.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "service/replay_verdict.h"

namespace lockstep::collector {
namespace {

std::string PairKey(const PairCtx& ctx) { return ctx.experiment + "/" + ctx.baseline + "/" + ctx.candidate; }

// "capture X at step N into PATH" -> PATH ("" when the answer names none).
std::string FileOf(const std::string& detail) {
  const std::string into = " into ";
  auto pos = detail.rfind(into);
  return pos == std::string::npos ? std::string() : detail.substr(pos + into.size());
}

}  // namespace

FollowUp::FollowUp(Collector* collector, uint32_t zoom_steps, bool capture, const Clock* clock, AlertFn alert,
                   uint32_t sample_quiet, int64_t resolve_after_ns)
    : collector_(collector), zoom_steps_(zoom_steps), capture_(capture), clock_(clock), alert_(std::move(alert)) {
  if (sample_quiet > 1) quiet_ = std::make_unique<QuietSampling>(sample_quiet, resolve_after_ns);
}

uint64_t FollowUp::NextStep(const PairCtx& ctx) const {
  uint64_t last = 0;
  bool b = false, c = false;
  for (const RankInfo& r : collector_->registry().Snapshot()) {
    if (r.run == ctx.baseline || r.run == ctx.candidate) last = std::max(last, r.last_step);
    b |= r.run == ctx.baseline;
    c |= r.run == ctx.candidate;
  }
  // A run that never spoke to this collector (a recorded --baseline log) cannot act:
  // zoomed or captured on one side only, nothing would pair.
  return b && c ? last + 2 : 0;
}

uint64_t FollowUp::Ask(const PairCtx& ctx, const std::string& run, const char* action, const std::string& target,
                       uint64_t step, uint32_t steps) {
  ControlRequestSpec spec;
  spec.experiment = ctx.experiment;
  spec.run = run;
  spec.action = action;
  spec.target = target;
  spec.step = step;
  spec.steps = steps;
  return collector_->Request(std::move(spec));
}

void FollowUp::AskSample(const PairCtx& ctx, uint32_t k, const std::string& why) {
  const uint64_t at = NextStep(ctx);
  if (at == 0) return;
  const std::string key = PairKey(ctx);
  sample_of_[Ask(ctx, ctx.baseline, "sample", "", at, k)] = key;
  sample_of_[Ask(ctx, ctx.candidate, "sample", "", at, k)] = key;
  spdlog::info("{}: asked runs {} and {} to record tensors every {} from step {} (--sample-quiet)", why,
               ctx.baseline, ctx.candidate, k == 1 ? std::string("step") : std::to_string(k) + " steps", at);
}

void FollowUp::OnPairStep(const PairCtx& ctx) {
  if (!quiet_ || collector_->control_endpoint().empty()) return;
  const std::string key = PairKey(ctx);
  const int64_t now = clock_->NowMonotonicNs();
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, added] = pair_of_.try_emplace(key);
  if (added) {
    it->second.experiment = ctx.experiment;
    it->second.baseline = ctx.baseline;
    it->second.candidate = ctx.candidate;
  }
  const QuietSampling::State st = quiet_->state(key);
  bool live = true;
  if (st == QuietSampling::State::kNew) {
    // Whether both runs are agents of this collector: read from the registry, at most
    // once a second for a pair that is not (a recorded --baseline log never becomes one).
    int64_t& checked = live_checked_ns_[key];
    if (checked != 0 && now - checked < 1'000'000'000) return;
    checked = now;
    live = NextStep(ctx) != 0;
  }
  const uint32_t k = quiet_->OnPairStep(key, live, now);
  if (k == 0) return;
  AskSample(it->second, k, st == QuietSampling::State::kNew ? "the runs are live agents and agree"
                                                           : "the pair's incidents resolved");
}

void FollowUp::OnAlert(const alerting::Alert& a) {
  if (!quiet_ || a.severity == alerting::Severity::kInfo || a.notification.size() != 0) return;
  // The pair's own incident, or a numerics incident of either of its runs.
  const bool divergence = a.incident.rfind("divergence/", 0) == 0;
  const bool numerics = a.incident.rfind("numerics/", 0) == 0;
  if (!divergence && !numerics) return;
  const int64_t now = clock_->NowMonotonicNs();
  std::lock_guard<std::mutex> lock(mu_);
  if (divergence && a.runs.size() == 2) {
    // A pair diverging at its first compared step is not known yet: it must not be
    // asked to thin at its next.
    PairCtx ctx;
    ctx.experiment = a.experiment;
    ctx.baseline = a.runs[0];
    ctx.candidate = a.runs[1];
    pair_of_.try_emplace(PairKey(ctx), ctx);
  }
  for (auto& [key, ctx] : pair_of_) {
    if (ctx.experiment != a.experiment) continue;
    const bool ours = divergence ? a.runs.size() == 2 && a.runs[0] == ctx.baseline && a.runs[1] == ctx.candidate
                                 : a.runs.size() == 1 && (a.runs[0] == ctx.baseline || a.runs[0] == ctx.candidate);
    if (!ours) continue;
    if (quiet_->OnAlert(key, now) == 1)
      AskSample(ctx, 1, "rule " + a.rule + " fired at step " + std::to_string(a.step));
  }
}

int FollowUp::ZoomByHand(const std::string& experiment, const std::string& module, uint32_t steps,
                         std::string* reply) {
  if (collector_->control_endpoint().empty()) {
    *reply = "this collector has no control channel (--control-listen off): it cannot ask the runs for anything";
    return 409;
  }
  std::vector<std::string> runs;
  uint64_t last = 0;
  bool known = false;
  for (const RankInfo& r : collector_->registry().Snapshot()) {
    if (r.experiment != experiment) continue;
    known = true;
    if (r.goodbye) continue;
    last = std::max(last, r.last_step);
    if (std::find(runs.begin(), runs.end(), r.run) == runs.end()) runs.push_back(r.run);
  }
  if (!known) {
    *reply = "no run of experiment '" + experiment + "' has spoken to this collector";
    return 404;
  }
  std::string names;
  for (const std::string& r : runs) names += (names.empty() ? "" : ", ") + r;
  if (runs.size() < 2) {
    *reply = "experiment '" + experiment + "' has " + std::to_string(runs.size()) + " live run(s) here" +
             (names.empty() ? std::string() : " (" + names + ")") +
             ": a zoom needs both runs of a pair, whose calls pair by name";
    return 409;
  }
  // Both act at the same step: two past the latest run's last step (as NextStep).
  const uint64_t at = last + 2;
  PairCtx ctx;
  ctx.experiment = experiment;
  for (const std::string& r : runs) Ask(ctx, r, "zoom", module, at, steps);
  *reply = "asked runs " + names + " to zoom into " + module + " from step " + std::to_string(at) + " (" +
           std::to_string(steps) + (steps == 1 ? " step" : " steps") +
           "); each answers on the wire, and refuses a module it does not have (lockstep inspect RUN_LOG shows "
           "the answers as ControlAck)";
  spdlog::info("lockstep zoom: {}", *reply);
  return 200;
}

void FollowUp::OnDivergence(const PairCtx& ctx) {
  if (ctx.outcome == nullptr || collector_->control_endpoint().empty()) return;
  const PairOutcome& o = *ctx.outcome;
  const std::string key = PairKey(ctx);
  std::lock_guard<std::mutex> lock(mu_);
  if (!o.zoom.empty() && !o.refined) {
    const uint64_t at = NextStep(ctx);
    if (zoom_steps_ == 0 || at == 0 || !zoomed_.insert(key).second) return;
    Ask(ctx, ctx.baseline, "zoom", o.zoom, at, zoom_steps_);
    Ask(ctx, ctx.candidate, "zoom", o.zoom, at, zoom_steps_);
    spdlog::info("the error is born in {}'s own code: asked runs {} and {} to zoom into it from step {} ({} steps)",
                 o.zoom, ctx.baseline, ctx.candidate, at, zoom_steps_);
    return;
  }
  // A forward birth point (an op whose inputs agree and output does not) is an op that
  // can be re-run alone; a drifting tensor or a backward one is not.
  const alerting::Alert& fd = o.first_divergence;
  if (!capture_ || fd.metric != "added_error" || fd.kind != "act" || fd.tensor.empty()) return;
  const uint64_t at = NextStep(ctx);
  if (at == 0 || !captured_.insert(key).second) return;
  Capture c;
  c.experiment = ctx.experiment;
  c.baseline = ctx.baseline;
  c.candidate = ctx.candidate;
  c.target = fd.tensor;
  c.step = at;
  c.id_b = Ask(ctx, ctx.baseline, "capture", c.target, c.step, 1);
  c.id_c = Ask(ctx, ctx.candidate, "capture", c.target, c.step, 1);
  spdlog::info("asked runs {} and {} to capture {} at step {} (python -m lockstep replay says which run is wrong)",
               ctx.baseline, ctx.candidate, c.target, c.step);
  capture_of_[c.id_b] = captures_.size();
  capture_of_[c.id_c] = captures_.size();
  captures_.push_back(std::move(c));
}

void FollowUp::OnAnswer(const std::string& run, const ControlRequestState& request) {
  const ControlAnswer* rank0 = nullptr;
  for (const ControlAnswer& a : request.answers) {
    if (a.rank == 0 && a.status != "received") rank0 = &a;
  }
  if (rank0 == nullptr) return;
  if (request.spec.action == "sample") {
    if (rank0->status == "done") return;
    spdlog::warn("run {} does not sample as asked: {} ({}); its pair records every step", run, rank0->status,
                 rank0->detail);
    std::lock_guard<std::mutex> lock(mu_);
    auto s = sample_of_.find(request.id);
    if (s == sample_of_.end() || !quiet_) return;
    auto p = pair_of_.find(s->second);
    if (p != pair_of_.end() && quiet_->OnNotSampled(s->second) == 1)
      AskSample(p->second, 1, "run " + run + " does not sample");
    return;
  }
  if (rank0->status != "done") {
    spdlog::warn("run {} did not {} {}: {} ({})", run, request.spec.action, request.spec.target, rank0->status,
                 rank0->detail);
    return;
  }
  std::vector<alerting::Alert> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = capture_of_.find(request.id);
    if (it == capture_of_.end()) return;
    Capture& c = captures_[it->second];
    const bool base = request.id == c.id_b;
    (base ? c.file_b : c.file_c) = FileOf(rank0->detail);
    (base ? c.minor_b : c.minor_c) = rank0->schema_minor;
    if (rank0->replay) {
      (base ? c.replay_b : c.replay_c) = rank0->replay;
      (base ? c.replay_step_b : c.replay_step_c) = rank0->step;
    }
    if (c.file_b.empty() || c.file_c.empty()) return;
    const int64_t now = clock_->NowUnixNs();
    if (!c.told) {
      c.told = true;
      ReplayCase rc;
      rc.experiment = c.experiment;
      rc.baseline = c.baseline;
      rc.candidate = c.candidate;
      rc.row = c.target;
      rc.step = c.step;
      rc.file_b = c.file_b;
      rc.file_c = c.file_c;
      alerting::Alert a = OpInfoAlert(rc, "capture");
      a.metric = "capture";
      a.message = CaptureMessage(rc, c.minor_b, c.minor_c);
      a.first_seen_unix_ns = now;
      a.id = a.DedupKey() + "@" + std::to_string(a.first_seen_unix_ns);
      out.push_back(std::move(a));
    }
    // A run already past the step captured a later one: two steps' ops do not pair
    // (replay refuses them too), and compare, which pairs by step, says nothing either.
    if (!c.replay_told && c.replay_b && c.replay_c && c.replay_step_b != c.replay_step_c) {
      c.replay_told = true;
      spdlog::info("runs {} and {} captured {} at steps {} and {}: no verdict from two steps", c.baseline,
                   c.candidate, c.target, c.replay_step_b, c.replay_step_c);
    }
    if (!c.replay_told && c.replay_b && c.replay_c) {
      c.replay_told = true;
      ReplayCase rc;
      rc.experiment = c.experiment;
      rc.baseline = c.baseline;
      rc.candidate = c.candidate;
      rc.row = c.replay_b->row.empty() ? c.target : c.replay_b->row;
      rc.step = c.replay_step_b;
      rc.file_b = c.replay_b->file.empty() ? c.file_b : c.replay_b->file;
      rc.file_c = c.replay_c->file.empty() ? c.file_c : c.replay_c->file;
      rc.b = c.replay_b;
      rc.c = c.replay_c;
      ReplayVerdict v = JudgeReplays(rc);
      spdlog::info("replayed {} at step {} on each run's host: {}{}", rc.row, rc.step, v.verdict,
                   v.cause.empty() ? "" : " (cause " + v.cause + ")");
      out.push_back(ReplayAlert(rc, v, now));
    }
  }
  for (alerting::Alert& a : out) alert_(std::move(a));
}

}  // namespace lockstep::collector
