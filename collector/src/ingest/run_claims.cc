#include "ingest/run_claims.h"

#include "lockstep/common/wire_names.h"
#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::collector {

bool RunClaims::Live(const Claim& c, int64_t now_ns) const {
  for (const auto& [id, s] : c.sessions) {
    if (!s.ended && now_ns - s.last_ns < kLiveNs) return true;
  }
  return false;
}

bool RunClaims::Refuse(const wire::Envelope& env, int64_t now_ns, std::string* message) {
  const uint64_t session = env.session();
  if (session == 0 || env.run_id() == nullptr) return false;  // an older agent
  const std::string run = env.run_id()->str();
  if (!refused_.empty() && refused_.count({run, session})) {
    ++refused_messages_;
    return true;
  }
  Claim& c = runs_[run];
  auto it = c.sessions.find(session);
  if (env.body_type() == wire::Body::Hello) {
    const auto* h = env.body_as_Hello();
    const uint8_t role = static_cast<uint8_t>(h->role());
    const bool known = it != c.sessions.end();
    if (!known && c.role != 0 && role != c.role && Live(c, now_ns)) {
      refused_.insert({run, session});
      ++refused_messages_;
      const Session* owner = nullptr;
      for (const auto& [id, s] : c.sessions) {
        if (!s.ended && now_ns - s.last_ns < kLiveNs) owner = &s;
      }
      const std::string host = h->host() ? h->host()->str() : std::string("?");
      *message = "refused run '" + run + "' from a second process (" + wire::RoleName(role) + ", host " + host +
                 " pid " + std::to_string(h->pid()) + "): that run id is live as " + wire::RoleName(c.role) +
                 " (host " + (owner ? owner->host : std::string("?")) + " pid " +
                 std::to_string(owner ? owner->pid : 0) +
                 "); its messages are not logged or compared. Give each job its own run id (run= or LOCKSTEP_RUN)";
      return true;
    }
    if (c.role == 0 || (!Live(c, now_ns) && !known)) {
      // A new claim (or a job started again after the last one ended): its role rules.
      c.role = role;
      c.experiment = h->experiment() ? h->experiment()->str() : std::string();
    }
    Session& s = c.sessions[session];
    s.host = h->host() ? h->host()->str() : std::string();
    s.pid = h->pid();
    s.last_ns = now_ns;
    s.ended = false;
    return false;
  }
  if (it == c.sessions.end()) {
    // No Hello seen from it (this collector restarted): accept, and let it hold the run.
    it = c.sessions.emplace(session, Session{}).first;
  }
  it->second.last_ns = now_ns;
  if (env.body_type() == wire::Body::Goodbye) it->second.ended = true;
  return false;
}

}  // namespace lockstep::collector
