// `lockstep report A B -o report.html` (or --data-dir DIR --experiment NAME): the
// comparison `lockstep compare` makes, drawn as one self-contained HTML page
// (docs/report.md). The same pipeline and verdict as compare (service/offline_compare.h);
// a ReportRecorder on its pair-step hook keeps the per-(tensor, step) scores and the
// step scalars, so each log is read once.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/dump_inputs.h"
#include "cli/align_flags.h"
#include "cli/commands.h"
#include "cli/output_flag.h"
#include "lockstep/common/flags.h"
#include "cli/offline_pair.h"
#include "cli/rule_flags.h"
#include "detect/compare_gate.h"
#include "rules/detection_settings.h"
#include "lockstep/schema/lockstep_generated.h"
#include "report/report_page.h"
#include "report/report_recorder.h"
#include "runlog/log_format.h"
#include "runlog/log_reader.h"
#include "service/offline_compare.h"

namespace lockstep::cli {
namespace {

#ifndef LOCKSTEP_VERSION
#define LOCKSTEP_VERSION "unknown"
#endif

using collector::LogReader;

struct LogHello {
  std::string path, run_id, experiment;
  wire::Role role = wire::Role::Solo;
};

// The first Hello of a log, or an error sentence.
StatusOr<LogHello> HelloOf(const std::string& path) {
  auto r = LogReader::Open(path);
  if (!r.ok()) return Status::InvalidArgument("cannot open run log '" + path + "': " + r.status().message());
  LogReader::Record rec;
  while ((*r)->Next(&rec) == LogReader::Result::kRecord) {
    auto env = LogReader::Envelope(rec);
    if (!env.ok() || (*env)->body_type() != wire::Body::Hello) continue;
    const auto* h = (*env)->body_as_Hello();
    LogHello out;
    out.path = path;
    out.run_id = (*env)->run_id() ? (*env)->run_id()->str() : "";
    out.experiment = h->experiment() ? h->experiment()->str() : "";
    out.role = h->role();
    return out;
  }
  return Status::InvalidArgument("run log '" + path + "' holds no Hello message; is it a run log?");
}

// The baseline's and the candidate's logs of `experiment` in a collector's data dir.
StatusOr<std::pair<std::string, std::string>> FindExperimentLogs(const std::string& dir, const std::string& exp) {
  std::error_code ec;
  std::vector<std::string> logs;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == collector::runlog::kLogSuffix) logs.push_back(e.path().string());
  }
  if (ec) return Status::InvalidArgument("cannot read the data dir '" + dir + "': " + ec.message());
  std::sort(logs.begin(), logs.end());
  std::string base, cand, seen;
  for (const auto& p : logs) {
    auto h = HelloOf(p);
    if (!h.ok()) continue;
    if (seen.find("'" + h->experiment + "'") == std::string::npos) {
      seen += (seen.empty() ? "'" : ", '") + h->experiment + "'";
    }
    if (h->experiment != exp) continue;
    if (h->role == wire::Role::Baseline && base.empty()) base = p;
    if (h->role == wire::Role::Candidate && cand.empty()) cand = p;
  }
  if (base.empty() || cand.empty()) {
    return Status::InvalidArgument("the data dir '" + dir + "' holds no " + (base.empty() ? "baseline" : "candidate") +
                                   " log of experiment '" + exp + "'" +
                                   (seen.empty() ? std::string(" (it holds no run log)")
                                                 : " (experiments there: " + seen + ")"));
  }
  return std::make_pair(base, cand);
}

std::string UtcNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

int ExitOf(collector::GateOutcome o) {
  switch (o) {
    case collector::GateOutcome::kOk: return kExitOk;
    case collector::GateOutcome::kFinding: return kExitFinding;
    case collector::GateOutcome::kBadInput: return kExitBadInput;
    case collector::GateOutcome::kTooFewSteps: return kExitTooFewSteps;
    case collector::GateOutcome::kNotSameModel: return kExitNotSameModel;
  }
  return kExitOk;
}

}  // namespace

int ReportCommand(int argc, const char* const* argv) {
  auto logger = spdlog::get("report");
  if (!logger) logger = spdlog::stderr_color_mt("report");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::warn);
  std::string output, data_dir, experiment, name_map;
  bool default_settings = false;
  int64_t max_cols = 400, max_tensors = 2000, max_buffered = 0;
  collector::AnalyzerOptions opt;
  FlagSet fs("report", "report BASELINE.lslog CANDIDATE.lslog -o REPORT.html [FLAGS]\n"
                       "       lockstep report --data-dir DIR --experiment NAME -o REPORT.html",
             "Compares two recorded run logs as `lockstep compare` does (same alignment, detectors, settings "
             "and verdict) and writes the result as one self-contained HTML page: the verdict with the settings "
             "used, a heatmap of every tensor's drift score by step (hover for numbers, click for the tensor's "
             "history), both runs' loss, grad norm, lr, loss scale and step time, the per-tensor table, the "
             "alerts and the tensors found in one run only. The page loads nothing from anywhere (it works "
             "offline and can be attached to a bug report). Long runs are downsampled to --max-columns step "
             "columns, which the page says. Exits 0 when the page was written, whatever it shows; 2 on a usage "
             "error; 3 when a log is missing or unreadable.");
  fs.String("output", &output, "the HTML file to write (also -o FILE)", "FILE");
  fs.String("data-dir", &data_dir, "a collector's data dir: report the experiment's baseline and candidate logs", "DIR");
  fs.String("experiment", &experiment, "with --data-dir: the experiment to report", "NAME");
  AddAlignFlags(&fs, &name_map, &max_buffered);
  AddDefaultSettingsFlag(&fs, &default_settings);
  fs.Int("max-columns", &max_cols, "step columns of the heatmap (more steps are merged, worst cell kept)");
  fs.Int("max-tensors", &max_tensors, "tensors in the heatmap (the table lists every tensor)");
  AddRuleFlags(&fs, &opt.rules);
  Status st = ParseWithShortOutput(&fs, argc, argv);
  if (fs.help_requested()) {
    std::printf("%s", fs.Help().c_str());
    return kExitOk;
  }
  auto fail = [](int code, const std::string& msg) {
    std::fprintf(stderr, "lockstep report: %s\n", OneLine(msg, 1000).c_str());  // one line, whatever a value holds
    return code;
  };
  if (!st.ok()) return fail(kExitUsage, st.message());
  if (output.empty()) return fail(kExitUsage, "give the HTML file to write with -o FILE (e.g. -o report.html)");
  if (max_cols < 2 || max_tensors < 1) return fail(kExitUsage, "--max-columns needs at least 2 and --max-tensors at least 1");
  std::string path_a, path_b;
  if (!data_dir.empty()) {
    if (experiment.empty() || !fs.positional().empty()) {
      return fail(kExitUsage, "with --data-dir give --experiment NAME and no log files");
    }
    auto logs = FindExperimentLogs(data_dir, experiment);
    if (!logs.ok()) return fail(kExitBadInput, logs.status().message());
    path_a = logs->first;
    path_b = logs->second;
  } else if (fs.positional().size() == 2) {
    path_a = fs.positional()[0];
    path_b = fs.positional()[1];
  } else {
    return fail(kExitUsage, "give two run logs, the baseline then the candidate (e.g. lockstep report "
                            "data/gpu-run.lslog data/npu-run.lslog -o report.html; msprobe dump folders are "
                            "read too), or --data-dir DIR --experiment NAME");
  }

  // An msprobe dump folder is imported to a temporary run log first (docs/msprobe.md);
  // the page names the folders given.
  const std::string given_a = path_a, given_b = path_b;
  DumpInputs dumps;
  if (Status s = dumps.Resolve(&path_a, &path_b); !s.ok()) return fail(kExitBadInput, s.message());
  auto cand_hello = HelloOf(path_b);
  if (!cand_hello.ok()) return fail(kExitBadInput, cand_hello.status().message());

  // Settings as compare takes them (cli/offline_pair.h): recorded next to the
  // candidate's log (else the baseline's), the flags given here on top.
  collector::ReportHeader hdr;
  OfflineSettings settings;
  std::string error;
  if (int code = ResolveOfflineSettings(fs, path_a, path_b, default_settings, name_map, &opt, &settings, &error)) {
    return fail(code, error);
  }
  hdr.settings_source = settings.source;
  hdr.settings = settings.NonDefault();
  hdr.notes = settings.notes;
  if (!settings.name_map.empty()) hdr.notes.push_back("name map: " + settings.name_map);
  opt.max_buffered_steps = static_cast<size_t>(max_buffered);

  collector::ReportLimits limits;
  limits.max_cols = static_cast<uint32_t>(std::min<int64_t>(max_cols, 100000));
  limits.max_tensors = static_cast<uint32_t>(std::min<int64_t>(max_tensors, 1000000));
  collector::ReportRecorder recorder(limits);
  // The pipeline is compare's (service/offline_compare.h); the recorder keeps the
  // per-(tensor, step) scores and the step scalars on the way. The pair is labelled
  // with the candidate's experiment (the recorder and the alerts are keyed by it).
  collector::OfflineCompareSpec spec;
  spec.baseline_path = path_a;
  spec.candidate_path = path_b;
  spec.experiment = cand_hello->experiment.empty() ? "report" : cand_hello->experiment;
  spec.options = std::move(opt);
  spec.on_alert = [&recorder](const alerting::Alert& a) { recorder.OnAlert(a); };
  spec.on_pair_step = [&recorder](const collector::PairCtx& ctx, const collector::PairStepView& v) {
    recorder.OnPairStep(ctx, v);
  };
  collector::OfflineComparison cmp;
  switch (collector::CompareRunLogs(std::move(spec), &cmp, &error)) {
    case collector::OfflineProblem::kNone: break;
    case collector::OfflineProblem::kBadInput: return fail(kExitBadInput, error);
    case collector::OfflineProblem::kSameRun:
      return fail(kExitUsage, error + "; compare them with lockstep compare --rename-baseline ID");
  }
  const auto& verdict = cmp.verdict;
  if (cmp.report.stats_only) {
    hdr.notes.push_back("statistics only: a run is an import of a statistics dump (msprobe); its tensors are judged "
                        "on max, min, mean and norm, lower bounds of their distance, without std, sketch or "
                        "histogram (docs/msprobe.md)");
  }
  hdr.generated_by = std::string("lockstep ") + LOCKSTEP_VERSION + " report";
  hdr.generated_at = UtcNow();
  hdr.path_b = given_a;
  hdr.path_c = given_b;
  hdr.exit_code = ExitOf(verdict.outcome);
  std::string json = collector::ReportJson(hdr, cmp.report, verdict, recorder);
  const std::string page = collector::ReportHtml(json);
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  out << page;
  out.close();
  if (!out) return fail(kExitUsage, "cannot write the report to '" + output + "'; check the path and its directory");
  std::printf("report: %s (%.1f KB); verdict: %s\n", output.c_str(), page.size() / 1024.0,
              verdict.lines.empty() ? "-" : verdict.lines.front().c_str());
  return kExitOk;
}

}  // namespace lockstep::cli
