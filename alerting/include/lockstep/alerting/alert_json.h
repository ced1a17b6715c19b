// One Alert as one JSON object, the only encoder of an alert: the generic webhook body,
// the jsonl sink's line, the spool's record, and on the collector side `lockstep
// compare --json` / `--alerts-file` and the HTML report (collector/src/detect/
// alert_json.h writes through it), so every file of alerts has the same fields.
//
// Fields: source, id, rule, severity, experiment, runs, run (the last of runs: the
// candidate of a pair rule), step, rank, tensor, kind, baseline_value, candidate_value,
// metric, error, threshold (NaN as null), first_seen (RFC 3339), first_seen_unix_ns,
// repeat_count, message, dedup_key, incident ("" when none); cause when known;
// notification, incident_alerts and facts for an incident's message.
//
// Pure function, any thread.
#ifndef LOCKSTEP_ALERTING_ALERT_JSON_H_
#define LOCKSTEP_ALERTING_ALERT_JSON_H_

#include <cstdint>
#include <string>

#include "lockstep/alerting/alert.h"

namespace lockstep::alerting {

// `now_unix_ms` stands in for a first_seen_unix_ns of 0 (an offline caller passes 0).
std::string AlertToJson(const Alert& alert, int64_t now_unix_ms);

}  // namespace lockstep::alerting

#endif  // LOCKSTEP_ALERTING_ALERT_JSON_H_
