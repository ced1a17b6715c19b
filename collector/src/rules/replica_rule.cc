#include "rules/replica_rule.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <string>
#include <vector>

namespace lockstep::collector {
namespace {

using alerting::Severity;

bool SameBits(double a, double b) {
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b);
}

std::string Num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// The first statistic in which `b` differs from `a` (the lowest rank's), or nullptr;
// its two values in *va, *vb. The float sums (mean, std, l2, sketch) only when both
// came from the host kernel, whose sums repeat bit for bit too (replica_rule.h).
const char* FirstDifference(const ReplicaDetector::Row& a, const ReplicaDetector::Row& b,
                            double* va, double* vb) {
  const StatRow& x = a.stat;
  const StatRow& y = b.stat;
  struct Count {
    const char* name;
    uint64_t x, y;
  };
  const Count counts[] = {{"numel", x.numel, y.numel},
                          {"nan_count", x.nan_count, y.nan_count},
                          {"inf_count", x.inf_count, y.inf_count},
                          {"zero_count", x.zero_count, y.zero_count},
                          {"sat_count", x.sat_count, y.sat_count},
                          {"subnormal_count", x.subnormal_count, y.subnormal_count}};
  struct Value {
    const char* name;
    double x, y;
  };
  const Value exact[] = {
      {"min", x.min, y.min}, {"max", x.max, y.max}, {"absmax", x.absmax, y.absmax}};
  const Value sums[] = {{"mean", x.mean, y.mean}, {"std", x.std, y.std}, {"l2", x.l2, y.l2}};
  auto found = [&](const char* name, double p, double q) {
    *va = p;
    *vb = q;
    return name;
  };
  for (const Count& c : counts)
    if (c.x != c.y) return found(c.name, static_cast<double>(c.x), static_cast<double>(c.y));
  for (const Value& v : exact)
    if (!SameBits(v.x, v.y)) return found(v.name, v.x, v.y);
  if (a.hist.size() == b.hist.size()) {
    for (size_t i = 0; i < a.hist.size(); ++i)
      if (a.hist[i] != b.hist[i]) return found("histogram", a.hist[i], b.hist[i]);
  }
  if (x.device || y.device) return nullptr;
  for (const Value& v : sums)
    if (!SameBits(v.x, v.y)) return found(v.name, v.x, v.y);
  if (a.sketch.size() == b.sketch.size()) {
    for (size_t i = 0; i < a.sketch.size(); ++i)
      if (std::bit_cast<uint32_t>(a.sketch[i]) != std::bit_cast<uint32_t>(b.sketch[i]))
        return found("sketch", a.sketch[i], b.sketch[i]);
  }
  return nullptr;
}

}  // namespace

void ReplicaDetector::OnStep(const StepData& s) {
  std::vector<Row> rows;
  for (const StatRow& r : s.rows) {
    if (KeyKind(r.key) != Kind::kGradReduced) continue;
    Row row;
    row.stat = r;
    if (const float* k = s.SketchOf(r)) row.sketch.assign(k, k + r.sketch_k);
    if (const uint32_t* h = s.HistOf(r)) row.hist.assign(h, h + r.hist_bins);
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return;
  auto& ranks = pending_[s.step];
  ranks[s.rank] = std::move(rows);  // rows arrive sorted by key (step_data.h)
  const uint32_t world = ctx_->world_size != nullptr ? *ctx_->world_size : 0;
  if (world >= 2 && ranks.size() >= world) {
    Judge(s.step, ranks);
    pending_.erase(s.step);
  }
  while (pending_.size() > kMaxPending) pending_.erase(pending_.begin());
}

void ReplicaDetector::Judge(uint64_t step, const std::map<uint32_t, std::vector<Row>>& ranks) {
  const uint32_t low = ranks.begin()->first;
  const std::vector<Row>& ref = ranks.begin()->second;
  // The first differing parameter in execution order (the lowest rank's order), then
  // the lowest rank: the same answer whatever order the ranks arrived in.
  const Row* first_ref = nullptr;
  const Row* first_other = nullptr;
  uint32_t first_rank = 0;
  const char* first_field = nullptr;
  double va = 0, vb = 0;
  size_t n_params = 0;
  std::vector<uint32_t> bad_ranks;
  std::vector<uint64_t> bad_keys;
  for (auto it = std::next(ranks.begin()); it != ranks.end(); ++it) {
    const std::vector<Row>& other = it->second;
    bool rank_bad = false;
    size_t i = 0, j = 0;
    while (i < ref.size() && j < other.size()) {
      if (ref[i].stat.key < other[j].stat.key) {
        ++i;
      } else if (other[j].stat.key < ref[i].stat.key) {
        ++j;
      } else {
        double a = 0, b = 0;
        if (const char* field = FirstDifference(ref[i], other[j], &a, &b)) {
          rank_bad = true;
          bad_keys.push_back(ref[i].stat.key);
          if (first_ref == nullptr || ref[i].stat.order < first_ref->stat.order) {
            first_ref = &ref[i];
            first_other = &other[j];
            first_rank = it->first;
            first_field = field;
            va = a;
            vb = b;
          }
        }
        ++i;
        ++j;
      }
    }
    if (rank_bad) bad_ranks.push_back(it->first);
  }
  if (first_ref == nullptr) return;
  std::sort(bad_keys.begin(), bad_keys.end());
  n_params = static_cast<size_t>(std::unique(bad_keys.begin(), bad_keys.end()) - bad_keys.begin());
  const StatRow& r = first_other->stat;
  auto a = ctx_->Make(rule(), Severity::kCritical, step, first_rank);
  a.tensor = ctx_->names->Name(KeyNameId(r.key));
  a.kind = KindName(Kind::kGradReduced);
  a.micro_step = KeyMicroStep(r.key);
  a.metric = first_field;
  a.baseline_value = va;
  a.candidate_value = vb;
  a.error = static_cast<double>(n_params);
  a.threshold = 0;
  std::string ranks_text;
  for (uint32_t b : bad_ranks) ranks_text += (ranks_text.empty() ? "" : ", ") + std::to_string(b);
  a.message = "run " + ctx_->run + " step " + std::to_string(step) +
              ": the data-parallel replicas disagree after the gradient all-reduce: the reduced "
              "gradient of " +
              ctx_->names->Display(KeyNameId(r.key)) + " on rank " + std::to_string(first_rank) +
              " differs from rank " + std::to_string(low) + " (" + first_field + " " + Num(vb) +
              " vs " + Num(va) + "); " + std::to_string(n_params) +
              " parameter(s) differ, on rank(s) " + ranks_text + " of " +
              std::to_string(ranks.size()) +
              ". It must be bit-identical on every replica: silent data corruption, or a rank "
              "that skipped or corrupted the reduction";
  ctx_->out->Emit(std::move(a));
}

}  // namespace lockstep::collector
