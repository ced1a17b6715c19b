// IncidentGrouper: turns a stream of alerts into a few notifications per incident,
// as Alertmanager groups alerts by labels (docs/alerting.md "Incidents").
//
// Alerts with the same Alert::incident key (set by the detectors, which know which
// alerts one cause explains) form one incident. It is notified when it
//   opens      the first alert of the key;
//   escalates  an alert more severe than any before it, or a critical alert that is a
//              new fact (a rule not yet among its critical facts; or the loss, by any
//              rule, the first time it is critical);
//   updates    a digest of what joined since the last notification, at most once per
//              digest interval while alerts keep joining;
//   resolves   no alert joined for `resolve_after`.
// Every notification is an Alert (notification, incident_alerts and facts set), so the
// sinks' formats, spool and transports carry it unchanged.
//
// A notification the sink's rate limit holds back is handed back with Hold(): it is
// merged into the incident's next message, sent as soon as the sink may send again.
// Only non-critical notifications are held; criticals are always sent at once.
//
// Time comes from the caller (an injectable clock). Threads: single owner (a sink's
// worker thread).
#ifndef LOCKSTEP_ALERTING_SRC_INCIDENTS_H_
#define LOCKSTEP_ALERTING_SRC_INCIDENTS_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lockstep/alerting/alert.h"

namespace lockstep::alerting {

class IncidentGrouper {
 public:
  using Ns = std::chrono::nanoseconds;
  // digest_interval <= 0: no digests; resolve_after <= 0: incidents never resolve.
  IncidentGrouper(Ns digest_interval, Ns resolve_after)
      : digest_interval_(digest_interval), resolve_after_(resolve_after) {}

  // Adds a detector's alert; appends the notifications due now (0 or 1) to `*out`.
  void Add(const Alert& alert, Ns now, std::vector<Alert>* out);
  // Digests and resolutions due at `now`; with `may_send_held`, also one merged
  // message per incident whose notifications were held back. Appends to `*out`.
  void Tick(Ns now, bool may_send_held, std::vector<Alert>* out);
  // A notification the rate limit did not let through: merged into the next message.
  void Hold(const Alert& notification);

  // The earliest time Tick() has a digest or resolution to make; Ns::max() if none.
  Ns NextDue() const;
  size_t open() const { return incidents_.size(); }
  // Incidents with held notifications (what a flush still waits for).
  size_t held() const;

 private:
  struct Incident {
    Alert opener;               // the first alert: rule, tensor, experiment, runs
    Alert latest;               // the latest alert that joined
    Severity severity = Severity::kInfo;
    uint64_t alerts = 0;
    std::vector<IncidentFact> facts;
    std::map<std::string, uint64_t> news_by_rule;  // joined since the last notification
    uint64_t news = 0;
    Ns last_alert{0};
    Ns last_notified{0};
    bool held = false;          // a held notification waits to be merged and sent
    std::string held_state;     // the most important state held ("opened" before others)
  };
  static std::string FactId(const Alert& a);
  // The notification of `state` built on `base` (the alert that brings the news, or the
  // latest one); clears the incident's news.
  Alert Notify(Incident* inc, const std::string& key, const std::string& state, const Alert& base,
               Ns now);
  std::string NewsLine(const Incident& inc) const;

  Ns digest_interval_;
  Ns resolve_after_;
  std::map<std::string, Incident> incidents_;  // by key; bounded by the causes seen
};

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_SRC_INCIDENTS_H_
