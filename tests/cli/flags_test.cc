#include "lockstep/common/flags.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace lockstep::cli {
namespace {

struct Fixture {
  std::string listen = "tcp://127.0.0.1:6200";
  int64_t hwm = 1000;
  double tol = 0.01;
  bool verbose = false;
  std::vector<std::string> webhooks;
  FlagSet fs{"collect", "collect [FLAGS]", "test"};
  Fixture() {
    fs.String("listen", &listen, "endpoint");
    fs.Int("hwm", &hwm, "hwm");
    fs.Double("tolerance", &tol, "tol");
    fs.Bool("verbose", &verbose, "v");
    fs.StringList("webhook", &webhooks, "url");
  }
};

std::string WriteTemp(const std::string& text) {
  std::string path = ::testing::TempDir() + "/flags_test_" +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".toml";
  std::ofstream(path) << text;
  return path;
}

TEST(FlagSet, ParsesEveryTypeAndBothSpellings) {
  Fixture f;
  const char* argv[] = {"--listen=tcp://0.0.0.0:1", "--hwm", "7", "--tolerance", "0.5",
                        "--verbose", "--webhook", "a", "--webhook=b", "pos"};
  ASSERT_TRUE(f.fs.Parse(10, argv).ok());
  EXPECT_EQ(f.listen, "tcp://0.0.0.0:1");
  EXPECT_EQ(f.hwm, 7);
  EXPECT_DOUBLE_EQ(f.tol, 0.5);
  EXPECT_TRUE(f.verbose);
  EXPECT_EQ(f.webhooks, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.fs.positional(), (std::vector<std::string>{"pos"}));
  EXPECT_TRUE(f.fs.WasSet("hwm"));
}

TEST(FlagSet, UnknownFlagIsOneClearSentence) {
  Fixture f;
  const char* argv[] = {"--listn", "x"};
  Status s = f.fs.Parse(2, argv);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unknown flag '--listn'"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
}

TEST(FlagSet, BadValueNamesTheFlag) {
  Fixture f;
  const char* argv[] = {"--hwm", "lots"};
  Status s = f.fs.Parse(2, argv);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--hwm expects an integer, got 'lots'"), std::string::npos);
}

TEST(FlagSet, MissingValue) {
  Fixture f;
  const char* argv[] = {"--listen"};
  EXPECT_FALSE(f.fs.Parse(1, argv).ok());
}

TEST(FlagSet, NoPrefixClearsBool) {
  Fixture f;
  f.verbose = true;
  const char* argv[] = {"--no-verbose"};
  ASSERT_TRUE(f.fs.Parse(1, argv).ok());
  EXPECT_FALSE(f.verbose);
}

TEST(FlagSet, ConfigFileSetsFlagsCommandLineWins) {
  Fixture f;
  std::string path = WriteTemp(
      "hwm = 5\ntolerance = 0.25\nwebhook = ['x', 'y']\n[collect]\nlisten = 'tcp://h:9'\n"
      "[top]\nother = 1\n");
  std::string cfg = "--config=" + path;
  const char* argv[] = {cfg.c_str(), "--hwm", "9"};
  Status s = f.fs.Parse(3, argv);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(f.hwm, 9);
  EXPECT_DOUBLE_EQ(f.tol, 0.25);
  EXPECT_EQ(f.listen, "tcp://h:9");
  EXPECT_EQ(f.webhooks, (std::vector<std::string>{"x", "y"}));
}

TEST(FlagSet, ConfigUnknownKeyAndSyntaxErrorAreReported) {
  {
    Fixture f;
    std::string cfg = "--config=" + WriteTemp("hmw = 5\n");
    const char* argv[] = {cfg.c_str()};
    Status s = f.fs.Parse(1, argv);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("unknown key 'hmw'"), std::string::npos) << s.message();
  }
  {
    Fixture f;
    std::string cfg = "--config=" + WriteTemp("hwm = = 5\n");
    const char* argv[] = {cfg.c_str()};
    Status s = f.fs.Parse(1, argv);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("line 1"), std::string::npos) << s.message();
  }
  {
    Fixture f;
    const char* argv[] = {"--config=/nonexistent/x.toml"};
    EXPECT_FALSE(f.fs.Parse(1, argv).ok());
  }
}

// Misspelt tables and keys are errors with the file's line and the closest name; a
// table not named after a subcommand is no longer skipped as "another subcommand's".
TEST(FlagSet, ConfigMistakesNameTheLineAndTheClosestName) {
  struct Case {
    std::string toml, want;
  };
  for (const Case& c : std::vector<Case>{
           {"hwm = 5\n\n[colect]\nlisten = 'x'\n", "line 3: unknown table [colect] (did you mean 'collect'?)"},
           {"[collect]\nhmw = 5\n", "line 2 (in [collect]): unknown key 'hmw' for 'lockstep collect' (did you "
                                    "mean 'hwm'?)"},
           {"[collect]\n[collect.sub]\nx = 1\n", "unknown table [collect.sub]"},
           {"tolerance = -0.5\n", "line 1: --tolerance must not be negative, got '-0.5'"},
           {"hwm = -1\n", "--hwm must not be negative, got '-1'"},
           {"hwm = 2.5\n", "--hwm expects an integer, got '2.5'"},
           {"tolerance = inf\n", "--tolerance expects a number, got 'inf'"},
           {"tolerance = nan\n", "--tolerance expects a number, got 'nan'"},
           {"listen = ['a', 'b']\n", "takes one value, not a list"},
           {"verbose = 'maybe'\n", "--verbose expects true or false, got 'maybe'"},
           {"webhook = [{a = 1}]\n", "value of the wrong type"},
       }) {
    Fixture f;
    std::string cfg = "--config=" + WriteTemp(c.toml);
    const char* argv[] = {cfg.c_str()};
    Status s = f.fs.Parse(1, argv);
    ASSERT_FALSE(s.ok()) << c.toml;
    EXPECT_NE(s.message().find(c.want), std::string::npos) << c.toml << " -> " << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  }
}

TEST(FlagSet, NumbersAreRangeCheckedOnTheCommandLine) {
  Fixture f;
  f.fs.Range("hwm", 1, 100);
  const char* neg[] = {"--tolerance", "-1e-3"};
  Status s = f.fs.Parse(2, neg);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--tolerance must not be negative"), std::string::npos) << s.message();
  const char* big[] = {"--hwm", "101"};
  s = f.fs.Parse(2, big);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--hwm must be from 1 to 100, got '101'"), std::string::npos) << s.message();
  const char* huge[] = {"--hwm", "99999999999999999999999"};
  EXPECT_FALSE(f.fs.Parse(2, huge).ok());
  const char* ok[] = {"--hwm", "100", "--tolerance", "0"};
  EXPECT_TRUE(f.fs.Parse(4, ok).ok());
  EXPECT_EQ(f.hwm, 100);
  const char* typo[] = {"--tolerence", "1"};
  s = f.fs.Parse(2, typo);
  EXPECT_NE(s.message().find("did you mean '--tolerance'?"), std::string::npos) << s.message();
}

TEST(FlagSet, HelpListsFlagsWithDefaults) {
  Fixture f;
  std::string h = f.fs.Help();
  EXPECT_NE(h.find("--listen VALUE"), std::string::npos);
  EXPECT_NE(h.find("(default: 1000)"), std::string::npos);
  EXPECT_NE(h.find("--config FILE"), std::string::npos);
  EXPECT_NE(h.find("exit status:\n  0  ok"), std::string::npos) << h;  // lockstep/common/exit_codes.h
}

}  // namespace
}  // namespace lockstep::cli
