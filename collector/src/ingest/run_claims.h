// RunClaims: which agent sessions may write to a run id. Two jobs started with the same
// run id would otherwise be merged into one log (their Hellos look like a restart).
//
// A run is claimed by the role of the Hello that opens it. While the run is live (a
// session of it was heard from within kLiveNs and has not said Goodbye), a Hello from
// another agent session (Envelope.session) with another role is refused, and so is
// everything that session sends afterwards: its data never reaches the log or the
// analysis. Another session with the same role is another rank or a restarted job, as
// before. Messages of older agents (session 0) are never refused: they cannot be told
// apart.
//
// Ingest thread only (no locking).
#ifndef LOCKSTEP_COLLECTOR_INGEST_RUN_CLAIMS_H_
#define LOCKSTEP_COLLECTOR_INGEST_RUN_CLAIMS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>

namespace lockstep::wire {
struct Envelope;
}

namespace lockstep::collector {

class RunClaims {
 public:
  static constexpr int64_t kLiveNs = 30'000'000'000;  // silent this long: the claim lapses

  // True when `env` must be dropped. `*message` is set to one sentence (naming the run,
  // both roles and both processes) the first time a session is refused, else left empty.
  bool Refuse(const wire::Envelope& env, int64_t now_ns, std::string* message);

  uint64_t refused_messages() const { return refused_messages_; }

 private:
  struct Session {
    int64_t last_ns = 0;
    bool ended = false;
    std::string host;
    uint32_t pid = 0;
  };
  struct Claim {
    uint8_t role = 0;  // wire::Role
    std::string experiment;
    std::map<uint64_t, Session> sessions;
  };
  bool Live(const Claim& c, int64_t now_ns) const;

  std::map<std::string, Claim, std::less<>> runs_;
  std::set<std::pair<std::string, uint64_t>> refused_;
  uint64_t refused_messages_ = 0;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_INGEST_RUN_CLAIMS_H_
