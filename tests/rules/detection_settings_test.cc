// The detection settings a collector records next to its logs and compare reads back
// (rules/detection_settings.h): a settings file is checked as the flags are, and the
// collector writes it once per run and again when its settings change. The suite keeps
// the name it had beside `lockstep compare`'s tests (tests/cli/compare_test.cc).
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "read_file.h"
#include "rules/detection_settings.h"
#include "stream_builder.h"

namespace lockstep::collector {
namespace {

using lockstep::testing::ReadFile;
using lockstep::testing::StreamBuilder;

std::string Dir() {
  std::string d = ::testing::TempDir() + "/detection_settings_test_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(d);  // nothing left from an earlier run
  std::filesystem::create_directories(d);
  return d;
}

// A settings file is checked as the flags are (one table of names and ranges): a value
// out of range or of the wrong kind is one sentence naming the file, the setting and
// the value; nothing is half-applied to the caller.
TEST(CompareCommand, SettingsFileValuesAreCheckedAsTheFlagsAre) {
  auto d = Dir();
  auto read = [&](const std::string& rules) {
    { std::ofstream(d + "/bad.settings.toml") << "[rules]\n" << rules << "\n"; }
    return ReadSettingsFile(d + "/bad.settings.toml", nullptr);
  };
  const std::string file = "the settings file '" + d + "/bad.settings.toml': ";
  auto neg = read("floor-steps = -1");
  ASSERT_FALSE(neg.ok());
  EXPECT_EQ(neg.status().message(), file + "--floor-steps must be from 0 to 1e+06, got '-1'");
  auto frac = read("underflow-frac = 1.5");
  ASSERT_FALSE(frac.ok());
  EXPECT_EQ(frac.status().message(), file + "--underflow-frac must be from 0 to 1, got '1.5'");
  auto below = read("spike-loss-ratio = 0.5");
  ASSERT_FALSE(below.ok());
  EXPECT_EQ(below.status().message(), file + "--spike-loss-ratio must be from 1 to 1e+12, got '0.5'");
  auto kind = read("overflow-fp32-limit = 2");
  ASSERT_FALSE(kind.ok());
  EXPECT_EQ(kind.status().message(), file + "--overflow-fp32-limit expects true or false, got '2'");
  auto atol = read("atol = -1e-3");
  ASSERT_FALSE(atol.ok());
  EXPECT_EQ(atol.status().message(), file + "--atol must not be negative, got '-0.001'");
  auto ok = read("floor-steps = 7\nunderflow-frac = 1.0\nunderflow-fp32-limit = true");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->rules.floor_steps, 7);
  EXPECT_EQ(ok->rules.underflow_frac, 1.0);
  EXPECT_TRUE(ok->rules.underflow_fp32_limit);
}

TEST(CompareCommand, CollectorRecordsItsSettingsOncePerRunAndOnChange) {
  auto d = Dir();
  StreamBuilder sb("run-1", "exp", wire::Role::Candidate);
  auto hello = sb.Hello();
  const auto& env = *wire::GetEnvelope(hello.data());
  const std::string path = d + "/run-1.settings.toml";
  DetectionSettings s;
  s.rules.rtol.fp32 = 1e-4;
  s.name_map = "^a\\.(.*) => $1\n";
  s.lockstep_version = "0.1.0";
  {
    SettingsRecorder rec(d, s);
    rec.OnMessage(env, 1);
    auto back = ReadSettingsFile(path, nullptr);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->rules.rtol.fp32, 1e-4);
    EXPECT_EQ(back->name_map, s.name_map);
    // Written once per run: a changed file is not touched again by this process.
    { std::ofstream(path) << "edited"; }
    rec.OnMessage(env, 2);
    EXPECT_EQ(ReadFile(path), "edited");
  }
  // A collector started later with other settings (a restart replays the logs through
  // it) rewrites the file: it holds the settings of the last one that analyzed the run.
  s.rules.rtol.fp32 = 1e-5;
  SettingsRecorder again(d, s);
  again.OnMessage(env, 3);
  auto back = ReadSettingsFile(path, nullptr);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->rules.rtol.fp32, 1e-5);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}
}  // namespace
}  // namespace lockstep::collector
