// `lockstep compare A B`: the live aligner and detectors over two recorded run logs.
// A is the baseline, B the candidate, whatever roles their Hellos announce. A is read
// at B's pace (Analyzer::AddBaselineLog), so memory stays bounded for any log length.
// Prints the first divergence and a per-tensor table (or --json), and exits 1 when a
// critical alert was raised, so a short smoke run can gate CI.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/flags.h"
#include "detect/alert_json.h"
#include "detect/analyzer.h"
#include "lockstep/schema/lockstep_generated.h"
#include "runlog/json_out.h"
#include "runlog/log_reader.h"

namespace lockstep::cli {
namespace {

using collector::Analyzer;
using collector::AnalyzerOptions;
using collector::JsonOut;
using collector::LogReader;
using collector::PairReport;

std::string G(double x, const char* fmt = "%.4g") {
  if (std::isnan(x)) return "-";
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, x);
  return buf;
}

// The run id of a log (from its first Hello), or a one-sentence error.
StatusOr<std::string> RunIdOf(const std::string& path) {
  auto r = LogReader::Open(path);
  if (!r.ok()) return r.status();  // names the path and the reason (a directory: its run logs)
  LogReader::Record rec;
  while ((*r)->Next(&rec) == LogReader::Result::kRecord) {
    auto env = LogReader::Envelope(rec);
    if (env.ok() && (*env)->run_id()) return (*env)->run_id()->str();
  }
  return Status::InvalidArgument("run log '" + path + "' holds no readable message");
}

void PrintText(const PairReport& r, const std::string& path_a, const std::string& path_b,
               const std::vector<alerting::Alert>& alerts, const collector::AlertEmitter& em) {
  std::printf("baseline  %s  (%s)\ncandidate %s  (%s)\n", r.baseline.c_str(), path_a.c_str(), r.candidate.c_str(),
              path_b.c_str());
  std::printf("steps compared: %llu  (only in baseline: %llu, only in candidate: %llu, not compared: %llu)\n",
              static_cast<unsigned long long>(r.steps_compared), static_cast<unsigned long long>(r.steps_only_baseline),
              static_cast<unsigned long long>(r.steps_only_candidate), static_cast<unsigned long long>(r.steps_evicted));
  if (!std::isnan(r.loss_b)) {
    std::printf("loss at the last compared step: %s vs %s\n", G(r.loss_b, "%.6g").c_str(), G(r.loss_c, "%.6g").c_str());
  }
  if (r.diverged) {
    const auto& a = r.first_divergence;
    std::printf("\nFIRST DIVERGENCE (%s): step %llu rank %u: %s %s\n  %s\n", alerting::SeverityName(a.severity),
                static_cast<unsigned long long>(a.step), a.rank, a.tensor.c_str(), a.kind.c_str(), a.message.c_str());
  } else {
    std::printf("\nno tensor drifted beyond its tolerance\n");
  }
  std::printf("\n%5s  %-48s %-10s %-9s %11s %11s %9s %9s %9s %6s  %s\n", "order", "tensor", "kind", "dtype", "l2 base",
              "l2 cand", "rel_l2", "rel_dist", "cosine", "step", "status");
  for (const auto& t : r.tensors) {
    std::string name = t.name;
    if (t.micro_step) name += "[micro " + std::to_string(t.micro_step) + "]";
    std::string dtype = t.dtype_b == t.dtype_c ? t.dtype_b : t.dtype_b + "/" + t.dtype_c;
    std::string status = t.status;
    if (t.first_drift_step >= 0) status += " since " + std::to_string(t.first_drift_step);
    std::printf("%5u  %-48s %-10s %-9s %11s %11s %9s %9s %9s %6llu  %s\n", t.order, name.c_str(), t.kind.c_str(),
                dtype.c_str(), G(t.b_l2).c_str(), G(t.c_l2).c_str(), G(t.rel_l2, "%.2e").c_str(),
                G(t.rel_dist, "%.2e").c_str(), G(t.cosine, "%.6f").c_str(),
                static_cast<unsigned long long>(t.worst_step), status.c_str());
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
              static_cast<unsigned long long>(em.total()),
              static_cast<unsigned long long>(em.count(alerting::Severity::kCritical)),
              static_cast<unsigned long long>(em.count(alerting::Severity::kWarning)),
              static_cast<unsigned long long>(em.count(alerting::Severity::kInfo)));
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

void PrintJson(const PairReport& r, const std::vector<alerting::Alert>& alerts, bool critical) {
  std::string s;
  JsonOut j(&s);
  j.BeginObject();
  j.Key("experiment").Str(r.experiment);
  j.Key("baseline").Str(r.baseline);
  j.Key("candidate").Str(r.candidate);
  j.Key("steps_compared").Uint(r.steps_compared);
  j.Key("steps_only_baseline").Uint(r.steps_only_baseline);
  j.Key("steps_only_candidate").Uint(r.steps_only_candidate);
  j.Key("steps_not_compared").Uint(r.steps_evicted);
  j.Key("critical").Bool(critical);
  j.Key("first_divergence");
  if (r.diverged) {
    collector::WriteAlertJson(r.first_divergence, &j);
  } else {
    j.Null();
  }
  j.Key("tensors").BeginArray();
  for (const auto& t : r.tensors) {
    j.BeginObject();
    j.Key("name").Str(t.name);
    j.Key("kind").Str(t.kind);
    j.Key("micro_step").Uint(t.micro_step);
    j.Key("order").Uint(t.order);
    j.Key("dtype_baseline").Str(t.dtype_b);
    j.Key("dtype_candidate").Str(t.dtype_c);
    j.Key("steps").Uint(t.steps);
    j.Key("worst_step").Uint(t.worst_step);
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
  bool json = false;
  std::string name_map, alerts_file;
  int64_t max_buffered = 64;
  AnalyzerOptions opt;
  FlagSet fs("compare", "compare BASELINE.lslog CANDIDATE.lslog [FLAGS]",
             "Aligns two recorded run logs step by step and tensor by tensor, runs every detector, and prints the "
             "first divergence and a per-tensor table.");
  fs.Bool("json", &json, "print one JSON object instead of the table");
  fs.String("name-map", &name_map, "file of 'REGEX => REPLACEMENT' rules mapping tensor names", "FILE");
  fs.String("alerts-file", &alerts_file, "also write every alert as one JSON line to FILE", "FILE");
  fs.Int("max-buffered-steps", &max_buffered, "steps a run may wait in memory for its partner");
  collector::AddRuleFlags(&fs, &opt.rules);
  Status st = fs.Parse(argc, argv);
  if (fs.help_requested()) {
    std::printf("%s", fs.Help().c_str());
    return kExitOk;
  }
  if (!st.ok()) {
    std::fprintf(stderr, "lockstep compare: %s\n", st.message().c_str());
    return kExitUsage;
  }
  if (fs.positional().size() != 2) {
    std::fprintf(stderr, "lockstep compare: give exactly two run logs, the baseline then the candidate "
                         "(e.g. lockstep compare data/gpu-run.lslog data/npu-run.lslog)\n");
    return kExitUsage;
  }
  const std::string path_a = fs.positional()[0], path_b = fs.positional()[1];
  if (!name_map.empty()) {
    auto c = collector::NameCanonicalizer::FromFile(name_map);
    if (!c.ok()) {
      std::fprintf(stderr, "lockstep compare: %s\n", c.status().message().c_str());
      return kExitUsage;
    }
    opt.canon = std::move(*c);
  }
  opt.max_buffered_steps = static_cast<size_t>(std::max<int64_t>(max_buffered, 1));
  opt.idle_close_ns = 0;  // offline: steps close on the data, never on a timer
  std::unique_ptr<collector::JsonlAlertFile> jsonl;
  if (!alerts_file.empty()) {
    auto f = collector::JsonlAlertFile::Open(alerts_file);
    if (!f.ok()) {
      std::fprintf(stderr, "lockstep compare: %s\n", f.status().message().c_str());
      return kExitUsage;
    }
    jsonl = std::move(*f);
  }
  auto cand_id = RunIdOf(path_b);
  if (!cand_id.ok()) {
    std::fprintf(stderr, "lockstep compare: %s\n", cand_id.status().message().c_str());
    return kExitBadInput;
  }

  std::vector<alerting::Alert> alerts;
  Analyzer an(std::move(opt), [&](alerting::Alert a) {
    if (jsonl) jsonl->Write(a);
    alerts.push_back(std::move(a));
  });
  an.OverrideRun(*cand_id, "compare", collector::RunRole::kCandidate);
  auto base_id = an.AddBaselineLog(path_a, "compare", /*run_rules=*/true);
  if (!base_id.ok()) {
    std::fprintf(stderr, "lockstep compare: %s\n", base_id.status().message().c_str());
    return kExitBadInput;
  }

  auto reader = LogReader::Open(path_b);
  if (!reader.ok()) {
    std::fprintf(stderr, "lockstep compare: cannot open run log '%s': %s\n", path_b.c_str(),
                 reader.status().message().c_str());
    return kExitBadInput;
  }
  LogReader::Record rec;
  uint64_t bad = 0;
  while (true) {
    auto res = (*reader)->Next(&rec);
    if (res == LogReader::Result::kRecord) {
      auto env = LogReader::Envelope(rec);
      if (!env.ok()) {
        ++bad;
        continue;
      }
      an.OnMessage(**env, rec.recv_unix_ns);
      continue;
    }
    if (res != LogReader::Result::kEnd) spdlog::warn("{}; comparing what came before it", (*reader)->problem());
    break;
  }
  if (bad > 0) spdlog::warn("{} unreadable message(s) in '{}' were skipped", bad, path_b);
  an.Finish();

  auto reports = an.Reports();
  const bool critical = an.emitter().count(alerting::Severity::kCritical) > 0;
  if (reports.empty()) {
    std::fprintf(stderr, "lockstep compare: the logs could not be paired\n");
    return kExitBadInput;
  }
  if (json) {
    PrintJson(reports.front(), alerts, critical);
  } else {
    PrintText(reports.front(), path_a, path_b, alerts, an.emitter());
  }
  return critical ? kExitFinding : kExitOk;
}

}  // namespace lockstep::cli
