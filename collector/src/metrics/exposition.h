// TextWriter: builds one scrape in the Prometheus text exposition format 0.0.4.
//
//   TextWriter w;
//   w.Family("lockstep_rank_records_total", MetricType::kCounter, "Records ...");
//   w.Sample({{"run", "a"}, {"rank", "0"}}, 1234);
//   w.Family(...);  ...
//   std::string body = w.Take();
//
// Each Family() writes its HELP and TYPE lines once; the samples that follow belong to
// it (a summary's `_sum` / `_count` samples via SampleSuffix). The caller names every
// family once per scrape; Family() checks the name's syntax and, in debug builds,
// that it was not used before. Label values are escaped (backslash, double quote,
// newline), HELP text too (backslash, newline). Values: integers exactly, doubles in
// their shortest round-trip form, NaN / +Inf / -Inf spelled as Prometheus reads them.
//
// Threads: one writer per scrape, used by one thread.
#ifndef LOCKSTEP_COLLECTOR_METRICS_EXPOSITION_H_
#define LOCKSTEP_COLLECTOR_METRICS_EXPOSITION_H_

#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>
#include <utility>

namespace lockstep::collector::metrics {

enum class MetricType : uint8_t { kCounter, kGauge, kSummary, kUntyped };

using Label = std::pair<std::string_view, std::string_view>;

// [a-zA-Z_:][a-zA-Z0-9_:]* (metric names); labels: [a-zA-Z_][a-zA-Z0-9_]*, not "__...".
bool IsValidMetricName(std::string_view name);
bool IsValidLabelName(std::string_view name);

// Appends `v` escaped for a label value: \ -> \\, " -> \", newline -> \n.
void AppendEscapedLabelValue(std::string* out, std::string_view v);
// Prometheus spelling of a sample value ("NaN", "+Inf", "-Inf", "0.25", "1e+300").
std::string FormatValue(double v);

class TextWriter {
 public:
  TextWriter() { out_.reserve(16 << 10); }

  // Starts a family. An invalid name is a programming error: it aborts in debug
  // builds and the family is skipped (with its samples) in release builds, so a scrape
  // never carries a line Prometheus would reject.
  void Family(std::string_view name, MetricType type, std::string_view help);
  void Sample(std::initializer_list<Label> labels, double value) { SampleSuffix("", labels, value); }
  void Sample(std::initializer_list<Label> labels, uint64_t value);
  // A sample named <family><suffix>, e.g. "_sum" and "_count" of a summary.
  void SampleSuffix(std::string_view suffix, std::initializer_list<Label> labels, double value);

  std::string Take() { return std::move(out_); }
  size_t families() const { return names_.size(); }

 private:
  void Head(std::string_view suffix, std::initializer_list<Label> labels);

  std::string out_;
  std::string family_;
  bool skip_ = false;
  std::set<std::string, std::less<>> names_;
};

}  // namespace lockstep::collector::metrics

#endif  // LOCKSTEP_COLLECTOR_METRICS_EXPOSITION_H_
