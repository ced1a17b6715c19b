// `lockstep compare A B`: the live aligner and detectors over two recorded run logs
// (service/offline_compare.h, the pipeline `report` shares). A is the baseline, B the
// candidate, whatever roles their Hellos announce.
// Prints a verdict of a few lines first (docs/rules.md "compare as a CI gate"), then the
// settings, the first divergence and a per-tensor table (or --json). The exit status
// gates CI (lockstep/common/exit_codes.h): a critical finding, a corrupt or truncated log, too few
// steps compared, or two runs that do not look like the same model each have their own.
// The detection settings the collector recorded next to the logs
// (rules/detection_settings.h) are used unless flags override them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/align_flags.h"
#include "cli/commands.h"
#include "cli/dump_inputs.h"
#include "cli/msprobe_csv.h"
#include "lockstep/common/flags.h"
#include "cli/offline_pair.h"
#include "cli/rule_flags.h"
#include "detect/alert_json.h"
#include "detect/analyzer.h"
#include "detect/compare_gate.h"
#include "rules/detection_settings.h"
#include "lockstep/common/wire.h"
#include "lockstep/schema/lockstep_generated.h"
#include "lockstep/common/json_out.h"
#include "service/offline_compare.h"

namespace lockstep::cli {
namespace {

using collector::AnalyzerOptions;
using collector::JsonOut;
using collector::PairReport;

#ifndef LOCKSTEP_VERSION
#define LOCKSTEP_VERSION "unknown"
#endif

std::string G(double x, const char* fmt = "%.4g") {
  if (std::isnan(x)) return "-";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, x);
  return buf;
}

// The verdict's lines, headline first, as printed before everything else.
void PrintVerdict(const collector::GateVerdict& v, int exit_code) {
  for (size_t i = 0; i < v.lines.size(); ++i) {
    if (i == 0) {
      std::printf("verdict: %s: %s\n", exit_code == kExitOk ? "PASS" : ("FAIL (exit " + std::to_string(exit_code) + ")").c_str(),
                  v.lines[0].c_str());
    } else {
      std::printf("  %s\n", v.lines[i].c_str());
    }
  }
}

// The detection settings in use and where they came from (header of the text output).

void PrintSettings(const OfflineSettings& s) {
  std::printf("settings: %s\n", s.source.c_str());
  const auto defaults = collector::RuleFlagValues(collector::RulesConfig{});
  std::string changed;
  for (size_t i = 0; i < s.values.size(); ++i) {
    const auto& name = s.values[i].first;
    const bool flag = std::find(s.from_flags.begin(), s.from_flags.end(), name) != s.from_flags.end();
    if (!flag && i < defaults.size() && defaults[i] == s.values[i]) continue;
    changed += (changed.empty() ? "" : ", ") + name + "=" + s.values[i].second + (flag ? " (flag)" : " (recorded)");
  }
  std::printf("  rules: %s\n", changed.empty() ? "all at their defaults" : ("set: " + changed + "; the rest at their defaults").c_str());
  if (!s.name_map.empty()) std::printf("  name map: %s\n", s.name_map.c_str());
  for (const auto& n : s.notes) std::printf("  note: %s\n", n.c_str());
}

void PrintText(const collector::OfflineComparison& cmp, const std::string& path_a, const std::string& path_b,
               int exit_code, const OfflineSettings& settings) {
  const PairReport& r = cmp.report;
  const auto& alerts = cmp.alerts;
  const auto& verdict = cmp.verdict;
  const collector::RankOnsets* onsets = &r.onsets;
  PrintVerdict(verdict, exit_code);
  std::printf("\n");
  std::printf("baseline  %s  (%s)\ncandidate %s  (%s)\n", r.baseline.c_str(), path_a.c_str(), r.candidate.c_str(),
              path_b.c_str());
  PrintSettings(settings);
  if (r.stats_only) {
    std::printf("  note: statistics only: a run is an import of a statistics dump (msprobe); its tensors are judged on "
                "max, min, mean and norm, lower bounds of their distance, without std, sketch or histogram "
                "(docs/msprobe.md)\n");
  }
  std::printf("steps compared: %s  (only in baseline: %llu, only in candidate: %llu, not compared: %llu)\n",
              collector::StepsTimesRanks(r.steps_compared, r.ranks).c_str(), static_cast<unsigned long long>(r.steps_only_baseline),
              static_cast<unsigned long long>(r.steps_only_candidate), static_cast<unsigned long long>(r.steps_evicted));
  if (r.loss_b_given || r.loss_c_given) {
    // A NaN loss the job gave is "NaN"; "-" is a run that gave none.
    auto loss = [](double v, bool given) { return !given ? std::string("-") : std::isnan(v) ? "NaN" : G(v, "%.6g"); };
    std::printf("loss at the last compared step: %s vs %s\n", loss(r.loss_b, r.loss_b_given).c_str(),
                loss(r.loss_c, r.loss_c_given).c_str());
  }
  if (!r.setup_known) {
    std::printf("\nsetup: not compared (a run sent no fingerprint)\n");
  } else if (r.setup.empty()) {
    std::printf("\nsetup: the same (%s)\n", r.setup_note.empty() ? "fingerprints equal" : "no setting differs");
  } else {
    std::printf("\nSETUP: %zu setting(s) differ\n", r.setup.size());
    for (const auto& d : r.setup) {
      std::printf("  [%-7s] %-11s %s: %s vs %s\n", alerting::SeverityName(d.severity), d.category.c_str(), d.key.c_str(),
                  d.baseline.c_str(), d.candidate.c_str());
    }
  }
  if (r.setup_known && !r.setup_note.empty()) std::printf("  note: %s\n", r.setup_note.c_str());
  if (r.diverged) {
    const auto& a = r.first_divergence;
    if (!a.cause.empty()) std::printf("\ncause: %s\n", a.cause.c_str());
    std::string where = collector::FirstDivergenceWhere(a, onsets);
    if (where.rfind("rank ", 0) != 0) where = "on " + where;  // "on all 4 ranks"
    std::printf("\nFIRST DIVERGENCE (%s): step %llu %s: %s %s\n  %s\n", alerting::SeverityName(a.severity),
                static_cast<unsigned long long>(a.step), where.c_str(),
                a.tensor.c_str(), a.kind.c_str(), collector::WithWhere(a.message, a, onsets).c_str());
    // The ops ranked by the error they add at that step (the birth rule's view).
    for (const auto& b : r.births) {
      if (b.step != a.step || b.rank != a.rank) continue;
      std::printf("\nops by the error they add at step %llu rank %u (output error / (gain x input error + rounding)):\n",
                  static_cast<unsigned long long>(b.step), b.rank);
      for (const auto& o : b.ops) {
        std::printf("  %8s  %-48s %-8s in %9s  out %9s  %s\n", G(o.ratio, "%.3g").c_str(), o.name.c_str(), o.pass.c_str(),
                    G(o.input_error, "%.2e").c_str(), G(o.output_error, "%.2e").c_str(), o.born ? "adds error" : "");
      }
      break;
    }
  } else {
    std::printf("\nno tensor drifted beyond its tolerance and no op added error of its own\n");
  }
  for (const auto& [rc, v] : cmp.replays) {
    std::printf("\nREPLAY of %s at step %llu (each run on its host, float64): %s%s\n  %s\n", rc.row.c_str(),
                static_cast<unsigned long long>(rc.step), v.verdict.c_str(),
                v.cause.empty() ? "" : (" (cause " + v.cause + ")").c_str(), v.message.c_str());
  }
  // The rank column only when several ranks were compared: the rank of the worst step.
  const bool ranks = r.ranks > 1;
  std::printf("\n%5s  %-48s %-10s %-9s %11s %11s %9s %9s %9s %6s%s  %s\n", "order", "tensor", "kind", "dtype", "l2 base",
              "l2 cand", "rel_l2", "rel_dist", "cosine", "step", ranks ? "  rank" : "", "status");
  for (const auto& t : r.tensors) {
    std::string name = t.label.empty() ? t.name : t.label;
    if (t.micro_step) name += "[micro " + std::to_string(t.micro_step) + "]";
    std::string dtype = t.dtype_b == t.dtype_c ? t.dtype_b : t.dtype_b + "/" + t.dtype_c;
    std::string status = t.status;
    if (t.first_drift_step >= 0) status += " since " + std::to_string(t.first_drift_step);
    char rank[16] = "";
    if (ranks) std::snprintf(rank, sizeof rank, "  %4u", t.rank);
    std::printf("%5u  %-48s %-10s %-9s %11s %11s %9s %9s %9s %6llu%s  %s\n", t.order, name.c_str(), t.kind.c_str(),
                dtype.c_str(), G(t.b_l2).c_str(), G(t.c_l2).c_str(), G(t.rel_l2, "%.2e").c_str(),
                G(t.rel_dist, "%.2e").c_str(), G(t.cosine, "%.6f").c_str(),
                static_cast<unsigned long long>(t.worst_step), rank, status.c_str());
  }
  if (!r.unmatched.empty()) {
    std::printf("\ntensors on one side only (not compared):\n");
    for (const auto& u : r.unmatched) {
      std::printf("  %-48s %-10s only in %-9s from step %llu (%llu steps)\n", u.name.c_str(), u.kind.c_str(),
                  u.side.c_str(), static_cast<unsigned long long>(u.first_step),
                  static_cast<unsigned long long>(u.steps));
    }
  }
  std::printf("\nalerts: %llu (critical %llu, warning %llu, info %llu)\n",
              static_cast<unsigned long long>(cmp.alerts.size()),
              static_cast<unsigned long long>(cmp.alerts_critical),
              static_cast<unsigned long long>(cmp.alerts_warning),
              static_cast<unsigned long long>(cmp.alerts_info));
  if (r.trends_downstream > 0) {
    std::printf("  and %llu trend(s) downstream of the first divergence, counted in it, not listed as alerts\n",
                static_cast<unsigned long long>(r.trends_downstream));
  }
  size_t shown = 0;
  for (const auto& a : alerts) {
    if (a.severity == alerting::Severity::kInfo) continue;
    if (++shown > 20) {
      std::printf("  ... (%zu more; --json or --alerts-file lists all)\n", alerts.size() - 20);
      break;
    }
    std::printf("  [%s] %s step %llu: %s\n", alerting::SeverityName(a.severity), a.rule.c_str(),
                static_cast<unsigned long long>(a.step), a.message.c_str());
  }
}

void PrintJson(const PairReport& r, const std::vector<alerting::Alert>& alerts, bool critical,
               const collector::GateVerdict& verdict, int exit_code, const OfflineSettings& settings,
               const std::vector<collector::OfflineComparison::Replay>& replays) {
  std::string s;
  JsonOut j(&s);
  j.BeginObject();
  j.Key("verdict").BeginObject();
  j.Key("exit").Int(exit_code);
  j.Key("pass").Bool(exit_code == kExitOk);
  j.Key("lines").BeginArray();
  for (const auto& l : verdict.lines) j.Str(l);
  j.EndArray();
  j.Key("problems").BeginArray();
  for (const auto& p : verdict.problems) j.Str(p);
  j.EndArray();
  j.Key("steps_compared").Uint(verdict.steps_compared);
  j.Key("steps_expected").Uint(verdict.steps_expected);
  j.Key("tensor_names_shared").Uint(verdict.tensors_shared);
  j.Key("tensor_names_baseline").Uint(verdict.tensors_baseline);
  j.Key("tensor_names_candidate").Uint(verdict.tensors_candidate);
  j.EndObject();
  j.Key("settings").BeginObject();
  j.Key("source").Str(settings.source);
  j.Key("file");
  if (settings.file.empty()) {
    j.Null();
  } else {
    j.Str(settings.file);
  }
  j.Key("recorded_by").Str(settings.recorded_version);
  j.Key("rules").BeginObject();
  for (const auto& [k, v] : settings.values) j.Key(k).Str(v);
  j.EndObject();
  j.Key("from_file").BeginArray();
  for (const auto& n : settings.from_file) j.Str(n);
  j.EndArray();
  j.Key("from_flags").BeginArray();
  for (const auto& n : settings.from_flags) j.Str(n);
  j.EndArray();
  j.Key("name_map").Str(settings.name_map);
  j.EndObject();
  j.Key("experiment").Str(r.experiment);
  j.Key("baseline").Str(r.baseline);
  j.Key("candidate").Str(r.candidate);
  j.Key("steps_compared").Uint(r.steps_compared);
  j.Key("ranks").Uint(r.ranks);
  j.Key("steps_only_baseline").Uint(r.steps_only_baseline);
  j.Key("steps_only_candidate").Uint(r.steps_only_candidate);
  j.Key("steps_not_compared").Uint(r.steps_evicted);
  j.Key("critical").Bool(critical);
  j.Key("statistics_only").Bool(r.stats_only);
  j.Key("trends_downstream").Uint(r.trends_downstream);
  j.Key("setup").BeginObject();
  j.Key("known").Bool(r.setup_known);
  if (!r.setup_note.empty()) j.Key("note").Str(r.setup_note);  // only when something was left out
  j.Key("differences").BeginArray();
  for (const auto& d : r.setup) {
    j.BeginObject();
    j.Key("key").Str(d.key);
    j.Key("baseline").Str(d.baseline);
    j.Key("candidate").Str(d.candidate);
    j.Key("category").Str(d.category);
    j.Key("severity").Str(alerting::SeverityName(d.severity));
    j.EndObject();
  }
  j.EndArray();
  j.EndObject();
  j.Key("first_divergence");
  if (r.diverged) {
    collector::WriteAlertJson(r.first_divergence, &j);
  } else {
    j.Null();
  }
  j.Key("births").BeginArray();
  for (const auto& b : r.births) {
    j.BeginObject();
    j.Key("step").Uint(b.step);
    j.Key("rank").Uint(b.rank);
    j.Key("ops").BeginArray();
    for (const auto& o : b.ops) {
      j.BeginObject();
      j.Key("name").Str(o.name);
      if (!o.module_type.empty()) j.Key("module_type").Str(o.module_type);
      j.Key("pass").Str(o.pass);
      j.Key("input_error").Double(o.input_error);
      j.Key("output_error").Double(o.output_error);
      j.Key("explained").Double(o.explained);
      j.Key("ratio").Double(o.ratio);
      j.Key("born").Bool(o.born);
      j.EndObject();
    }
    j.EndArray();
    j.EndObject();
  }
  j.EndArray();
  j.Key("births_truncated").Bool(r.births_truncated);
  j.Key("tensors").BeginArray();
  for (const auto& t : r.tensors) {
    j.BeginObject();
    j.Key("name").Str(t.name);
    if (!t.aliases.empty()) {
      j.Key("aliases").BeginArray();
      for (const auto& a : t.aliases) j.Str(a);
      j.EndArray();
    }
    j.Key("kind").Str(t.kind);
    j.Key("micro_step").Uint(t.micro_step);
    j.Key("order").Uint(t.order);
    j.Key("dtype_baseline").Str(t.dtype_b);
    j.Key("dtype_candidate").Str(t.dtype_c);
    j.Key("steps").Uint(t.steps);
    j.Key("worst_step").Uint(t.worst_step);
    j.Key("rank").Uint(t.rank);
    j.Key("l2_baseline").Double(t.b_l2);
    j.Key("l2_candidate").Double(t.c_l2);
    j.Key("rel_err_l2").Double(t.rel_l2);
    j.Key("rel_err_mean").Double(t.rel_mean);
    j.Key("rel_err_absmax").Double(t.rel_absmax);
    j.Key("rel_err_std").Double(t.rel_std);
    j.Key("cosine").Double(t.cosine);
    j.Key("rel_dist").Double(t.rel_dist);
    j.Key("kl").Double(t.kl);
    j.Key("score").Double(t.score);
    j.Key("threshold").Double(t.threshold);
    j.Key("metric").Str(t.metric);
    j.Key("first_drift_step").Int(t.first_drift_step);
    j.Key("status").Str(t.status);
    j.EndObject();
  }
  j.EndArray();
  j.Key("unmatched").BeginArray();
  for (const auto& u : r.unmatched) {
    j.BeginObject();
    j.Key("name").Str(u.name);
    j.Key("kind").Str(u.kind);
    j.Key("side").Str(u.side);
    j.Key("first_step").Uint(u.first_step);
    j.Key("steps").Uint(u.steps);
    j.EndObject();
  }
  j.EndArray();
  // The captures both runs replayed on their hosts, as the live "replay" alerts say.
  j.Key("replays").BeginArray();
  for (const auto& [rc, v] : replays) {
    j.BeginObject();
    j.Key("tensor").Str(rc.row);
    j.Key("step").Uint(rc.step);
    j.Key("verdict").Str(v.verdict);
    j.Key("cause");
    if (v.cause.empty()) {
      j.Null();
    } else {
      j.Str(v.cause);
    }
    if (!v.less_accurate.empty()) j.Key("less_accurate").Str(v.less_accurate);
    j.Key("baseline_file").Str(rc.file_b);
    j.Key("candidate_file").Str(rc.file_c);
    j.Key("message").Str(v.message);
    j.EndObject();
  }
  j.EndArray();
  j.Key("alerts").BeginArray();
  for (const auto& a : alerts) collector::WriteAlertJson(a, &j);
  j.EndArray();
  j.EndObject();
  std::printf("%s\n", s.c_str());
}

}  // namespace

int CompareCommand(int argc, const char* const* argv) {
  // Logs go to stderr: stdout carries the table or the --json object, for pipes.
  auto logger = spdlog::get("compare");
  if (!logger) logger = spdlog::stderr_color_mt("compare");
  spdlog::set_default_logger(logger);
  bool json = false, default_settings = false;
  std::string name_map, alerts_file, rename_b, rename_c;
  int64_t max_buffered = 0;  // AddAlignFlags sets the default
  AnalyzerOptions opt;
  std::string format = "text";
  FlagSet fs("compare", "compare BASELINE CANDIDATE [FLAGS]   (each a run log, or an msprobe dump folder: docs/msprobe.md)",
             "Aligns two recorded run logs step by step and tensor by tensor, runs every detector, and prints a "
             "verdict of five lines (first divergence, first NaN/Inf and its producer, loss gap, steps compared of "
             "steps expected), then the settings used, the first divergence and a per-tensor table. The detection "
             "settings lockstep collect recorded next to the logs (<run>.settings.toml) are used unless a flag "
             "overrides them. As a CI gate it exits with the first that applies of 3 (a log unreadable, corrupt "
             "or truncated), 6 (the runs share under half their tensor names: not the same model), 5 (under 90 % "
             "of the expected steps compared), 1 (a critical divergence, NaN or overflow), else 0.");
  fs.Bool("json", &json, "print one JSON object instead of the table");
  fs.String("format", &format,
            "text (the default), json (as --json), or msprobe-csv: the per-tensor table in the columns of msprobe's "
            "statistics compare result, then lockstep's own (docs/msprobe.md)",
            "FORMAT");
  AddAlignFlags(&fs, &name_map, &max_buffered);
  fs.String("alerts-file", &alerts_file, "also write every alert as one JSON line to FILE", "FILE");
  AddDefaultSettingsFlag(&fs, &default_settings);
  fs.String("rename-baseline", &rename_b,
            "take the baseline's run as ID (to compare two recordings of one run id)", "ID");
  fs.String("rename-candidate", &rename_c,
            "take the candidate's run as ID (to compare two recordings of one run id)", "ID");
  AddRuleFlags(&fs, &opt.rules);
  Status st = fs.Parse(argc, argv);
  if (fs.help_requested()) {
    std::printf("%s", fs.Help().c_str());
    return kExitOk;
  }
  auto fail = [](int code, const std::string& msg) {
    std::fprintf(stderr, "lockstep compare: %s\n", OneLine(msg, 1000).c_str());  // one line, whatever a value holds
    return code;
  };
  if (!st.ok()) return fail(kExitUsage, st.message());
  if (fs.positional().size() != 2) {
    return fail(kExitUsage, "give exactly two run logs, the baseline then the candidate "
                            "(e.g. lockstep compare data/gpu-run.lslog data/npu-run.lslog)");
  }
  for (const auto* id : {&rename_b, &rename_c}) {
    if (!id->empty() && !IsValidRunId(*id)) {
      return fail(kExitUsage, "'" + *id + "' is not a run id (1-128 characters of A-Z a-z 0-9 . _ -, not "
                              "starting with '.')");
    }
  }
  const std::string path_a = fs.positional()[0], path_b = fs.positional()[1];
  if (format != "text" && format != "json" && format != "msprobe-csv") {
    return fail(kExitUsage, "--format " + format + " is not one of text, json, msprobe-csv");
  }
  if (format == "json") json = true;
  // An msprobe dump folder is imported to a temporary run log first (docs/msprobe.md).
  DumpInputs dumps;
  std::string log_a = path_a, log_b = path_b;
  if (Status s = dumps.Resolve(&log_a, &log_b); !s.ok()) return fail(kExitBadInput, s.message());

  // Settings: recorded next to the candidate's log (else the baseline's), then the
  // flags given here on top (cli/offline_pair.h, shared with report).
  OfflineSettings si;
  std::string error;
  if (int code = ResolveOfflineSettings(fs, log_a, log_b, default_settings, name_map, &opt, &si, &error)) {
    return fail(code, error);
  }
  opt.max_buffered_steps = static_cast<size_t>(max_buffered);
  std::unique_ptr<collector::JsonlAlertFile> jsonl;
  if (!alerts_file.empty()) {
    auto f = collector::JsonlAlertFile::Open(alerts_file);
    if (!f.ok()) return fail(kExitUsage, f.status().message());
    jsonl = std::move(*f);
  }

  // The pipeline itself is service/offline_compare's, the same for `report`.
  collector::OfflineCompareSpec spec;
  spec.baseline_path = log_a;
  spec.candidate_path = log_b;
  spec.rename_baseline = rename_b;
  spec.rename_candidate = rename_c;
  spec.options = std::move(opt);
  if (jsonl) spec.on_alert = [&jsonl](const alerting::Alert& a) { jsonl->Write(a); };
  collector::OfflineComparison cmp;
  switch (collector::CompareRunLogs(std::move(spec), &cmp, &error)) {
    case collector::OfflineProblem::kNone: break;
    case collector::OfflineProblem::kBadInput: return fail(kExitBadInput, error);
    case collector::OfflineProblem::kSameRun:
      return fail(kExitUsage, error + "; give one of them another name for this comparison with --rename-baseline ID "
                                      "or --rename-candidate ID (e.g. --rename-baseline " + cmp.baseline_id + "-before)");
  }
  const auto& verdict = cmp.verdict;
  int code = kExitOk;
  switch (verdict.outcome) {
    case collector::GateOutcome::kOk: code = kExitOk; break;
    case collector::GateOutcome::kFinding: code = kExitFinding; break;
    case collector::GateOutcome::kBadInput: code = kExitBadInput; break;
    case collector::GateOutcome::kTooFewSteps: code = kExitTooFewSteps; break;
    case collector::GateOutcome::kNotSameModel: code = kExitNotSameModel; break;
  }
  if (format == "msprobe-csv") {
    WriteMsprobeCsv(cmp.report, log_a, log_b, stdout);
    return code;
  }
  if (json) {
    PrintJson(cmp.report, cmp.alerts, cmp.critical, verdict, code, si, cmp.replays);
  } else {
    PrintText(cmp, path_a, path_b, code, si);
  }
  return code;
}

}  // namespace lockstep::cli
