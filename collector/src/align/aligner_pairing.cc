// Aligner (aligner.h): who is compared with whom. Roles and experiments from Hello or
// OverrideRun; a candidate is paired with its experiment's one baseline.
#include <memory>
#include <string>
#include <utility>

#include <spdlog/spdlog.h>

#include "align/aligner.h"
#include "align/aligner_state.h"
#include "lockstep/common/wire_names.h"

namespace lockstep::collector {

namespace {

// RunRole's values are the wire's Role numbers (aligner.cc checks): one spelling of each
// role (wire_names.h).
const char* RoleName(RunRole r) { return wire::RoleName(static_cast<uint8_t>(r)); }

}  // namespace

void Aligner::OverrideRun(const std::string& run, const std::string& experiment, RunRole role) {
  RunState* r = GetRun(run);
  r->fixed = false;
  SetRole(r, experiment, role);
  r->fixed = true;
}

void Aligner::MakePair(RunState* b, RunState* c) {
  auto p = std::make_unique<PairState>();
  PairState* pp = p.get();
  pp->b = b;
  pp->c = c;
  pp->info.index = pairs_.size();
  pp->info.experiment = c->info.experiment;
  pp->info.baseline = &b->info;
  pp->info.candidate = &c->info;
  pp->info.evicted = c->evicted;  // what the candidate lost while it waited for a baseline
  spdlog::info("experiment {}: comparing candidate {} against baseline {}", c->info.experiment, c->info.id,
               b->info.id);
  if (b->released && !OpenBaselineLog(pp)) {
    ++counters_.late_joins_uncompared;
    spdlog::warn("experiment {}: candidate {} joined after other candidates had passed baseline {}'s first steps, "
                 "and the baseline's log cannot be read back ({}): its steps the baseline no longer holds are not "
                 "compared (run the collector with --data-dir, or compare the logs with `lockstep compare`)",
                 c->info.experiment, c->info.id, b->info.id,
                 opt_.data_dir.empty() && b->log_path.empty() ? "no data dir" : "no log");
  }
  b->pairs.push_back(pp);
  c->pairs.push_back(pp);
  pairs_.push_back(std::move(p));
  sink_->OnPairStart(pp->info);
  dirty_ = true;
}

void Aligner::SetRole(RunState* r, const std::string& experiment, RunRole role) {
  if (r->fixed) return;
  AlignedRun& i = r->info;
  if (i.role == role && i.experiment == experiment) return;
  if (i.role != RunRole::kUnknown) {
    spdlog::warn("run {} announced experiment '{}' role {} after '{}' role {}; keeping the first", i.id, experiment,
                 RoleName(role), i.experiment, RoleName(i.role));
    return;
  }
  i.experiment = experiment;
  i.role = role;
  if (role == RunRole::kBaseline) {
    auto it = baseline_of_.find(experiment);
    if (it != baseline_of_.end() && it->second != i.id) {
      spdlog::warn("experiment {} already has baseline {}; run {} (also a baseline) is not paired", experiment,
                   it->second, i.id);
      DropBuffered(r);
      return;
    }
    baseline_of_[experiment] = i.id;
    std::string waiting;  // unpaired candidates of other experiments (a typo on either side)
    bool paired = false;
    for (auto& [id, other] : runs_) {
      if (other->info.role != RunRole::kCandidate || !other->pairs.empty()) continue;
      if (other->info.experiment == experiment) {
        MakePair(r, other.get());
        paired = true;
      } else {
        waiting += (waiting.empty() ? "" : ", ") + other->info.id + " ('" + other->info.experiment + "')";
      }
    }
    if (!paired && !waiting.empty()) {
      spdlog::warn("baseline {} of experiment '{}' has no candidate; candidates still waiting for a baseline: {} — "
                   "check experiment= of both runs",
                   i.id, experiment, waiting);
    }
  } else if (role == RunRole::kCandidate) {
    auto it = baseline_of_.find(experiment);
    if (it != baseline_of_.end()) {
      MakePair(runs_.at(it->second).get(), r);
    } else if (baseline_of_.empty()) {
      // Waiting for its baseline is normal at start, even after the candidate's end (a
      // baseline run after it); one that never gets one is warned about at Finish.
      spdlog::info("candidate {} of experiment '{}' waits for its baseline", i.id, experiment);
    } else {
      WarnUnpaired(r, "no baseline of that experiment yet");  // another experiment's: a typo shows at once
    }
  } else {
    DropBuffered(r);
  }
}

void Aligner::WarnUnpaired(RunState* r, const char* why) {
  if (r->warned_unpaired) return;
  r->warned_unpaired = true;
  // A typo in the experiment name waits forever: name the experiments that do have a
  // baseline, so it shows.
  std::string known;
  for (const auto& [exp, run] : baseline_of_) known += (known.empty() ? "'" : ", '") + exp + "' (" + run + ")";
  spdlog::warn("candidate {} of experiment '{}' is not paired: {}{}", r->info.id, r->info.experiment, why,
               known.empty() ? std::string(" (none of any experiment)")
                             : "; experiments with a baseline: " + known + " — check experiment= of both runs");
}

}  // namespace lockstep::collector
