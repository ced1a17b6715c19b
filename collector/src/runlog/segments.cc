#include "runlog/segments.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "lockstep/common/wire.h"
#include "runlog/log_format.h"

namespace lockstep::collector::runlog {
namespace {

// "<stem>.lslog.<digits>" -> stem and number; false for any other name.
bool ParseSegmentName(const std::string& name, std::string* stem, uint64_t* number) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos || name.size() - dot - 1 < static_cast<size_t>(kSegmentDigits) ||
      name.size() - dot - 1 > 18)
    return false;
  uint64_t n = 0;
  for (size_t i = dot + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    n = n * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  const std::string head = name.substr(0, dot);
  if (head.size() <= kLogSuffix.size() ||
      head.compare(head.size() - kLogSuffix.size(), kLogSuffix.size(), kLogSuffix) != 0)
    return false;
  *stem = head.substr(0, head.size() - kLogSuffix.size());
  *number = n;
  return n > 0;
}

}  // namespace

std::vector<Segment> ListSegments(const std::string& log_path, uint64_t after) {
  namespace fs = std::filesystem;
  std::vector<Segment> out;
  const fs::path p(log_path);
  const std::string want = p.filename().string();
  fs::path dir = p.parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string stem;
    uint64_t n = 0;
    const std::string name = it->path().filename().string();
    if (!ParseSegmentName(name, &stem, &n) || n <= after) continue;
    if (stem + std::string(kLogSuffix) != want) continue;
    out.push_back({n, it->path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const Segment& a, const Segment& b) { return a.number < b.number; });
  return out;
}

std::vector<std::string> ListRunLogs(const std::string& data_dir) {
  namespace fs = std::filesystem;
  std::set<std::string> runs;
  std::error_code ec;
  for (fs::directory_iterator it(data_dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    const fs::path& p = it->path();
    std::string stem;
    uint64_t n = 0;
    if (p.extension() == kLogSuffix) {
      stem = p.stem().string();
    } else if (!ParseSegmentName(p.filename().string(), &stem, &n)) {
      continue;
    }
    if (IsValidRunId(stem)) runs.insert(stem);
  }
  return {runs.begin(), runs.end()};
}

}  // namespace lockstep::collector::runlog
