// ReportRecorder: the bounded (tensor x step) score matrix behind the HTML report, fed
// by hand-made PairStepViews (the analyzer's hook), and the page it goes into.
#include "report/report_recorder.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "report/report_page.h"
#include "lockstep/common/json_out.h"

namespace lockstep::collector {
namespace {

struct Feed {
  NameTable names;
  PairCtx ctx;
  Feed() {
    ctx.experiment = "exp";
    ctx.baseline = "b";
    ctx.candidate = "c";
    ctx.names = &names;
  }
  // One compared step: tensor i gets score scores[i] (threshold 1), l2 1 vs 1 + score.
  void Step(ReportRecorder* rec, uint64_t step, const std::vector<double>& scores, bool nan_last = false) {
    StepData bs, cs;
    bs.step = cs.step = step;
    bs.has_scalars = cs.has_scalars = true;
    bs.scalars.loss = 2.0;
    bs.scalars.loss_given = true;
    cs.scalars.loss = 2.0 + static_cast<double>(step);
    cs.scalars.loss_given = true;
    for (size_t i = 0; i < scores.size(); ++i) {
      StatRow r;
      r.key = MakeKey(names.Intern("t" + std::to_string(i)), i % 2 ? Kind::kParamGrad : Kind::kAct, 0);
      r.order = static_cast<uint32_t>(i);
      r.l2 = 1.0;
      bs.rows.push_back(r);
      r.l2 = 1.0 + scores[i];
      if (nan_last && i + 1 == scores.size()) r.nan_count = 1;
      cs.rows.push_back(r);
    }
    std::vector<MatchedTensor> matched(scores.size());
    for (size_t i = 0; i < scores.size(); ++i) {
      matched[i].b = &bs.rows[i];
      matched[i].c = &cs.rows[i];
      matched[i].eval.score = scores[i];
      matched[i].threshold = 1.0;
    }
    PairStepView v;
    v.step = step;
    v.b = &bs;
    v.c = &cs;
    v.matched = &matched;
    rec->OnPairStep(ctx, v);
  }
};

nlohmann::json Matrix(const ReportRecorder& rec) {
  std::string s;
  JsonOut j(&s);
  j.BeginObject();
  EXPECT_TRUE(rec.WriteMatrixJson("exp", &j));
  rec.WriteAlertsJson("exp", &j);
  j.EndObject();
  return nlohmann::json::parse(s);
}

TEST(ReportRecorder, KeepsEveryStepUnderTheBoundGroupedByKind) {
  ReportRecorder rec;
  Feed f;
  for (uint64_t s = 0; s < 10; ++s) f.Step(&rec, s, {0.0, 0.5, s >= 5 ? 3.0 : 0.01});
  auto m = Matrix(rec);
  EXPECT_EQ(m["ds"]["stride"], 1);
  EXPECT_EQ(m["ds"]["cols"], 10);
  // Forward activations first (t0, t2), then parameter gradients (t1).
  ASSERT_EQ(m["rows"].size(), 3u);
  EXPECT_EQ(m["rows"][0][0], "t0");
  EXPECT_EQ(m["rows"][1][0], "t2");
  EXPECT_EQ(m["rows"][2][0], "t1");
  EXPECT_EQ(m["S"][0][0], -99);                       // zero drift
  EXPECT_EQ(m["S"][1][0], -20);                       // 10 log10(0.01)
  EXPECT_EQ(m["S"][1][9], 5);                         // 10 log10(3) = 4.77
  EXPECT_NEAR(m["C"][1][9].get<double>(), 3.0, 1e-6);  // (c - b) / b
  EXPECT_EQ(m["scal"]["steps"].size(), 10u);
  EXPECT_EQ(m["scal"]["c"][0][9], 11.0);  // the candidate's loss at step 9
  EXPECT_TRUE(m["nonfinite"].is_null());
}

TEST(ReportRecorder, HalvesColumnsKeepingTheWorstCell) {
  ReportLimits lim;
  lim.max_cols = 4;
  lim.max_points = 3;
  ReportRecorder rec(lim);
  Feed f;
  // Steps 0..9: a spike of 100 at step 6 only.
  for (uint64_t s = 0; s < 10; ++s) f.Step(&rec, s, {s == 6 ? 100.0 : 0.1});
  auto m = Matrix(rec);
  // 10 steps in at most 4 columns: stride 4 (steps 0-3, 4-7, 8-9).
  EXPECT_EQ(m["ds"]["stride"], 4);
  EXPECT_EQ(m["ds"]["cols"], 3);
  EXPECT_EQ(m["cols"], nlohmann::json::parse("[0,4,8]"));
  EXPECT_EQ(m["S"][0], nlohmann::json::parse("[-10,20,-10]"));  // the spike survives the merge
  EXPECT_NEAR(m["C"][0][1].get<double>(), 100.0, 1e-3);          // and its l2s with it
  EXPECT_LE(m["scal"]["steps"].size(), 3u);
  EXPECT_GT(m["ds"]["point_stride"].get<int>(), 1);
}

TEST(ReportRecorder, BoundsTensorsAndNotesTheFirstNaN) {
  ReportLimits lim;
  lim.max_tensors = 2;
  ReportRecorder rec(lim);
  Feed f;
  f.Step(&rec, 3, {0.1, 0.1, 0.1});
  f.Step(&rec, 4, {0.1, 0.1, 0.1}, /*nan_last=*/true);  // t2 is dropped: its NaN is not seen
  f.Step(&rec, 5, {0.1, 0.1}, /*nan_last=*/true);
  auto m = Matrix(rec);
  EXPECT_EQ(m["rows"].size(), 2u);
  EXPECT_EQ(m["ds"]["tensors"], 3);
  EXPECT_EQ(m["ds"]["tensors_dropped"], 1);
  EXPECT_EQ(m["nonfinite"]["step"], 5);
  EXPECT_EQ(m["nonfinite"]["tensor"], "t1");
  EXPECT_EQ(m["nonfinite"]["side"], "candidate");
}

TEST(ReportRecorder, KeepsAlertsPerExperimentUpToTheBound) {
  ReportLimits lim;
  lim.max_alerts = 2;
  ReportRecorder rec(lim);
  Feed f;
  f.Step(&rec, 0, {0.1});
  for (int i = 0; i < 3; ++i) {
    alerting::Alert a;
    a.experiment = "exp";
    a.rule = "tensor_drift";
    a.severity = alerting::Severity::kCritical;
    a.runs = {"b", "c"};
    a.message = "m</script>" + std::to_string(i);
    rec.OnAlert(a);
  }
  auto m = Matrix(rec);
  EXPECT_EQ(m["alerts"].size(), 2u);
  EXPECT_EQ(m["alerts_dropped"], 1);
  EXPECT_EQ(m["alerts"][0][3], "c");
  // In the page, no string can close the data's <script> element early.
  std::string s;
  JsonOut j(&s);
  j.BeginObject();
  rec.WriteAlertsJson("exp", &j);
  j.EndObject();
  const std::string page = ReportHtml(s);
  EXPECT_EQ(page.find("m</script>"), std::string::npos);
  EXPECT_NE(page.find("m<\\/script>0"), std::string::npos);
  EXPECT_NE(page.find("connect-src 'none'"), std::string::npos);
  EXPECT_NE(ReportHtml(s, "/report.json?experiment=exp").find("connect-src 'self'"), std::string::npos);
}

TEST(ReportRecorder, KeepsTheFirstDivergencesNeighbourhoodAtFullResolution) {
  ReportLimits lim;
  lim.max_cols = 20;
  ReportRecorder rec(lim);
  Feed f;
  auto divergence = [&rec](uint64_t step) {
    alerting::Alert a;
    a.experiment = "exp";
    a.rule = "first_divergence";
    a.severity = alerting::Severity::kCritical;
    a.runs = {"b", "c"};
    a.step = step;
    rec.OnAlert(a);
  };
  // t0 drifts from step 150 on, more every step; t1 never.
  for (uint64_t s = 0; s < 300; ++s) {
    f.Step(&rec, s, {s >= 150 ? 0.01 * static_cast<double>(s - 149) : 0.001, 0.0});
    if (s == 150) divergence(150);
    if (s == 200) divergence(200);  // the refined one: the neighbourhood stays
  }
  auto m = Matrix(rec);
  EXPECT_EQ(m["ds"]["stride"], 16);  // 300 steps in 20 columns
  ASSERT_TRUE(m.contains("near")) << m.dump();
  const auto& near = m["near"];
  EXPECT_EQ(near["anchor"], 150);
  ASSERT_EQ(near["cols"].size(), 33u);
  EXPECT_EQ(near["cols"][0], 134);
  EXPECT_EQ(near["cols"][32], 166);
  ASSERT_EQ(m["rows"][0][0], "t0");
  EXPECT_EQ(near["S"][0][0], -30);   // step 134: 0.001
  EXPECT_EQ(near["S"][0][16], -20);  // step 150: 0.01
  EXPECT_EQ(near["S"][0][17], -17);  // step 151: 0.02, every step its own cell
  EXPECT_EQ(near["S"][0][32], -8);   // step 166: 0.17
  EXPECT_EQ(near["L"][0][16], 1.0);
  // The merged heatmap keeps its worst cell per column, as before.
  EXPECT_EQ(m["S"][0][9], -10);  // steps 144..159: the worst is step 159's 0.1
  // Not merged: nothing "near" (the heatmap is the full resolution).
  ReportRecorder small;
  Feed g;
  for (uint64_t s = 0; s < 10; ++s) g.Step(&small, s, {0.5});
  alerting::Alert a;
  a.experiment = "exp";
  a.rule = "first_divergence";
  a.runs = {"b", "c"};
  a.step = 3;
  small.OnAlert(a);
  EXPECT_FALSE(Matrix(small).contains("near"));
}

}  // namespace
}  // namespace lockstep::collector
