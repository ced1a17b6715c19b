#include "cli/msprobe_csv.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

#include "lockstep/common/wire_names.h"
#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_reader.h"

namespace lockstep::cli {
namespace {

using Shapes = std::map<std::pair<std::string, std::string>, std::string>;  // (name, kind) -> "[4, 6, 16]"

// The first shape of each (name, kind) in a log's tensor directories (rank 0 first).
Shapes ReadShapes(const std::string& path) {
  Shapes out;
  auto r = collector::LogReader::Open(path);
  if (!r.ok()) return out;
  collector::LogReader::Record rec;
  while ((*r)->Next(&rec) == collector::LogReader::Result::kRecord) {
    auto env = collector::LogReader::Envelope(rec);
    if (!env.ok()) continue;
    const auto* d = (*env)->body_as_TensorDirectory();
    if (d == nullptr || d->tensors() == nullptr) continue;
    for (const auto* t : *d->tensors()) {
      if (t->name() == nullptr) continue;
      std::string shape = "[";
      if (t->shape() != nullptr) {
        for (size_t i = 0; i < t->shape()->size(); ++i) shape += (i ? ", " : "") + std::to_string(t->shape()->Get(i));
      }
      shape += "]";
      out.emplace(std::make_pair(t->name()->str(), std::string(wire::KindName(static_cast<uint8_t>(t->kind())))),
                  shape);
    }
  }
  return out;
}

// Python's str() of a float as msprobe's pandas writes it: the shortest text that reads back.
std::string Num(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[40];
  for (int p = 15; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}

// msprobe's "X diff" and "XRelativeErr" of one statistic (npu = candidate, bench = baseline):
// equal values "0"/"0"; a NaN on either side "NaN"; bench 0 "inf"; else the difference and
// |diff / bench| in percent.
std::pair<std::string, std::string> Diff(double npu, double bench) {
  if (npu == bench) return {"0", "0"};
  if (std::isnan(npu) || std::isnan(bench)) return {"NaN", "NaN"};
  if (std::isinf(npu) || std::isinf(bench)) {
    const std::string s = (npu - bench) > 0 ? "inf" : "-inf";
    return {s, s};
  }
  const double d = npu - bench;
  if (bench == 0) return {Num(d), "inf"};
  return {Num(d), Num(std::fabs(d / bench) * 100) + "%"};
}

const char* const kHeader[] = {
    // msprobe's CompareConst.SUMMARY_COMPARE_RESULT_HEADER (msprobe 26.2), in its order
    "NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
    "NPU Requires_grad", "Bench Requires_grad", "Max diff", "Min diff", "Mean diff", "L2norm diff",
    "MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr", "NPU max", "NPU min", "NPU mean",
    "NPU l2norm", "Bench max", "Bench min", "Bench mean", "Bench l2norm", "Requires_grad Consistent", "Result",
    "Err_message",
    // then lockstep's own
    "kind", "order", "step", "rank", "status", "score", "threshold", "metric", "rel_dist", "cosine",
    "statistics_only", "first_drift_step"};

void Row(const std::vector<std::string>& fields, FILE* out) {
  for (size_t i = 0; i < fields.size(); ++i) {
    std::fputs(CsvField(fields[i]).c_str(), out);
    std::fputc(i + 1 < fields.size() ? ',' : '\n', out);
  }
}

}  // namespace

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

void WriteMsprobeCsv(const collector::PairReport& r, const std::string& baseline_log, const std::string& candidate_log,
                     FILE* out) {
  const Shapes sb = ReadShapes(baseline_log), sc = ReadShapes(candidate_log);
  auto shape = [](const Shapes& s, const std::string& name, const std::string& kind) {
    const auto it = s.find({name, kind});
    return it == s.end() ? std::string("N/A") : it->second;
  };
  Row(std::vector<std::string>(std::begin(kHeader), std::end(kHeader)), out);
  for (const auto& t : r.tensors) {
    // The name a row is known by in both runs, with its kind: act and act_in of one
    // module share the module's name.
    const std::string name = t.name + (t.micro_step ? "[micro " + std::to_string(t.micro_step) + "]" : "") + ":" + t.kind;
    std::vector<std::string> f = {name, name, t.dtype_c, t.dtype_b, shape(sc, t.name, t.kind), shape(sb, t.name, t.kind),
                                  "N/A", "N/A"};
    const double npu[4] = {t.c_max, t.c_min, t.c_mean, t.c_l2}, bench[4] = {t.b_max, t.b_min, t.b_mean, t.b_l2};
    std::pair<std::string, std::string> d[4];
    for (int i = 0; i < 4; ++i) d[i] = Diff(npu[i], bench[i]);
    for (int i = 0; i < 4; ++i) f.push_back(d[i].first);
    for (int i = 0; i < 4; ++i) f.push_back(d[i].second);
    for (int i = 0; i < 4; ++i) f.push_back(Num(npu[i]));
    for (int i = 0; i < 4; ++i) f.push_back(Num(bench[i]));
    // Warning: the tensor drifted past its tolerance, or it is where the first divergence
    // was born (an op can add error below the drift tolerance: docs/rules.md).
    const bool born = r.diverged && r.first_divergence.tensor == t.name && r.first_divergence.kind == t.kind &&
                      r.first_divergence.micro_step == t.micro_step;
    const bool ok = t.status == "ok" && !born;
    f.push_back("N/A");
    f.push_back(ok ? "pass" : "Warning");
    f.push_back(ok     ? ""
                : born ? "first divergence: " + r.first_divergence.message
                       : t.metric + " " + Num(t.score) + "x its tolerance at step " + std::to_string(t.worst_step));
    f.insert(f.end(), {t.kind, std::to_string(t.order), std::to_string(t.worst_step), std::to_string(t.rank), t.status,
                       Num(t.score), Num(t.threshold), t.metric, Num(t.rel_dist), Num(t.cosine),
                       t.stats_only ? "true" : "false", std::to_string(t.first_drift_step)});
    Row(f, out);
  }
  for (const auto& u : r.unmatched) {
    const std::string name = u.name + ":" + u.kind;
    const bool npu = u.side == "candidate";
    std::vector<std::string> f = {npu ? name : "N/A", npu ? "N/A" : name};
    while (f.size() < 25) f.push_back("N/A");
    f.push_back("N/A");
    f.push_back(npu ? "No bench data matched." : "No NPU data matched.");
    f.insert(f.end(), {u.kind, "", std::to_string(u.first_step), "", "unmatched", "", "", "", "", "", "", ""});
    Row(f, out);
  }
}

}  // namespace lockstep::cli
