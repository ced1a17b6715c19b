// JudgeReplays: two runs' replays of their own captures to one verdict, with the words
// of `python -m lockstep replay` (tests/scenarios/test_auto_zoom.py runs it live and in
// compare on real captures).
#include "service/replay_verdict.h"

#include <gtest/gtest.h>

#include "lockstep/common/wire.h"

namespace lockstep::collector {
namespace {

SelfReplayResult Accurate(const std::string& file) {
  SelfReplayResult r;
  r.file = file;
  r.row = "blocks.1.mlp/gelu#0";
  r.dtype = r.coarsest = "float32";
  r.max_rel_error = 1e-7;
  r.ulps = 1.0;
  r.width = 64;  // budget 16 + 8 = 24 ULPs
  r.settings_digest = "s1";
  r.settings = {{"func", "'torch.nn.functional.gelu'"}, {"kwargs.approximate", "'none'"}};
  r.inputs_digest = "in";
  r.output_digest = "out-b";
  return r;
}

ReplayCase Case(SelfReplayResult b, SelfReplayResult c) {
  ReplayCase rc;
  rc.experiment = "exp";
  rc.baseline = "base";
  rc.candidate = "cand";
  rc.row = b.row;
  rc.step = 9;
  rc.file_b = b.file;
  rc.file_c = c.file;
  rc.b = std::move(b);
  rc.c = std::move(c);
  return rc;
}

TEST(ReplayVerdict, SettingsThatDifferAreDifferentFunctionsCauseConfig) {
  auto b = Accurate("/b.pt");
  auto c = Accurate("/c.pt");
  c.settings_digest = "s2";
  c.settings[1].second = "'tanh'";
  ReplayVerdict v = JudgeReplays(Case(b, c));
  EXPECT_EQ(v.verdict, "different_functions");
  EXPECT_EQ(v.cause, "config");
  EXPECT_EQ(v.message,
            "the two runs compute different functions: kwargs.approximate: 'none' (baseline) vs 'tanh' "
            "(candidate): cause config");
  alerting::Alert a = ReplayAlert(Case(b, c), v, 123);
  EXPECT_EQ(a.rule, "replay");
  EXPECT_EQ(a.metric, "different_functions");
  EXPECT_EQ(a.cause, "config");
  EXPECT_EQ(a.tensor, "blocks.1.mlp/gelu#0");
  EXPECT_EQ(a.step, 9u);
  EXPECT_EQ(a.id, "replay/exp/cand/blocks.1.mlp/gelu#0/act/rank0@9");  // the same live and offline
}

TEST(ReplayVerdict, OneRunBeyondItsBudgetAndFourTimesTheOtherIsLessAccurate) {
  auto b = Accurate("/b.pt");
  auto c = Accurate("/c.pt");
  c.ulps = 100;  // > 24 and >= 4 x 1
  ReplayVerdict v = JudgeReplays(Case(b, c));
  EXPECT_EQ(v.verdict, "less_accurate");
  EXPECT_EQ(v.less_accurate, "candidate");
  EXPECT_EQ(v.cause, "platform");  // same dtypes, no precision setting differs
  EXPECT_NE(v.message.find("report it with /c.pt"), std::string::npos) << v.message;
  EXPECT_DOUBLE_EQ(v.budget, 24.0);

  // Only 3x the other: both off, neither 4x: inconclusive.
  b.ulps = 34;
  v = JudgeReplays(Case(b, c));
  EXPECT_EQ(v.verdict, "inconclusive");
}

TEST(ReplayVerdict, AnFp16RunIsJudgedInTheFinerDtypeAndCausePrecision) {
  auto b = Accurate("/b.pt");
  auto c = Accurate("/c.pt");
  // The candidate hands on fp16 and is 0.5 ULP of it off: 2^13 x 0.5 = 4096 ULPs of fp32.
  c.dtype = c.coarsest = "float16";
  c.ulps = 0.5;
  ReplayVerdict v = JudgeReplays(Case(b, c));
  EXPECT_EQ(v.pair_dtype, "float32");
  EXPECT_DOUBLE_EQ(v.ulps_c, 4096.0);
  EXPECT_EQ(v.verdict, "less_accurate");
  EXPECT_EQ(v.less_accurate, "candidate");
  EXPECT_EQ(v.cause, "precision");
  EXPECT_NE(v.message.find("it hands on float16, the other run float32"), std::string::npos) << v.message;
}

TEST(ReplayVerdict, BothAccurateOnIdenticalInputsIsWithinRoundingElseItNeedsBothFiles) {
  auto b = Accurate("/b.pt");
  auto c = Accurate("/c.pt");
  c.output_digest = "out-c";
  ReplayVerdict v = JudgeReplays(Case(b, c));
  EXPECT_EQ(v.verdict, "within_rounding");
  EXPECT_EQ(v.cause, "");
  EXPECT_NE(v.message.find("raise birth-ulps"), std::string::npos) << v.message;

  c.output_digest = b.output_digest;
  EXPECT_EQ(JudgeReplays(Case(b, c)).verdict, "identical");

  // Inputs that differ: the op or its inputs? One run alone cannot say.
  c.inputs_digest = "in-c";
  v = JudgeReplays(Case(b, c));
  EXPECT_EQ(v.verdict, "needs_both_files");
  EXPECT_NE(v.message.find("python -m lockstep replay /b.pt /c.pt"), std::string::npos) << v.message;
}

TEST(ReplayVerdict, ARunThatCouldNotReplayKeepsTheCommand) {
  auto b = Accurate("/b.pt");
  auto c = Accurate("/c.pt");
  c.error = "ReplayError: module type x.Y is not a torch.nn builtin";
  ReplayVerdict v = JudgeReplays(Case(b, c));
  EXPECT_EQ(v.verdict, "needs_both_files");
  EXPECT_EQ(v.message,
            "run cand could not replay its capture on its host (ReplayError: module type x.Y is not a torch.nn "
            "builtin): the verdict needs both files: python -m lockstep replay /b.pt /c.pt");
  ReplayCase one = Case(b, c);
  one.c.reset();
  EXPECT_EQ(JudgeReplays(one).verdict, "needs_both_files");
}

TEST(ReplayVerdict, TheCaptureAlertOfAnOlderAgentSaysTheVerdictNeedsBothFiles) {
  ReplayCase rc = Case(Accurate("/b.pt"), Accurate("/c.pt"));
  EXPECT_EQ(CaptureMessage(rc, kSchemaMinor, kSchemaMinor),
            "captured blocks.1.mlp/gelu#0 at step 9 in runs base and cand: /b.pt and /c.pt; which run is wrong: "
            "python -m lockstep replay /b.pt /c.pt");
  EXPECT_EQ(CaptureMessage(rc, kSchemaMinor, 5),
            "captured blocks.1.mlp/gelu#0 at step 9 in runs base and cand: /b.pt and /c.pt; run cand's agent does "
            "not replay its own capture (schema minor 5 < 6), so the verdict needs both files: python -m lockstep "
            "replay /b.pt /c.pt");
}

TEST(ReplayVerdict, PairReplaysPairsTheLogsByRowAndStep) {
  LogScan base, cand;
  base.replays.push_back({9, 100, Accurate("/b.pt")});
  base.replays.push_back({30, 200, Accurate("/b2.pt")});  // the candidate never answered it
  cand.replays.push_back({9, 150, Accurate("/c.pt")});
  auto cases = PairReplays(base, cand, "exp", "base", "cand");
  ASSERT_EQ(cases.size(), 1u);
  EXPECT_EQ(cases[0].step, 9u);
  EXPECT_EQ(cases[0].file_b, "/b.pt");
  EXPECT_EQ(cases[0].file_c, "/c.pt");
  EXPECT_EQ(cases[0].answered_unix_ns, 150);
}

}  // namespace
}  // namespace lockstep::collector
