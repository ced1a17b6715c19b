#include "rules/setup_rule.h"

#include <algorithm>
#include <charconv>

namespace lockstep::collector {
namespace {

using alerting::Severity;

bool StartsWith(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// "float32[8, 4]" -> dtype "float32", rest "[8, 4]"; false if not of that form.
bool SplitParam(const std::string& v, std::string* dtype, std::string* rest) {
  size_t i = v.find('[');
  if (i == std::string::npos || i == 0 || v.back() != ']') return false;
  *dtype = v.substr(0, i);
  *rest = v.substr(i);
  return true;
}

constexpr const char* kAbsent = "(absent)";

std::string Category(const std::string& key, const std::string& b, const std::string& c) {
  if (StartsWith(key, "version.") || StartsWith(key, "device.") || key == "dist.rank" ||
      StartsWith(key, "fingerprint.")) {
    return "environment";
  }
  // A variable set on one side only is mostly a platform's own (CUBLAS_* on the GPU,
  // HCCL_* on the NPU); one set to different values is a setting that differs.
  if (StartsWith(key, "env.") && (b == kAbsent || c == kAbsent)) return "environment";
  if (key == "amp" || StartsWith(key, "amp.") || StartsWith(key, "dtype.") || StartsWith(key, "math.")) {
    return "precision";
  }
  if (StartsWith(key, "module.")) {
    std::string db, rb, dc, rc;
    if (SplitParam(b, &db, &rb) && SplitParam(c, &dc, &rc) && rb == rc && db != dc) return "precision";
  }
  return "config";
}

constexpr const char* kStepKey = "fingerprint.step";

// "optim.group3.lr" -> "optim.group3." and "lr"; false for any other key.
bool SplitOptimKey(const std::string& key, std::string* group, std::string* name) {
  constexpr size_t n = sizeof("optim.group") - 1;
  if (!StartsWith(key, "optim.group")) return false;
  size_t i = n;
  while (i < key.size() && key[i] >= '0' && key[i] <= '9') ++i;
  if (i == n || i >= key.size() || key[i] != '.') return false;
  *group = key.substr(0, i + 1);
  *name = key.substr(i + 1);
  return true;
}

// What torch's LR schedulers move step by step: lr, and momentum / betas (OneCycleLR,
// CyclicLR). Their base value stays in `initial_lr` (max_lr, base_momentum...), compared.
bool IsScheduled(const std::string& key) {
  std::string group, name;
  return SplitOptimKey(key, &group, &name) && (name == "lr" || name == "momentum" || name == "betas");
}

// The step a fingerprint was read at, or -1 (an agent that does not say).
int64_t ReadStep(const Fingerprint& f) {
  auto it = f.find(kStepKey);
  if (it == f.end()) return -1;
  int64_t v = -1;
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() && v >= 0 ? v : -1;
}

}  // namespace

std::vector<SetupDiff> DiffFingerprints(const Fingerprint& b, const Fingerprint& c, std::string* note) {
  std::vector<SetupDiff> out;
  auto add_diff = [&](const std::string& key, const std::string& vb, const std::string& vc) {
    SetupDiff d;
    d.key = key;
    d.baseline = vb;
    d.candidate = vc;
    d.category = Category(key, vb, vc);
    d.severity = d.category == "environment" ? Severity::kInfo : Severity::kWarning;
    out.push_back(std::move(d));
  };
  if (note != nullptr) note->clear();
  const int64_t step_b = ReadStep(b), step_c = ReadStep(c);
  // Read at different steps (a resume under a new run id reads it at its start_step):
  // a scheduled value differs by design; the scalars rule compares lr step by step.
  const bool apart = step_b >= 0 && step_c >= 0 && step_b != step_c;
  std::string skipped;  // the first few scheduled values that differ, for the note
  size_t n_skipped = 0;
  // A scheduler made after watch() on one side only leaves initial_lr out there. The
  // side read earlier then stands for it with its lr (not yet scheduled): equal is no
  // difference; unequal shows that lr.
  auto base_lr = [&](const Fingerprint& f, int64_t f_step, int64_t other_step, const std::string& key,
                     std::string* lr) {
    std::string group, name;
    if (!apart || f_step > other_step || !SplitOptimKey(key, &group, &name) || name != "initial_lr") return false;
    auto it = f.find(group + "lr");
    if (it == f.end()) return false;
    *lr = it->second;
    return true;
  };
  auto add = [&](const std::string& key, const std::string& vb, const std::string& vc) {
    if (key == kStepKey) return;
    if (apart && IsScheduled(key)) {
      if (++n_skipped <= 3) skipped += (skipped.empty() ? "" : "; ") + key + " " + vb + " vs " + vc;
      return;
    }
    std::string lr;
    if (vb == kAbsent && base_lr(b, step_b, step_c, key, &lr)) {
      if (lr == vc) return;
      return add_diff(key, "(absent; lr " + lr + ")", vc);
    }
    if (vc == kAbsent && base_lr(c, step_c, step_b, key, &lr)) {
      if (lr == vb) return;
      return add_diff(key, vb, "(absent; lr " + lr + ")");
    }
    add_diff(key, vb, vc);
  };
  auto ib = b.begin(), ic = c.begin();
  while (ib != b.end() || ic != c.end()) {
    if (ic == c.end() || (ib != b.end() && ib->first < ic->first)) {
      add(ib->first, ib->second, kAbsent);
      ++ib;
    } else if (ib == b.end() || ic->first < ib->first) {
      add(ic->first, kAbsent, ic->second);
      ++ic;
    } else {
      if (ib->second != ic->second) add(ib->first, ib->second, ic->second);
      ++ib;
      ++ic;
    }
  }
  if (apart && note != nullptr) {
    if (n_skipped > 3) skipped += "; +" + std::to_string(n_skipped - 3) + " more";
    *note = "the fingerprints were read at step " + std::to_string(step_b) + " vs " + std::to_string(step_c) +
            " (a run resumed under its own run id): the optimizer's scheduled values (lr, momentum, betas) are not "
            "compared" + (skipped.empty() ? std::string() : " (" + skipped + ")") +
            "; lr is compared step by step by the scalars rule when step(lr=) is given";
  }
  return out;
}

std::string DescribeSetup(const std::vector<SetupDiff>& diffs, size_t max_items) {
  std::vector<const SetupDiff*> order;
  for (const auto& d : diffs) order.push_back(&d);
  std::stable_sort(order.begin(), order.end(), [](const SetupDiff* x, const SetupDiff* y) {
    return static_cast<int>(x->severity) > static_cast<int>(y->severity);
  });
  size_t warnings = 0;
  for (const auto& d : diffs) warnings += d.severity != Severity::kInfo;
  std::string s = std::to_string(diffs.size()) + (diffs.size() == 1 ? " setting differs" : " settings differ");
  s += " (" + std::to_string(warnings) + " to check, " + std::to_string(diffs.size() - warnings) + " info)";
  for (size_t i = 0; i < order.size() && i < max_items; ++i) {
    s += (i == 0 ? ": " : "; ") + order[i]->key + " " + order[i]->baseline + " vs " + order[i]->candidate;
  }
  if (order.size() > max_items) s += "; (+" + std::to_string(order.size() - max_items) + " more)";
  return s;
}

}  // namespace lockstep::collector
