#include "detect/setup_rule.h"

#include <algorithm>

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

}  // namespace

std::vector<SetupDiff> DiffFingerprints(const Fingerprint& b, const Fingerprint& c) {
  std::vector<SetupDiff> out;
  auto add = [&](const std::string& key, const std::string& vb, const std::string& vc) {
    SetupDiff d;
    d.key = key;
    d.baseline = vb;
    d.candidate = vc;
    d.category = Category(key, vb, vc);
    d.severity = d.category == "environment" ? Severity::kInfo : Severity::kWarning;
    out.push_back(std::move(d));
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
