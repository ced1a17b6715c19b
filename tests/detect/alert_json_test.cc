// One Alert -> JSON encoder (issue 18): the file `lockstep compare --alerts-file` writes
// (collector JsonlAlertFile) and the collector's jsonl alert sink (alerting Dispatcher)
// produce the same line for the same alert, with the union of the fields both had.
#include "detect/alert_json.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "lockstep/alerting/alert_json.h"
#include "lockstep/alerting/dispatcher.h"
#include "lockstep/common/json_out.h"

namespace lockstep::collector {
namespace {

using nlohmann::json;

alerting::Alert FullAlert() {
  alerting::Alert a;
  a.id = "first_divergence/exp/blocks.2/7";
  a.rule = "first_divergence";
  a.severity = alerting::Severity::kCritical;
  a.experiment = "exp";
  a.runs = {"base", "cand"};
  a.step = 7;
  a.rank = 3;
  a.tensor = "blocks.2";
  a.kind = "act";
  a.baseline_value = 1.5;
  a.candidate_value = 1.75;
  a.metric = "rel_err_l2";
  a.error = 0.125;
  a.threshold = std::nan("");
  a.first_seen_unix_ns = 1714564800123000000;
  a.repeat_count = 1;
  a.message = "blocks.2 output diverges first at step 7";
  a.incident = "divergence/exp/base/cand";
  a.cause = "precision";
  return a;
}

std::string TempPath(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("lockstep_alert_json_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

TEST(AlertJson, CompareAlertsFileAndTheJsonlSinkWriteTheSameLine) {
  const alerting::Alert a = FullAlert();

  const std::string compare_path = TempPath("compare.jsonl");
  auto f = JsonlAlertFile::Open(compare_path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_TRUE((*f)->Write(a));
  f->reset();

  alerting::AlertingOptions o;
  alerting::SinkOptions sink;
  sink.kind = "jsonl";
  sink.target = TempPath("sink.jsonl");
  o.sinks = {sink};
  auto d = alerting::Dispatcher::Create(o);
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_TRUE((*d)->Submit(a));
  ASSERT_TRUE((*d)->Flush(std::chrono::seconds(5)));
  (*d)->Shutdown(std::chrono::seconds(1));

  const std::string from_compare = FirstLine(compare_path);
  const std::string from_sink = FirstLine(sink.target);
  ASSERT_FALSE(from_compare.empty());
  EXPECT_EQ(from_compare, from_sink);
  std::filesystem::remove_all(std::filesystem::path(compare_path).parent_path());

  // The union of the two old encoders' fields.
  json j = json::parse(from_compare);
  EXPECT_EQ(j["source"], "lockstep");
  EXPECT_EQ(j["run"], "cand");  // the collector's: the last of runs
  EXPECT_EQ(j["runs"], json({"base", "cand"}));
  EXPECT_EQ(j["dedup_key"], a.DedupKey());  // the sink's
  EXPECT_EQ(j["first_seen"], "2024-05-01T12:00:00.123Z");
  EXPECT_EQ(j["first_seen_unix_ns"], 1714564800123000000);
  EXPECT_EQ(j["incident"], "divergence/exp/base/cand");
  EXPECT_EQ(j["cause"], "precision");
  EXPECT_EQ(j["rank"], 3);
  EXPECT_DOUBLE_EQ(j["error"].get<double>(), 0.125);
  EXPECT_TRUE(j["threshold"].is_null());  // NaN
}

TEST(AlertJson, TheReportEmbedsTheSameObject) {
  const alerting::Alert a = FullAlert();
  std::string s;
  JsonOut j(&s);
  j.BeginArray();
  WriteAlertJson(a, &j);
  j.EndArray();
  EXPECT_EQ(s, "[" + alerting::AlertToJson(a, 0) + "]");
  // Offline (now = 0) an alert without a first-seen time does not depend on the clock.
  alerting::Alert b = a;
  b.first_seen_unix_ns = 0;
  EXPECT_EQ(AlertToJson(b), AlertToJson(b));
  EXPECT_EQ(json::parse(AlertToJson(b))["first_seen_unix_ns"], 0);
}

}  // namespace
}  // namespace lockstep::collector
