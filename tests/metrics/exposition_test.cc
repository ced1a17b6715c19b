#include "metrics/exposition.h"

#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>

namespace lockstep::collector::metrics {
namespace {

TEST(TextWriter, WritesHelpTypeAndSamplesInOrder) {
  TextWriter w;
  w.Family("lockstep_x_total", MetricType::kCounter, "Things.");
  w.Sample({{"run", "a"}, {"rank", "0"}}, uint64_t{18446744073709551615ull});
  w.Sample({}, uint64_t{0});
  w.Family("lockstep_y_seconds", MetricType::kSummary, "Time.");
  w.SampleSuffix("_sum", {{"run", "a"}}, 1.5);
  w.SampleSuffix("_count", {{"run", "a"}}, 3.0);
  EXPECT_EQ(w.Take(),
            "# HELP lockstep_x_total Things.\n"
            "# TYPE lockstep_x_total counter\n"
            "lockstep_x_total{run=\"a\",rank=\"0\"} 18446744073709551615\n"
            "lockstep_x_total 0\n"
            "# HELP lockstep_y_seconds Time.\n"
            "# TYPE lockstep_y_seconds summary\n"
            "lockstep_y_seconds_sum{run=\"a\"} 1.5\n"
            "lockstep_y_seconds_count{run=\"a\"} 3\n");
}

TEST(TextWriter, EscapesLabelValuesAndHelp) {
  TextWriter w;
  w.Family("m", MetricType::kGauge, "a \\ b\nc \"q\"");
  w.Sample({{"l", "x\"y\\z\nw"}}, 1.0);
  EXPECT_EQ(w.Take(),
            "# HELP m a \\\\ b\\nc \"q\"\n"
            "# TYPE m gauge\n"
            "m{l=\"x\\\"y\\\\z\\nw\"} 1\n");
}

TEST(FormatValue, SpellsSpecialValuesAsPrometheusReadsThem) {
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(0.1), "0.1");  // shortest round trip, not 0.10000000000000001
  EXPECT_EQ(FormatValue(-2.5e-300), "-2.5e-300");
  EXPECT_EQ(std::stod(FormatValue(1.0 / 3.0)), 1.0 / 3.0);
}

TEST(Names, FollowThePrometheusGrammar) {
  EXPECT_TRUE(IsValidMetricName("lockstep_a:b_total"));
  EXPECT_TRUE(IsValidMetricName("_x9"));
  EXPECT_FALSE(IsValidMetricName("9x"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_TRUE(IsValidLabelName("run"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
  EXPECT_FALSE(IsValidLabelName("__name__"));
}

#ifdef NDEBUG
TEST(TextWriter, SkipsAnInvalidFamilyInReleaseBuilds) {
  TextWriter w;
  w.Family("bad-name", MetricType::kGauge, "x");
  w.Sample({}, 1.0);
  w.Family("good", MetricType::kGauge, "x");
  w.Sample({}, 2.0);
  EXPECT_EQ(w.Take(), "# HELP good x\n# TYPE good gauge\ngood 2\n");
}
#endif

}  // namespace
}  // namespace lockstep::collector::metrics
