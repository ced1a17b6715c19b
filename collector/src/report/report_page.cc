#include "report/report_page.h"

#include <string_view>

#include "detect/alert_json.h"
#include "report/report_template.h"  // generated: kReportTemplate
#include "lockstep/common/json_out.h"
#include "lockstep/common/url_encoding.h"

namespace lockstep::collector {

namespace {

// Inside <script>, "</" would end the element early: "<\/" is the same JSON string.
std::string ScriptSafe(const std::string& json) {
  std::string out;
  out.reserve(json.size() + 16);
  for (size_t i = 0; i < json.size(); ++i) {
    if (json[i] == '<' && i + 1 < json.size() && (json[i + 1] == '/' || json[i + 1] == '!')) {
      out += "<\\";
      continue;
    }
    out += json[i];
  }
  return out;
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

void ReplaceOnce(std::string* s, std::string_view what, const std::string& with) {
  const size_t at = s->find(what);
  if (at != std::string::npos) s->replace(at, what.size(), with);
}

}  // namespace

std::string ReportJson(const ReportHeader& h, const PairReport& r, const GateVerdict& v,
                       const ReportRecorder& rec) {
  std::string s;
  JsonOut j(&s);
  j.BeginObject();
  j.FieldU("v", 1);
  j.Field("generated_by", h.generated_by);
  j.Field("generated_at", h.generated_at);
  j.FieldB("live", h.live);
  j.Field("experiment", r.experiment);
  j.Field("baseline", r.baseline);
  j.Field("candidate", r.candidate);
  j.Field("path_b", h.path_b);
  j.Field("path_c", h.path_c);
  j.Key("verdict").BeginObject();
  j.FieldI("exit", h.exit_code);
  j.FieldB("pass", v.outcome == GateOutcome::kOk);
  j.Key("lines").BeginArray();
  for (const auto& l : v.lines) j.Str(l);
  j.EndArray();
  j.Key("problems").BeginArray();
  for (const auto& p : v.problems) j.Str(p);
  j.EndArray();
  j.FieldU("steps_compared", v.steps_compared);
  j.FieldU("steps_expected", v.steps_expected);
  j.EndObject();
  j.Key("settings").BeginObject();
  j.Field("source", h.settings_source);
  j.Key("set").BeginArray();
  for (const auto& [k, val] : h.settings) j.BeginArray().Str(k).Str(val).EndArray();
  j.EndArray();
  j.Key("notes").BeginArray();
  for (const auto& n : h.notes) j.Str(n);
  j.EndArray();
  j.EndObject();
  j.Key("summary").BeginObject();
  j.FieldU("steps_compared", r.steps_compared);
  j.FieldU("steps_only_baseline", r.steps_only_baseline);
  j.FieldU("steps_only_candidate", r.steps_only_candidate);
  j.FieldU("steps_not_compared", r.steps_evicted);
  j.EndObject();
  j.Key("first_divergence");
  if (r.diverged) {
    WriteAlertJson(r.first_divergence, &j);
  } else {
    j.Null();
  }
  // The per-tensor table: one array per tensor, columns named once.
  j.Key("table_cols").BeginArray();
  for (const char* c : {"order", "tensor", "kind", "micro", "dtype", "steps", "worst_step", "l2_base", "l2_cand",
                        "rel_l2", "rel_dist", "cosine", "score", "metric", "first_drift", "status"}) {
    j.Str(c);
  }
  j.EndArray();
  j.Key("table").BeginArray();
  for (const auto& t : r.tensors) {
    j.BeginArray();
    j.Uint(t.order).Str(t.name).Str(t.kind).Uint(t.micro_step);
    j.Str(t.dtype_b == t.dtype_c ? t.dtype_b : t.dtype_b + "/" + t.dtype_c);
    j.Uint(t.steps).Uint(t.worst_step);
    j.Rounded(t.b_l2, 5).Rounded(t.c_l2, 5).Rounded(t.rel_l2, 3).Rounded(t.rel_dist, 3).Rounded(t.cosine, 7);
    j.Rounded(t.threshold > 0 ? t.score / t.threshold : t.score, 3);
    j.Str(t.metric).Int(t.first_drift_step).Str(t.status);
    j.EndArray();
  }
  j.EndArray();
  j.Key("unmatched").BeginArray();
  for (const auto& u : r.unmatched) {
    j.BeginArray().Str(u.name).Str(u.kind).Str(u.side).Uint(u.first_step).Uint(u.steps).EndArray();
  }
  j.EndArray();
  if (!rec.WriteMatrixJson(r.experiment, &j)) j.Key("ds").Null();
  rec.WriteAlertsJson(r.experiment, &j);
  j.EndObject();
  return s;
}

std::string ReportHtml(const std::string& json, const std::string& json_url, int refresh_s) {
  std::string page(kReportTemplate);
  // The live page may fetch its own JSON; a file may fetch nothing.
  ReplaceOnce(&page, "__LOCKSTEP_CONNECT__", json_url.empty() ? "'none'" : "'self'");
  std::string live = "null";
  if (!json_url.empty()) {
    std::string u;
    JsonOut j(&u);
    j.BeginObject().Field("url", json_url).FieldI("every_s", refresh_s).EndObject();
    live = u;
  }
  ReplaceOnce(&page, "__LOCKSTEP_LIVE__", ScriptSafe(live));
  ReplaceOnce(&page, "__LOCKSTEP_DATA__", ScriptSafe(json));
  return page;
}

std::string ReportIndexHtml(const std::vector<std::string>& experiments) {
  std::string s =
      "<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"Content-Security-Policy\" "
      "content=\"default-src 'none'; style-src 'unsafe-inline'\"><meta http-equiv=\"refresh\" content=\"5\">"
      "<title>lockstep collector</title><style>body{font:14px system-ui,sans-serif;margin:2em}</style></head><body>"
      "<h1>lockstep collector</h1>";
  if (experiments.empty()) {
    s += "<p>No experiment has a compared pair yet (a baseline and a candidate of one experiment). This page "
         "refreshes itself.</p>";
  } else {
    s += "<p>Live reports, one per experiment:</p><ul>";
    for (const auto& e : experiments) {
      s += "<li><a href=\"/report?experiment=" + HtmlEscape(UrlEncode(e)) + "\">" + HtmlEscape(e) +
           "</a></li>";
    }
    s += "</ul>";
  }
  s += "<p>Prometheus metrics: <a href=\"/metrics\">/metrics</a></p></body></html>\n";
  return s;
}

}  // namespace lockstep::collector
