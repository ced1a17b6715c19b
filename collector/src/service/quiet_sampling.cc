#include "service/quiet_sampling.h"

namespace lockstep::collector {

uint32_t QuietSampling::OnPairStep(const std::string& pair, bool live, int64_t now_ns) {
  Pair& p = pairs_[pair];
  if (!live) return 0;
  switch (p.state) {
    case State::kNew:
      p.state = State::kQuiet;
      return quiet_k_;
    case State::kLoud:
      if (resolve_after_ns_ <= 0 || now_ns - p.last_alert_ns < resolve_after_ns_) return 0;
      p.state = State::kQuiet;
      return quiet_k_;
    case State::kQuiet:
    case State::kOff:
      return 0;
  }
  return 0;
}

uint32_t QuietSampling::OnAlert(const std::string& pair, int64_t now_ns) {
  Pair& p = pairs_[pair];
  p.last_alert_ns = now_ns;
  switch (p.state) {
    case State::kQuiet:
      p.state = State::kLoud;
      return 1;
    case State::kNew:
      p.state = State::kLoud;  // recording every step already: nothing to ask
      return 0;
    case State::kLoud:
    case State::kOff:
      return 0;
  }
  return 0;
}

uint32_t QuietSampling::OnNotSampled(const std::string& pair) {
  Pair& p = pairs_[pair];
  const bool was_quiet = p.state == State::kQuiet;
  p.state = State::kOff;
  return was_quiet ? 1 : 0;
}

QuietSampling::State QuietSampling::state(const std::string& pair) const {
  auto it = pairs_.find(pair);
  return it == pairs_.end() ? State::kNew : it->second.state;
}

}  // namespace lockstep::collector
