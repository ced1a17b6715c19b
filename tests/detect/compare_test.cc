// `lockstep compare` over run logs written with the real LogWriter.
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/commands.h"
#include "runlog/log_writer.h"
#include "stream_builder.h"

namespace lockstep::collector {
namespace {

using lockstep::testing::FakeScalars;
using lockstep::testing::FakeStat;
using lockstep::testing::FakeTensor;
using lockstep::testing::StreamBuilder;

std::string Dir() {
  std::string d = ::testing::TempDir() + "/compare_test_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::string cmd = "mkdir -p '" + d + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return d;
}

// Writes a 3-tensor run of `steps` steps; tensor 1 is scaled by `factor` from `from`.
std::string WriteRun(const std::string& dir, const std::string& run, wire::Role role, int steps, int from,
                     double factor, const std::string& prefix = "") {
  std::string path = dir + "/" + run + ".lslog";
  auto w = LogWriter::Open(path, false);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  StreamBuilder sb(run, "exp", role);
  auto put = [&](const std::vector<uint8_t>& m) {
    ASSERT_TRUE((*w)->Append(m.data(), static_cast<uint32_t>(m.size()), 1).ok());
  };
  put(sb.Hello());
  std::vector<FakeTensor> model;
  for (int i = 0; i < 3; ++i)
    model.push_back(FakeTensor{prefix + "blk." + std::to_string(i), wire::TensorKind::Act, wire::DType::F32,
                               static_cast<uint32_t>(i)});
  put(sb.Directory(model));
  for (int s = 0; s < steps; ++s) {
    std::vector<FakeStat> stats;
    for (int i = 0; i < 3; ++i) {
      std::vector<double> v(32);
      for (size_t j = 0; j < v.size(); ++j) v[j] = std::cos(0.3 * i + 0.1 * s + 0.2 * j);
      if (i >= 1 && s >= from) for (double& x : v) x *= factor;
      auto st = FakeStat::Vec(i, v);
      st.order = i;
      stats.push_back(st);
    }
    put(sb.Stats(s, stats));
    FakeScalars sc;
    sc.loss = 1.0;
    put(sb.Scalars(s, sc));
  }
  put(sb.Goodbye(steps - 1));
  EXPECT_TRUE((*w)->Sync().ok());
  return path;
}

int Compare(std::vector<std::string> args) {
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  return cli::CompareCommand(static_cast<int>(argv.size()), argv.data());
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(CompareCommand, IdenticalLogsExitZeroWithNoAlert) {
  auto d = Dir();
  auto a = WriteRun(d, "gpu", wire::Role::Baseline, 30, 0, 1.0);
  auto b = WriteRun(d, "npu", wire::Role::Candidate, 30, 0, 1.0, "module.");
  EXPECT_EQ(Compare({a, b, "--alerts-file", d + "/alerts.jsonl"}), cli::kExitOk);
  EXPECT_EQ(ReadAll(d + "/alerts.jsonl"), "");
}

TEST(CompareCommand, CriticalDivergenceExitsOneAndNamesTheTensor) {
  auto d = Dir();
  auto a = WriteRun(d, "gpu", wire::Role::Solo, 30, 12, 1.0);
  auto b = WriteRun(d, "npu", wire::Role::Solo, 25, 12, 1.1);  // roles ignored; shorter candidate
  EXPECT_EQ(Compare({a, b, "--json", "--alerts-file", d + "/alerts.jsonl"}), cli::kExitFinding);
  std::string alerts = ReadAll(d + "/alerts.jsonl");
  EXPECT_NE(alerts.find("\"rule\":\"first_divergence\""), std::string::npos) << alerts;
  EXPECT_NE(alerts.find("\"tensor\":\"blk.1\""), std::string::npos);
  EXPECT_NE(alerts.find("\"step\":12"), std::string::npos);
  EXPECT_NE(alerts.find("\"severity\":\"critical\""), std::string::npos);
  // A looser tolerance turns it into a pass.
  EXPECT_EQ(Compare({a, b, "--tol-fp32", "0.5"}), cli::kExitOk);
}

TEST(CompareCommand, UsageErrorsExitTwo) {
  auto d = Dir();
  auto a = WriteRun(d, "gpu", wire::Role::Baseline, 3, 0, 1.0);
  EXPECT_EQ(Compare({a}), cli::kExitUsage);
  EXPECT_EQ(Compare({a, d + "/missing.lslog"}), cli::kExitBadInput);
  EXPECT_EQ(Compare({a, a, "--no-such-flag"}), cli::kExitUsage);
  EXPECT_EQ(Compare({a, a, "--name-map", d + "/missing-map.txt"}), cli::kExitUsage);
}

}  // namespace
}  // namespace lockstep::collector
