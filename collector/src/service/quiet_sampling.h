// QuietSampling: when the collector's --sample-quiet K asks a pair's runs to thin their
// tensors, and when to ask for every step again (docs/rules.md "Sampling that follows
// the runs' state"). Pure: FollowUp feeds it and sends what it returns.
//
// Per pair:
//   new    nothing asked yet. Its first compared step with both runs live agents of
//          this collector: ask K (quiet). An alert first: loud, nothing to ask (the
//          runs record every step already).
//   quiet  an alert of the pair's incidents (its drift, trend, loss or first
//          divergence; a numerics incident of either run): ask 1 at once (loud).
//   loud   no such alert for `resolve_after` (the incidents' resolution,
//          --incident-resolve-s), seen at a compared step: ask K again (quiet).
//          resolve_after 0: incidents never resolve, the pair stays at every step.
//   off    an agent of the pair did not sample (an older agent: "ignored"; "refused"):
//          every step from then on, nothing more asked (a quiet pair is asked 1 once).
// A return of 0 means "ask nothing".
//
// Time: the caller's monotonic clock, in ns. Threads: none of its own; the caller
// serializes calls (FollowUp's mutex).
#ifndef LOCKSTEP_COLLECTOR_SERVICE_QUIET_SAMPLING_H_
#define LOCKSTEP_COLLECTOR_SERVICE_QUIET_SAMPLING_H_

#include <cstdint>
#include <map>
#include <string>

namespace lockstep::collector {

class QuietSampling {
 public:
  enum class State { kNew, kQuiet, kLoud, kOff };

  // `quiet_k` >= 2 (1 would change nothing); `resolve_after_ns` 0 = never resolve.
  QuietSampling(uint32_t quiet_k, int64_t resolve_after_ns)
      : quiet_k_(quiet_k), resolve_after_ns_(resolve_after_ns) {}

  // A compared step of `pair`; `live`: both its runs are live agents here. The stride
  // to ask both runs for now (K), or 0.
  uint32_t OnPairStep(const std::string& pair, bool live, int64_t now_ns);
  // An alert of one of the pair's incidents: 1 when both runs must be asked for every
  // step now, else 0.
  uint32_t OnAlert(const std::string& pair, int64_t now_ns);
  // An agent of the pair answered a sample request other than "done": 1 when the
  // other run must be asked back to every step, else 0.
  uint32_t OnNotSampled(const std::string& pair);

  State state(const std::string& pair) const;

 private:
  struct Pair {
    State state = State::kNew;
    int64_t last_alert_ns = 0;
  };
  const uint32_t quiet_k_;
  const int64_t resolve_after_ns_;
  std::map<std::string, Pair> pairs_;  // by pair key; bounded by the pairs seen
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_SERVICE_QUIET_SAMPLING_H_
