#include "incidents.h"

#include <algorithm>
#include <cstdio>

namespace lockstep::alerting {
namespace {

// Facts beyond this many are counted, not listed: a message stays readable.
constexpr size_t kMaxFacts = 12;

IncidentFact FactOf(const Alert& a) {
  IncidentFact f;
  f.rule = a.rule;
  f.severity = a.severity;
  f.step = a.step;
  f.run = a.runs.empty() ? "" : a.runs.back();
  f.tensor = a.tensor;
  f.kind = a.kind;
  f.message = a.message;
  return f;
}

std::string Minutes(std::chrono::nanoseconds d) {
  char buf[32];
  const double s = std::chrono::duration<double>(d).count();
  if (s < 120) {
    std::snprintf(buf, sizeof buf, "%.0f s", s);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f min", s / 60);
  }
  return buf;
}

int StateRank(const std::string& s) {
  if (s == "opened") return 3;
  if (s == "escalated") return 2;
  if (s == "update") return 1;
  return 0;
}

}  // namespace

std::string IncidentGrouper::FactId(const Alert& a) {
  // The loss turning bad is news even when the rule already reported other tensors,
  // and it is one fact whichever rule says it (tensor_drift on the loss, loss_drift).
  if (a.kind == "loss" || a.tensor == "loss") return "loss";
  return a.rule;
}

void IncidentGrouper::Add(const Alert& a, Ns now, std::vector<Alert>* out) {
  const std::string key = a.incident.empty() ? a.DedupKey() : a.incident;
  auto it = incidents_.find(key);
  if (it == incidents_.end()) {
    Incident inc;
    inc.opener = a;
    inc.latest = a;
    inc.severity = a.severity;
    inc.alerts = 1;
    inc.facts.push_back(FactOf(a));
    inc.last_alert = now;
    Incident& stored = incidents_.emplace(key, std::move(inc)).first->second;
    out->push_back(Notify(&stored, key, "opened", a, now));
    return;
  }
  Incident& inc = it->second;
  ++inc.alerts;
  inc.latest = a;
  inc.last_alert = now;
  bool new_fact = false;
  if (a.severity == Severity::kCritical) {
    const std::string id = FactId(a);
    new_fact = std::none_of(inc.facts.begin(), inc.facts.end(), [&](const IncidentFact& f) {
      Alert probe;
      probe.rule = f.rule;
      probe.kind = f.kind;
      probe.tensor = f.tensor;
      return f.severity == Severity::kCritical && FactId(probe) == id;
    });
  }
  if (a.severity > inc.severity || new_fact) {
    inc.severity = std::max(inc.severity, a.severity);
    if (inc.facts.size() < kMaxFacts) inc.facts.push_back(FactOf(a));
    out->push_back(Notify(&inc, key, "escalated", a, now));
    return;
  }
  ++inc.news;
  ++inc.news_by_rule[a.rule];
}

void IncidentGrouper::Tick(Ns now, bool may_send_held, std::vector<Alert>* out) {
  for (auto it = incidents_.begin(); it != incidents_.end();) {
    Incident& inc = it->second;
    const bool quiet = resolve_after_.count() > 0 && now - inc.last_alert >= resolve_after_;
    if (quiet && may_send_held) {
      out->push_back(Notify(&inc, it->first, "resolved", inc.latest, now));
      it = incidents_.erase(it);
      continue;
    }
    if (inc.held && may_send_held) {
      const std::string state = inc.held_state.empty() ? "update" : inc.held_state;
      out->push_back(Notify(&inc, it->first, state, inc.latest, now));
    } else if (!inc.held && inc.news > 0 && digest_interval_.count() > 0 &&
               now - inc.last_notified >= digest_interval_) {
      out->push_back(Notify(&inc, it->first, "update", inc.latest, now));
    }
    ++it;
  }
}

void IncidentGrouper::Hold(const Alert& n) {
  auto it = incidents_.find(n.incident);
  if (it == incidents_.end()) return;  // a resolution held back: the incident is over anyway
  Incident& inc = it->second;
  inc.held = true;
  if (StateRank(n.notification) > StateRank(inc.held_state)) inc.held_state = n.notification;
  // What that message would have said is news again, told in the merged message.
  ++inc.news;
  ++inc.news_by_rule[n.rule];
}

IncidentGrouper::Ns IncidentGrouper::NextDue() const {
  Ns due = Ns::max();
  for (const auto& [key, inc] : incidents_) {
    if (inc.held) return Ns{0};
    if (inc.news > 0 && digest_interval_.count() > 0) due = std::min(due, inc.last_notified + digest_interval_);
    if (resolve_after_.count() > 0) due = std::min(due, inc.last_alert + resolve_after_);
  }
  return due;
}

size_t IncidentGrouper::held() const {
  return static_cast<size_t>(
      std::count_if(incidents_.begin(), incidents_.end(), [](const auto& kv) { return kv.second.held; }));
}

std::string IncidentGrouper::NewsLine(const Incident& inc) const {
  if (inc.news == 0) return "";
  std::string s = std::to_string(inc.news) + " more alert(s) since the last message (";
  bool first = true;
  for (const auto& [rule, n] : inc.news_by_rule) {
    s += (first ? "" : ", ") + rule + " " + std::to_string(n);
    first = false;
  }
  return s + ")";
}

Alert IncidentGrouper::Notify(Incident* inc, const std::string& key, const std::string& state,
                              const Alert& base, Ns now) {
  Alert n = base;
  n.incident = key;
  n.notification = state;
  n.severity = inc->severity;
  n.incident_alerts = inc->alerts;
  n.facts = inc->facts;
  n.repeat_count = inc->alerts;
  n.first_seen_unix_ns = inc->opener.first_seen_unix_ns;
  // Unique per notification (the sinks' journals and receivers key on it).
  n.id = key + "#" + state + "@" + std::to_string(inc->alerts);
  std::string head = "incident " + state;
  if (state == "escalated") head += " to " + std::string(SeverityName(inc->severity));
  head += " [" + key + "]: ";
  std::string news = NewsLine(*inc);
  if (state == "opened" || state == "escalated") {
    n.message = head + base.message;
    if (state == "escalated") n.message += "; " + std::to_string(inc->alerts) + " alert(s) so far";
    if (!news.empty()) n.message += "; " + news;
  } else if (state == "update") {
    n.message = head + std::to_string(inc->alerts) + " alert(s) so far";
    if (!news.empty()) n.message += ", " + news;
    n.message += "; latest: " + base.message;
  } else {  // resolved
    n.message = head + "no new alert for " + Minutes(now - inc->last_alert) + "; " +
                std::to_string(inc->alerts) + " alert(s) in all; last: " + base.message;
  }
  inc->news = 0;
  inc->news_by_rule.clear();
  inc->last_notified = now;
  inc->held = false;
  inc->held_state.clear();
  return n;
}

}  // namespace lockstep::alerting
