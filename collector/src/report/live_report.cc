#include "report/live_report.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <exception>

#include "detect/compare_gate.h"
#include "detect/live_analyzer.h"
#include "lockstep/common/url_encoding.h"
#include "report/report_page.h"
#include "report/report_recorder.h"

namespace lockstep::collector {

namespace {

std::string UtcNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

// The report's JSON for `experiment`, or "" when it has no pair yet.
std::string LiveJson(const LiveReportSources& src, const std::string& experiment) {
  PairReport report;
  bool found = false;
  src.analyzer->Inspect([&](const Analyzer& a) {
    for (auto& r : a.Reports()) {
      if (r.experiment == experiment) {
        report = std::move(r);
        found = true;
        return;
      }
    }
  });
  if (!found || src.recorder->StepsCompared(experiment) == 0) return "";
  const auto alerts = src.recorder->AlertsOf(experiment);
  bool critical = false;
  for (const auto& a : alerts) critical |= a.severity == alerting::Severity::kCritical;
  // Live, the logs are still being written: the verdict judges the steps compared so far.
  LogScan base, cand;
  base.run_id = report.baseline;
  cand.run_id = report.candidate;
  const GateVerdict v = JudgeCompare(report, base, cand, alerts, critical);
  ReportHeader h;
  h.generated_by = src.generated_by;
  h.generated_at = UtcNow();
  h.settings_source = src.settings_source;
  h.live = true;
  h.exit_code = v.outcome == GateOutcome::kOk ? 0 : v.outcome == GateOutcome::kFinding ? 1 : 5;
  return ReportJson(h, report, v, *src.recorder);
}

}  // namespace

bool ServeLiveReport(const LiveReportSources& src, std::string_view target, std::string* content_type,
                     std::string* body) {
  const size_t q = target.find('?');
  const std::string_view path = target.substr(0, q);
  const std::string_view query = q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
  if (path == "/") {
    *content_type = "text/html; charset=utf-8";
    *body = ReportIndexHtml(src.recorder->Experiments());
    return true;
  }
  if (path != "/report" && path != "/report.json") return false;
  const std::string exp = QueryValue(query, "experiment");
  std::string json = LiveJson(src, exp);
  if (path == "/report.json") {
    if (json.empty()) return false;
    *content_type = "application/json";
    *body = std::move(json);
    return true;
  }
  *content_type = "text/html; charset=utf-8";
  if (json.empty()) {
    *body = ReportIndexHtml(src.recorder->Experiments());
    const std::string say = "<h1>lockstep collector</h1>";
    body->replace(body->find(say), say.size(),
                  say + "<p><b>Experiment '" + UrlEncode(exp) +
                      "' has no compared pair yet</b> (a baseline and a candidate that have both "
                      "closed a step). This page refreshes itself.</p>");
    return true;
  }
  int every_s = 5;
  try {
    const std::string r = QueryValue(query, "refresh");
    if (!r.empty()) every_s = std::clamp(std::stoi(r), 1, 3600);
  } catch (const std::exception&) {
    every_s = 5;  // not a number: the default
  }
  *body = ReportHtml(json, "/report.json?experiment=" + UrlEncode(exp), every_s);
  return true;
}

}  // namespace lockstep::collector
