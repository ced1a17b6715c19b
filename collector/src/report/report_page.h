// The HTML report (docs/report.md): one self-contained page, its data one JSON blob.
//
// ReportJson() gathers what the page shows: the verdict compare computes
// (detect/compare_gate.h), the settings it ran with, the Analyzer's PairReport (the
// per-tensor table, unmatched tensors, first divergence) and what the ReportRecorder
// kept (heatmap matrix, scalar curves, alerts). ReportHtml() puts it into the page
// template (report_template.html, embedded at build time): no request leaves the page
// (a Content-Security-Policy of default-src 'none' says so to the browser), except,
// for the live page, fetching its own JSON again.
//
// Threads: pure functions over their arguments (the recorder locks itself).
#ifndef LOCKSTEP_COLLECTOR_REPORT_REPORT_PAGE_H_
#define LOCKSTEP_COLLECTOR_REPORT_REPORT_PAGE_H_

#include <string>
#include <utility>
#include <vector>

#include "detect/analyzer.h"
#include "detect/compare_gate.h"
#include "report/report_recorder.h"

namespace lockstep::collector {

struct ReportHeader {
  std::string generated_by;  // e.g. "lockstep 0.9.0 report"
  std::string generated_at;  // UTC time, ISO 8601
  std::string path_b, path_c;  // the logs ("" live)
  std::string settings_source;
  std::vector<std::pair<std::string, std::string>> settings;  // rule flags that differ from the defaults
  std::vector<std::string> notes;
  bool live = false;
  int exit_code = 0;  // what `lockstep compare` would exit with
};

std::string ReportJson(const ReportHeader& h, const PairReport& r, const GateVerdict& v,
                       const ReportRecorder& rec);

// The page. `json_url` empty: a static file; otherwise the page fetches that URL every
// `refresh_s` seconds and redraws (the collector's /report).
std::string ReportHtml(const std::string& json, const std::string& json_url = "", int refresh_s = 5);

// The collector's index page: one link per experiment.
std::string ReportIndexHtml(const std::vector<std::string>& experiments);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_REPORT_REPORT_PAGE_H_
