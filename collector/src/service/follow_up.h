// FollowUp: what a live collector asks of the runs once a pair parts ways (docs/design.md
// "The control channel").
//
// - The first divergence is born in a container's own code: both runs zoom into it a few
//   steps ahead (`zoom_steps`), so that a zoomed step names the call (the refined first
//   divergence, rules/pair_rules.h).
// - The first divergence (refined or not) names an op: both runs capture it at the same
//   upcoming step (`capture`), and once both have answered with their files an info
//   alert (rule "capture") lists them with the command that says which run is wrong
//   (`python -m lockstep replay BASELINE_FILE CANDIDATE_FILE`).
// - Each agent then replays its own capture against float64 and answers again with what
//   it found (SelfReplayResult); once both have, an info alert (rule "replay") gives the
//   verdict (service/replay_verdict.h), which compare rebuilds from the same answers in
//   the logs. Agents older than schema minor 6 send none: the capture alert says that
//   the verdict needs both files.
//
// - With --sample-quiet K (`sample_quiet`), both runs record tensors every K-th step while
//   the pair agrees and every step while one of its incidents is open
//   (service/quiet_sampling.h says when; action "sample").
//
// - `lockstep zoom EXPERIMENT MODULE` zooms by hand (ZoomByHand), any module, any time.
//
// Zoom and capture at most once per pair, and only when both runs are live agents of this collector
// (not a recorded --baseline log). The step: two past the later run's last step, so
// that both act at the same one (a run past it acts at its next).
//
// Threads: OnDivergence and OnPairStep on the analyzer's thread, OnAnswer on the ingest
// thread, OnAlert on whichever delivers the alert (ingest, the analyzer's timer); one
// mutex between them (held for a map lookup on a compared step; requests are a few a
// run). None of them calls back into the alert fan-out while holding it.
#ifndef LOCKSTEP_COLLECTOR_SERVICE_FOLLOW_UP_H_
#define LOCKSTEP_COLLECTOR_SERVICE_FOLLOW_UP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "lockstep/alerting/alert.h"
#include "lockstep/collector/collector.h"
#include "rules/detector.h"
#include "service/quiet_sampling.h"

namespace lockstep::collector {

class FollowUp {
 public:
  using AlertFn = std::function<void(alerting::Alert)>;
  // `collector` outlives this; `zoom_steps` 0 = never zoom; `capture` false = never capture.
  // `sample_quiet` 0 = never change how the runs sample; `resolve_after_ns`: when a
  // pair's incidents resolve (the alerting's incident_resolve_after; 0 = never).
  FollowUp(Collector* collector, uint32_t zoom_steps, bool capture, const Clock* clock, AlertFn alert,
           uint32_t sample_quiet = 0, int64_t resolve_after_ns = 0);

  // A pair's first divergence fired, or was refined (Analyzer::SetDivergenceObserver).
  void OnDivergence(const PairCtx& ctx);
  // An agent answered a request (CollectorOptions::on_control_answer).
  void OnAnswer(const std::string& run, const ControlRequestState& request);
  // A compared (pair, rank, step) (Analyzer::SetPairStepObserver): --sample-quiet's clock.
  void OnPairStep(const PairCtx& ctx);
  // Every alert the service delivers: a pair's incident raises its runs to every step.
  void OnAlert(const alerting::Alert& a);
  // `lockstep zoom` (POST /zoom on the collector's HTTP port, any thread): every live run
  // of `experiment` zooms into `module` for `steps` steps from the next step all of them
  // can act at, whatever the rules found. Returns the HTTP status (200; 404 no run of
  // that experiment here; 409 fewer than two live runs, or no control channel) and
  // `reply`, one line for the user.
  int ZoomByHand(const std::string& experiment, const std::string& module, uint32_t steps, std::string* reply);

 private:
  struct Capture {
    std::string experiment, baseline, candidate, target;
    uint64_t step = 0;
    uint64_t id_b = 0, id_c = 0;
    std::string file_b, file_c;  // from the "done" answers of rank 0
    uint16_t minor_b = 0, minor_c = 0;  // the answering agents' schema minors
    std::optional<SelfReplayResult> replay_b, replay_c;  // their own replays
    uint64_t replay_step_b = 0, replay_step_c = 0;       // the steps they captured
    bool told = false, replay_told = false;
  };
  // The step both runs act at, or 0 when one of them is not live here.
  uint64_t NextStep(const PairCtx& ctx) const;
  uint64_t Ask(const PairCtx& ctx, const std::string& run, const char* action, const std::string& target,
               uint64_t step, uint32_t steps);
  // Both runs of `ctx` sample every `k` steps from the next step both can act at.
  void AskSample(const PairCtx& ctx, uint32_t k, const std::string& why) ; // mu_ held

  Collector* const collector_;
  const uint32_t zoom_steps_;
  const bool capture_;
  const Clock* const clock_;
  AlertFn alert_;
  std::mutex mu_;
  std::set<std::string> zoomed_, captured_;              // pair keys asked already
  std::unordered_map<uint64_t, size_t> capture_of_;     // request id -> captures_ index
  std::vector<Capture> captures_;
  // --sample-quiet: the pairs' states, each pair's context by key (for requests from an
  // alert or an answer), the sample requests' pairs, and when a pair that was not live
  // was last looked at (the registry is read at most once a second for it).
  std::unique_ptr<QuietSampling> quiet_;
  std::map<std::string, PairCtx> pair_of_;
  std::unordered_map<uint64_t, std::string> sample_of_;
  std::unordered_map<std::string, int64_t> live_checked_ns_;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_SERVICE_FOLLOW_UP_H_
