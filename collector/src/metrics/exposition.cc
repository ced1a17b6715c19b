#include "metrics/exposition.h"

#include <cassert>
#include <charconv>
#include <cmath>

namespace lockstep::collector::metrics {
namespace {

bool NameChar(char c, bool first, bool colon_ok) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return true;
  if (colon_ok && c == ':') return true;
  return !first && c >= '0' && c <= '9';
}

bool ValidName(std::string_view name, bool colon_ok) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i)
    if (!NameChar(name[i], i == 0, colon_ok)) return false;
  return true;
}

const char* TypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kSummary: return "summary";
    default: return "untyped";
  }
}

}  // namespace

bool IsValidMetricName(std::string_view name) { return ValidName(name, true); }

bool IsValidLabelName(std::string_view name) {
  return ValidName(name, false) && name.substr(0, 2) != "__";
}

void AppendEscapedLabelValue(std::string* out, std::string_view v) {
  for (char c : v) {
    if (c == '\\') out->append("\\\\");
    else if (c == '"') out->append("\\\"");
    else if (c == '\n') out->append("\\n");
    else out->push_back(c);
  }
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip
  return std::string(buf, r.ptr);
}

void TextWriter::Family(std::string_view name, MetricType type, std::string_view help) {
  bool fresh = names_.emplace(name).second;
  assert(fresh && "a metric family is written twice in one scrape");
  assert(IsValidMetricName(name));
  skip_ = !fresh || !IsValidMetricName(name);
  if (skip_) return;
  family_.assign(name);
  out_.append("# HELP ").append(name).push_back(' ');
  // HELP escapes only backslash and newline (format 0.0.4).
  for (char c : help) {
    if (c == '\\') out_.append("\\\\");
    else if (c == '\n') out_.append("\\n");
    else out_.push_back(c);
  }
  out_.append("\n# TYPE ").append(name).push_back(' ');
  out_.append(TypeName(type)).push_back('\n');
}

void TextWriter::Head(std::string_view suffix, std::initializer_list<Label> labels) {
  out_.append(family_).append(suffix);
  if (labels.size() > 0) {
    out_.push_back('{');
    bool first = true;
    for (const auto& [k, v] : labels) {
      assert(IsValidLabelName(k));
      if (!first) out_.push_back(',');
      first = false;
      out_.append(k).append("=\"");
      AppendEscapedLabelValue(&out_, v);
      out_.push_back('"');
    }
    out_.push_back('}');
  }
  out_.push_back(' ');
}

void TextWriter::Sample(std::initializer_list<Label> labels, uint64_t value) {
  if (skip_) return;
  Head("", labels);
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof(buf), value);
  out_.append(buf, r.ptr).push_back('\n');
}

void TextWriter::SampleSuffix(std::string_view suffix, std::initializer_list<Label> labels, double value) {
  if (skip_) return;
  Head(suffix, labels);
  out_.append(FormatValue(value)).push_back('\n');
}

}  // namespace lockstep::collector::metrics
