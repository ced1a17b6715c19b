#include "service/offline_compare.h"

#include <utility>

#include <spdlog/spdlog.h>

#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_reader.h"

namespace lockstep::collector {
namespace {

// Hands every record of the candidate's log to `an`, noting each message in *scan;
// stops at corruption or a torn tail, recorded in *scan with what came before it kept.
// An error only when the file cannot be opened.
Status FeedCandidateLog(const std::string& path, Analyzer* an, LogScan* scan) {
  auto reader = LogReader::Open(path);
  if (!reader.ok()) return reader.status();
  scan->path = path;
  LogReader::Record rec;
  while (true) {
    auto res = (*reader)->Next(&rec);
    if (res == LogReader::Result::kRecord) {
      ++scan->records;
      auto env = LogReader::Envelope(rec);
      if (!env.ok()) {
        ++scan->unreadable;  // counted: the verdict says the input was damaged
        continue;
      }
      scan->Add(**env);
      an->OnMessage(**env, rec.recv_unix_ns);
      continue;
    }
    if (res == LogReader::Result::kCorrupt) scan->corrupt = true;
    if (res == LogReader::Result::kTruncated) scan->truncated = true;
    if (res != LogReader::Result::kEnd) scan->problem = (*reader)->problem();
    break;
  }
  scan->thinned = LogReader::DescribeThinning((*reader)->thinned());
  return Status::OK();
}

}  // namespace

StatusOr<std::string> RunIdOfLog(const std::string& path) {
  auto r = LogReader::Open(path);
  if (!r.ok()) return r.status();  // names the path and the reason (a directory: its run logs)
  LogReader::Record rec;
  while ((*r)->Next(&rec) == LogReader::Result::kRecord) {
    auto env = LogReader::Envelope(rec);
    if (env.ok() && (*env)->run_id()) return (*env)->run_id()->str();
  }
  return Status::InvalidArgument("run log '" + path + "' holds no readable message");
}

OfflineProblem CompareRunLogs(OfflineCompareSpec spec, OfflineComparison* out, std::string* error) {
  // The baseline scanned whole here (the analyzer reads it again at the candidate's
  // pace), the candidate's run id from its first message.
  auto base_scan = ScanLog(spec.baseline_path);
  if (!base_scan.ok()) {
    *error = base_scan.status().message();
    return OfflineProblem::kBadInput;
  }
  if (base_scan->run_id.empty()) {
    *error = "run log '" + spec.baseline_path + "' holds no readable message" +
             (base_scan->problem.empty() ? "" : " (" + base_scan->problem + ")");
    return OfflineProblem::kBadInput;
  }
  auto cand_orig = RunIdOfLog(spec.candidate_path);
  if (!cand_orig.ok()) {
    *error = cand_orig.status().message();
    return OfflineProblem::kBadInput;
  }
  out->baseline_id = spec.rename_baseline.empty() ? base_scan->run_id : spec.rename_baseline;
  out->candidate_id = spec.rename_candidate.empty() ? *cand_orig : spec.rename_candidate;
  if (out->baseline_id == out->candidate_id) {
    *error = "both logs hold run " + out->baseline_id;
    return OfflineProblem::kSameRun;
  }
  out->baseline_scan = std::move(*base_scan);

  spec.options.idle_close_ns = 0;
  auto on_alert = std::move(spec.on_alert);
  Analyzer an(std::move(spec.options), [out, &on_alert](alerting::Alert a) {
    if (on_alert) on_alert(a);
    out->alerts.push_back(std::move(a));
  });
  if (spec.on_pair_step) an.SetPairStepObserver(std::move(spec.on_pair_step));
  if (!spec.rename_candidate.empty()) an.RenameRun(*cand_orig, spec.rename_candidate);
  // The baseline first: a candidate named before it would wait for one.
  auto added = an.AddBaselineLog(spec.baseline_path, spec.experiment, /*run_rules=*/true, spec.rename_baseline);
  if (!added.ok()) {
    *error = added.status().message();
    return OfflineProblem::kBadInput;
  }
  an.OverrideRun(out->candidate_id, spec.experiment, RunRole::kCandidate);
  if (Status fed = FeedCandidateLog(spec.candidate_path, &an, &out->candidate_scan); !fed.ok()) {
    *error = fed.message();
    return OfflineProblem::kBadInput;
  }
  const LogScan& cand = out->candidate_scan;
  if (!cand.problem.empty()) spdlog::warn("{}; comparing what came before it", cand.problem);
  if (cand.unreadable > 0) {
    spdlog::warn("{} unreadable message(s) in '{}' were skipped", cand.unreadable, spec.candidate_path);
  }
  an.Finish();
  // The live collector's "replay" alerts, from the same answers in the logs.
  for (ReplayCase& rc : PairReplays(out->baseline_scan, cand, spec.experiment, out->baseline_id, out->candidate_id)) {
    ReplayVerdict v = JudgeReplays(rc);
    alerting::Alert a = ReplayAlert(rc, v, rc.answered_unix_ns);
    if (on_alert) on_alert(a);
    out->alerts.push_back(std::move(a));
    out->replays.push_back({std::move(rc), std::move(v)});
  }

  auto reports = an.Reports();
  if (reports.empty()) {
    *error = "the logs could not be paired";
    return OfflineProblem::kBadInput;
  }
  out->report = std::move(reports.front());
  out->alerts_critical = an.emitter().count(alerting::Severity::kCritical);
  out->alerts_warning = an.emitter().count(alerting::Severity::kWarning);
  out->alerts_info = an.emitter().count(alerting::Severity::kInfo) + out->replays.size();
  out->critical = out->alerts_critical > 0;
  out->verdict = JudgeCompare(out->report, out->baseline_scan, out->candidate_scan, out->alerts, out->critical);
  return OfflineProblem::kNone;
}

}  // namespace lockstep::collector
