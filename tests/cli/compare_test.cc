// `lockstep compare` over run logs written with the real LogWriter.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/commands.h"
#include "cli/rule_flags.h"
#include "lockstep/common/flags.h"
#include "read_file.h"
#include "rules/detection_settings.h"
#include "runlog/log_writer.h"
#include "stream_builder.h"

namespace lockstep::collector {
namespace {

using lockstep::testing::FakeScalars;
using lockstep::testing::FakeStat;
using lockstep::testing::FakeTensor;
using lockstep::testing::ReadFile;
using lockstep::testing::StreamBuilder;

std::string Dir() {
  std::string d = ::testing::TempDir() + "/compare_test_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(d);  // nothing left from an earlier run (e.g. a settings file)
  std::string cmd = "mkdir -p '" + d + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return d;
}

// Writes a 3-tensor run of `steps` steps; tensors 1 and 2 are scaled by `factor` from
// `from`. Steps for which `drop` says so are left out (a log with holes).
// `factor_at` (if given) is the factor of each step from `from` instead.
std::string WriteRun(const std::string& dir, const std::string& run, wire::Role role, int steps, int from,
                     double factor, const std::string& prefix = "", std::function<bool(int)> drop = nullptr,
                     std::function<double(int)> factor_at = nullptr) {
  std::string path = dir + "/" + run + ".lslog";
  // A small buffer: many compressed blocks, as a collector flushing each burst writes
  // (damage in the middle then leaves the blocks before it readable).
  auto w = LogWriter::Open(path, false, 4096);
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
    if (drop && drop(s)) continue;
    std::vector<FakeStat> stats;
    for (int i = 0; i < 3; ++i) {
      std::vector<double> v(32);
      for (size_t j = 0; j < v.size(); ++j) v[j] = std::cos(0.3 * i + 0.1 * s + 0.2 * j);
      if (i >= 1 && s >= from) for (double& x : v) x *= factor_at ? factor_at(s) : factor;
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

TEST(CompareCommand, IdenticalLogsExitZeroWithNoAlert) {
  auto d = Dir();
  auto a = WriteRun(d, "gpu", wire::Role::Baseline, 30, 0, 1.0);
  auto b = WriteRun(d, "npu", wire::Role::Candidate, 30, 0, 1.0, "module.");
  EXPECT_EQ(Compare({a, b, "--alerts-file", d + "/alerts.jsonl"}), cli::kExitOk);
  EXPECT_EQ(ReadFile(d + "/alerts.jsonl"), "");
}

TEST(CompareCommand, CriticalDivergenceExitsOneAndNamesTheTensor) {
  auto d = Dir();
  auto a = WriteRun(d, "gpu", wire::Role::Solo, 30, 12, 1.0);
  auto b = WriteRun(d, "npu", wire::Role::Solo, 25, 12, 1.1);  // roles ignored; shorter candidate
  EXPECT_EQ(Compare({a, b, "--json", "--alerts-file", d + "/alerts.jsonl"}), cli::kExitFinding);
  std::string alerts = ReadFile(d + "/alerts.jsonl");
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


// Runs compare with stdout captured: (exit code, stdout).
std::pair<int, std::string> CompareOut(std::vector<std::string> args) {
  ::testing::internal::CaptureStdout();
  int rc = Compare(std::move(args));
  return {rc, ::testing::internal::GetCapturedStdout()};
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string l; std::getline(ss, l);) out.push_back(l);
  return out;
}

TEST(CompareCommand, VerdictComesFirst) {
  auto d = Dir();
  auto a = WriteRun(d, "gpu", wire::Role::Baseline, 30, 12, 1.0);
  auto b = WriteRun(d, "npu", wire::Role::Candidate, 30, 12, 1.1);
  auto [rc, out] = CompareOut({a, b});
  EXPECT_EQ(rc, cli::kExitFinding);
  auto l = Lines(out);
  ASSERT_GE(l.size(), 6u) << out;
  EXPECT_EQ(l[0].rfind("verdict: FAIL (exit 1): a critical finding between gpu and npu", 0), 0u) << out;
  EXPECT_EQ(l[1].rfind("  first divergence (critical): blk.1 (act, order 1) at step 12 rank 0:", 0), 0u) << out;
  EXPECT_EQ(l[2], "  first NaN/Inf: none") << out;
  EXPECT_EQ(l[3].rfind("  loss at the last compared step: 1 (baseline) vs 1 (candidate), relative gap 0", 0), 0u)
      << out;
  EXPECT_EQ(l[4], "  steps compared: 30 of 30 expected (100 %); tensor names shared: 3 (baseline 3, candidate 3)")
      << out;
  EXPECT_EQ(l[5], "") << out;
  // The header that follows says where the settings came from.
  EXPECT_NE(out.find("settings: the defaults (no settings file next to the logs)"), std::string::npos) << out;
}

// Issue 30 item 6b: the headline named a downstream tensor that turned critical later
// ("tensor_drift of conv1 at step 2") where the first divergence was known.
TEST(CompareCommand, TheHeadlineNamesTheFirstDivergenceBeforeALaterCriticalAlert) {
  auto d = Dir();
  auto a = WriteRun(d, "gpu", wire::Role::Baseline, 30, 12, 1.0);
  // +0.5 % from step 12 (5x the fp32 tolerance: a warning), +50 % from step 20 (critical).
  auto b = WriteRun(d, "npu", wire::Role::Candidate, 30, 12, 1.0, "", nullptr,
                    [](int s) { return s < 20 ? 1.005 : 1.5; });
  auto [rc, out] = CompareOut({a, b});
  EXPECT_EQ(rc, cli::kExitFinding);
  auto l = Lines(out);
  ASSERT_GE(l.size(), 2u) << out;
  EXPECT_EQ(l[0], "verdict: FAIL (exit 1): a critical finding between gpu and npu: first divergence at blk.1 (act) "
                  "at step 12; first critical: tensor_drift of blk.1 (act) at step 20") << out;
  EXPECT_EQ(l[1].rfind("  first divergence (warning): blk.1 (act, order 1) at step 12 rank 0:", 0), 0u) << out;
}

TEST(CompareCommand, RecordedSettingsAreUsedAndFlagsOverrideThem) {
  auto d = Dir();
  // +0.5 %: over a 1e-4 fp32 tolerance by 50x (critical), under the default 1e-3 by
  // enough to stay a warning.
  auto a = WriteRun(d, "gpu", wire::Role::Baseline, 30, 12, 1.0);
  auto b = WriteRun(d, "npu", wire::Role::Candidate, 30, 12, 1.005);
  EXPECT_EQ(Compare({a, b}), cli::kExitOk);
  DetectionSettings s;
  s.rules.rtol.fp32 = 1e-4;
  s.lockstep_version = "9.9.9";
  ASSERT_TRUE(WriteSettingsFile(SettingsPathForLog(b), s, "npu").ok());
  EXPECT_EQ(SettingsPathForLog(b), d + "/npu.settings.toml");
  auto [rc, out] = CompareOut({a, b, "--alerts-file", d + "/alerts.jsonl"});
  EXPECT_EQ(rc, cli::kExitFinding) << out;
  EXPECT_NE(out.find("settings: recorded by lockstep 9.9.9 collect in " + d + "/npu.settings.toml"),
            std::string::npos) << out;
  EXPECT_NE(out.find("tol-fp32=1e-04 (recorded)"), std::string::npos) << out;
  EXPECT_NE(ReadFile(d + "/alerts.jsonl").find("\"step\":12"), std::string::npos);
  // A flag wins over the recorded value; --default-settings ignores the file.
  auto [rc2, out2] = CompareOut({a, b, "--tol-fp32", "1e-3"});
  EXPECT_EQ(rc2, cli::kExitOk) << out2;
  EXPECT_NE(out2.find("tol-fp32=0.001 (flag)"), std::string::npos) << out2;
  EXPECT_EQ(Compare({a, b, "--default-settings"}), cli::kExitOk);
  // Only next to the baseline: used too.
  std::filesystem::rename(SettingsPathForLog(b), SettingsPathForLog(a));
  EXPECT_EQ(Compare({a, b}), cli::kExitFinding);
  // A damaged settings file is bad input, named, with the way out.
  { std::ofstream(SettingsPathForLog(a)) << "[rules]\ntol-fp32 = \"tight\"\n"; }
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(Compare({a, b}), cli::kExitBadInput);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("gpu.settings.toml"), std::string::npos) << err;
  EXPECT_NE(err.find("--default-settings"), std::string::npos) << err;
  EXPECT_EQ(Compare({a, b, "--default-settings"}), cli::kExitOk);
}

TEST(CompareCommand, SettingsFileRoundTripsEveryRuleFlag) {
  RulesConfig c;
  c.rtol.fp64 = 1.5e-7;
  c.rtol.fp32 = 3e-4;
  c.rtol.fp16 = 0.02;
  c.rtol.bf16 = 0.07;
  c.rtol.fp8 = 0.3;
  c.atol = 1e-9;
  c.kl_max = 0.25;
  c.critical_factor = 7;
  c.max_tensor_alerts_per_step = 9;
  c.floor_steps = 11;
  c.floor_k = 2.5;
  c.loss_rtol.fp32 = 2e-3;
  c.loss_rtol.fp16 = 3e-2;
  c.loss_rtol.bf16 = 4e-2;
  c.trend_window = 12;
  c.scalar_rtol = 2e-5;
  c.grad_norm_rtol = 5e-2;
  c.trend_growth = 3.5;
  c.overflow_fp32_limit = false;
  c.underflow_fp32_limit = true;
  c.underflow_frac = 0.05;
  c.spike_loss_ratio = 2.5;
  c.spike_grad_ratio = 6;
  c.stall_s = 30;
  c.birth_gain = 4;
  c.birth_ulps = 64;
  auto want = RuleFlagValues(c);
  // Every value differs from its default, so a field left out of the list shows.
  auto defaults = RuleFlagValues(RulesConfig{});
  ASSERT_EQ(want.size(), defaults.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NE(want[i].second, defaults[i].second) << want[i].first;
  // The list names exactly the flags cli::AddRuleFlags declares.
  RulesConfig scratch;
  cli::FlagSet fs("compare", "", "");
  cli::AddRuleFlags(&fs, &scratch);
  std::set<std::string> declared, listed;
  for (const auto& line : Lines(fs.Help())) {
    if (line.rfind("  --", 0) != 0) continue;
    std::string name = line.substr(4, line.find(' ', 4) - 4);
    if (name != "config" && name != "help") declared.insert(name);
  }
  for (const auto& kv : want) listed.insert(kv.first);
  EXPECT_EQ(declared, listed) << fs.Help();
  auto d = Dir();
  DetectionSettings s{c, "^module\\.(.*) => $1\n", "1.2.3"};
  ASSERT_TRUE(WriteSettingsFile(d + "/r.settings.toml", s, "r").ok());
  std::vector<std::string> notes;
  auto back = ReadSettingsFile(d + "/r.settings.toml", &notes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(RuleFlagValues(back->rules), want);
  EXPECT_EQ(back->name_map, s.name_map);
  EXPECT_EQ(back->lockstep_version, "1.2.3");
  EXPECT_TRUE(notes.empty());
  // A key from a newer lockstep is skipped with a note, not an error.
  { std::ofstream(d + "/new.settings.toml") << "[rules]\ntol-fp32 = 0.01\nfuture-rule = 3\n"; }
  auto newer = ReadSettingsFile(d + "/new.settings.toml", &notes);
  ASSERT_TRUE(newer.ok()) << newer.status().ToString();
  EXPECT_EQ(newer->rules.rtol.fp32, 0.01);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("future-rule"), std::string::npos);
}

TEST(CompareCommand, CorruptOrTruncatedLogExitsThree) {
  auto d = Dir();
  auto a = WriteRun(d, "gpu", wire::Role::Baseline, 40, 0, 1.0);
  auto b = WriteRun(d, "npu", wire::Role::Candidate, 40, 0, 1.0);
  ASSERT_EQ(Compare({a, b}), cli::kExitOk);
  std::string bytes = ReadFile(b);
  // Flipped bytes in the middle of the candidate.
  std::string flipped = bytes;
  for (size_t i = 0; i < 192; ++i) flipped[bytes.size() / 2 + i] ^= 0x5a;
  { std::ofstream(d + "/flipped.lslog", std::ios::binary) << flipped; }
  auto [rc, out] = CompareOut({a, d + "/flipped.lslog"});
  EXPECT_EQ(rc, cli::kExitBadInput) << out;
  EXPECT_EQ(out.rfind("verdict: FAIL (exit 3): the candidate log '" + d + "/flipped.lslog' is corrupt", 0), 0u)
      << out;
  EXPECT_NE(out.find("expected steps were compared"), std::string::npos) << out;
  // Cut inside the last records: a torn tail.
  { std::ofstream(d + "/cut.lslog", std::ios::binary) << bytes.substr(0, bytes.size() - 7); }
  auto [rc2, out2] = CompareOut({a, d + "/cut.lslog"});
  EXPECT_EQ(rc2, cli::kExitBadInput) << out2;
  ASSERT_FALSE(Lines(out2).empty());
  EXPECT_NE(Lines(out2)[0].find("is truncated"), std::string::npos) << out2;
  // The baseline damaged instead.
  auto [rc3, out3] = CompareOut({d + "/cut.lslog", b, "--rename-baseline", "cut"});
  EXPECT_EQ(rc3, cli::kExitBadInput) << out3;
  ASSERT_FALSE(Lines(out3).empty());
  EXPECT_NE(Lines(out3)[0].find("the baseline log"), std::string::npos) << out3;
}

TEST(CompareCommand, TooFewStepsComparedExitsFive) {
  auto d = Dir();
  auto a = WriteRun(d, "gpu", wire::Role::Baseline, 40, 0, 1.0);
  // Steps 10..19 missing from the candidate: 30 of 40 compared (75 %).
  auto b = WriteRun(d, "npu", wire::Role::Candidate, 40, 0, 1.0, "", [](int s) { return s >= 10 && s < 20; });
  auto [rc, out] = CompareOut({a, b});
  EXPECT_EQ(rc, cli::kExitTooFewSteps) << out;
  EXPECT_EQ(out.rfind("verdict: FAIL (exit 5): only 30 of 40 expected steps were compared (75 %, under 90 %)", 0), 0u)
      << out;
  // Four missing (90 % compared) passes.
  auto c = WriteRun(d, "npu2", wire::Role::Candidate, 40, 0, 1.0, "", [](int s) { return s >= 10 && s < 14; });
  EXPECT_EQ(Compare({a, c}), cli::kExitOk);
  // A candidate that ended early on purpose (its Goodbye) is judged over its own steps.
  auto e = WriteRun(d, "npu3", wire::Role::Candidate, 20, 0, 1.0);
  EXPECT_EQ(Compare({a, e}), cli::kExitOk);
}

TEST(CompareCommand, UnrelatedModelsExitSix) {
  auto d = Dir();
  auto a = WriteRun(d, "gpu", wire::Role::Baseline, 20, 0, 1.0);
  auto b = WriteRun(d, "npu", wire::Role::Candidate, 20, 0, 1.0, "other.");
  auto [rc, out] = CompareOut({a, b});
  EXPECT_EQ(rc, cli::kExitNotSameModel) << out;
  EXPECT_EQ(out.rfind("verdict: FAIL (exit 6): these do not look like the same model: they share 0 of 3 tensor "
                      "names", 0), 0u) << out;
}

TEST(CompareCommand, SameRunIdNeedsARename) {
  auto d = Dir();
  std::filesystem::create_directories(d + "/before");
  std::filesystem::create_directories(d + "/after");
  auto a = WriteRun(d + "/before", "job", wire::Role::Baseline, 20, 10, 1.0);
  auto b = WriteRun(d + "/after", "job", wire::Role::Baseline, 20, 10, 1.1);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(Compare({a, b}), cli::kExitUsage);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("both logs hold run job"), std::string::npos) << err;
  EXPECT_NE(err.find("--rename-baseline"), std::string::npos) << err;
  auto [rc, out] = CompareOut({a, b, "--rename-baseline", "job-before"});
  EXPECT_EQ(rc, cli::kExitFinding) << out;
  EXPECT_NE(out.find("baseline  job-before"), std::string::npos) << out;
  EXPECT_NE(out.find("first divergence (critical): blk.1 (act, order 1) at step 10"), std::string::npos) << out;
  auto [rc2, out2] = CompareOut({a, b, "--rename-candidate", "job-after"});
  EXPECT_EQ(rc2, cli::kExitFinding) << out2;
  EXPECT_NE(out2.find("candidate job-after"), std::string::npos) << out2;
  EXPECT_NE(out2.find("steps compared: 20 of 20 expected"), std::string::npos) << out2;
  EXPECT_EQ(Compare({a, b, "--rename-candidate", "../x"}), cli::kExitUsage);
}
}  // namespace
}  // namespace lockstep::collector
