// Shared helpers for the alerting tests: a fully populated alert, a per-test temp
// dir, and HTTP sink options with test-sized timeouts.
#ifndef LOCKSTEP_TESTS_ALERTING_TEST_UTIL_H_
#define LOCKSTEP_TESTS_ALERTING_TEST_UTIL_H_

#include <filesystem>
#include <random>
#include <string>

#include "lockstep/alerting/alert.h"
#include "lockstep/alerting/options.h"

namespace lockstep::alerting::testing {

inline Alert SampleAlert(const std::string& id = "a1", const std::string& tensor = "layers.3.mlp") {
  Alert a;
  a.id = id;
  a.rule = "first_divergence";
  a.severity = Severity::kCritical;
  a.experiment = "glm-migration";
  a.runs = {"glm-gpu-01", "glm-npu-01"};
  a.step = 1234;
  a.rank = 3;
  a.micro_step = 2;
  a.tensor = tensor;
  a.kind = "act";
  a.baseline_value = 1.5;
  a.candidate_value = 2.25;
  a.metric = "rel_err_l2";
  a.error = 0.5;
  a.threshold = 0.01;
  a.first_seen_unix_ns = 1714564800123000000;  // 2024-05-01T12:00:00.123Z
  a.repeat_count = 1;
  a.message = "layers.3.mlp output diverges first at step 1234";
  return a;
}

inline std::string TempDir(const std::string& tag) {
  std::random_device rd;
  auto p = std::filesystem::temp_directory_path() /
           ("lockstep-" + tag + "-" + std::to_string(rd()) + std::to_string(rd()));
  std::filesystem::create_directories(p);
  return p.string();
}

inline SinkOptions HttpSink(const std::string& kind, const std::string& url) {
  SinkOptions s;
  s.kind = kind;
  s.target = url;
  s.connect_timeout = std::chrono::milliseconds(500);
  s.request_timeout = std::chrono::milliseconds(1000);
  s.max_retries = 2;
  s.backoff_base = std::chrono::milliseconds(10);
  s.backoff_max = std::chrono::milliseconds(40);
  s.rate_per_min = 0;
  return s;
}

}  // namespace lockstep::alerting::testing

#endif  // LOCKSTEP_TESTS_ALERTING_TEST_UTIL_H_
