// ViewModel -> snapshot JSON -> ParseSnapshot -> FormatPlain, fed with pair steps the
// way the analyzer's observer feeds it: the NaN producer pinned first, the onset kept in
// the history, "drifting" vs "drifted", NaN losses, and the text columns at 80 wide.
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "align/step_data.h"
#include "rules/detector.h"
#include "top/top_text.h"
#include "view/snapshot.h"
#include "view/snapshot_json.h"
#include "view/view_model.h"

namespace lockstep::collector {
namespace {

using nlohmann::json;

// One compared step of a pair: tensors given as (name id, kind, order, score, nonfinite).
struct T {
  uint32_t id;
  Kind kind;
  uint32_t order;
  double score;  // over a threshold of 1; NaN = non-finite on one side
};

class Feeder {
 public:
  explicit Feeder(ViewModel* vm) : vm_(vm) {
    ctx_.experiment = "exp";
    ctx_.baseline = "base";
    ctx_.candidate = "cand";
  }
  void Step(uint64_t step, const std::vector<T>& ts, double loss_b = 1.0, double loss_c = 1.0,
            bool c_loss_given = true, uint32_t rank = 0) {
    StepData b, c;
    b.step = c.step = step;
    b.has_scalars = c.has_scalars = true;
    b.scalars.loss = loss_b;
    b.scalars.loss_given = true;
    c.scalars.loss = loss_c;
    c.scalars.loss_given = c_loss_given;
    std::vector<StatRow> rb(ts.size()), rc(ts.size());
    std::vector<MatchedTensor> m(ts.size());
    for (size_t i = 0; i < ts.size(); ++i) {
      rb[i].key = rc[i].key = MakeKey(ts[i].id, ts[i].kind, 0);
      rb[i].order = rc[i].order = ts[i].order;
      rb[i].l2 = 1;
      rc[i].l2 = 1;
      const bool nf = std::isnan(ts[i].score);
      if (nf) rc[i].nan_count = 1;
      m[i].b = &rb[i];
      m[i].c = &rc[i];
      m[i].threshold = 1;
      m[i].eval.score = nf ? INFINITY : ts[i].score;
      m[i].eval.nonfinite_mismatch = nf;
      m[i].eval.dominant = nf ? Metric::kNonfinite : Metric::kL2;
    }
    PairStepView v;
    v.step = step;
    v.rank = rank;
    v.b = &b;
    v.c = &c;
    v.matched = &m;
    vm_->OnPairStep(ctx_, v);
  }

 private:
  ViewModel* vm_;
  PairCtx ctx_;
};

json Snap(const ViewModel& vm) { return json::parse(vm.SnapshotJson({}, {}, 0)); }
// Without a name table the view model names a tensor by its key.
std::string Name(uint32_t id, Kind k) { return std::to_string(MakeKey(id, k, 0)); }

TEST(ViewModel, NanProducerIsPinnedFirstEvenWhenLaterTensorsComeEarlierInOrder) {
  ViewModel vm;
  Feeder f(&vm);
  f.Step(1, {{1, Kind::kAct, 0, 0.1}, {2, Kind::kParamGrad, 30, 0.1}});
  // Step 2: the NaN appears in a backward tensor (order 30) only.
  f.Step(2, {{1, Kind::kAct, 0, 0.1}, {2, Kind::kParamGrad, 30, NAN}});
  // Step 3: it has reached every tensor, the forward one (order 0) first in order.
  f.Step(3, {{1, Kind::kAct, 0, NAN}, {2, Kind::kParamGrad, 30, NAN}});
  const json s = Snap(vm);
  const json& p = s["pairs"][0];
  ASSERT_TRUE(p["nan_onset"].is_object());
  EXPECT_EQ(p["nan_onset"]["step"], 2);
  EXPECT_EQ(p["nan_onset"]["tensor"], Name(2, Kind::kParamGrad));
  EXPECT_EQ(p["nan_onset"]["kind"], "param_grad");
  ASSERT_EQ(p["tensors"].size(), 2u);
  EXPECT_EQ(p["tensors"][0]["name"], Name(2, Kind::kParamGrad));
  EXPECT_EQ(p["tensors"][0]["status"], "producer");
  EXPECT_EQ(p["tensors"][0]["first_nonfinite"], 2);
  EXPECT_EQ(p["tensors"][1]["status"], "nonfinite");
}

TEST(ViewModel, HistoryKeepsTheOnsetStepOnceTheRingHasMovedPastIt) {
  ViewModel vm;
  Feeder f(&vm);
  for (uint64_t s = 0; s < 100; ++s) f.Step(s, {{7, Kind::kAct, 0, s == 5 ? 3.0 : 0.2}});
  const json t = Snap(vm)["pairs"][0]["tensors"][0];
  ASSERT_EQ(t["hist"].size(), ViewModel::kHistory + 1);
  EXPECT_EQ(t["hist"][0][0], 5);  // the onset, ahead of the last 60 steps
  EXPECT_EQ(t["hist"][0][1], 3.0);
  EXPECT_EQ(t["hist"][1][0], 40);
  EXPECT_EQ(t["first"], 5);
  EXPECT_EQ(t["status"], "drifted");  // drifted once, within tolerance now
}

TEST(ViewModel, DriftingNowIsNotDriftedEarlier) {
  ViewModel vm;
  Feeder f(&vm);
  f.Step(1, {{1, Kind::kAct, 0, 2.0}, {2, Kind::kAct, 1, 2.0}, {3, Kind::kAct, 2, 0.5}});
  f.Step(2, {{1, Kind::kAct, 0, 2.0}, {2, Kind::kAct, 1, 0.5}, {3, Kind::kAct, 2, 0.5}});
  std::map<std::string, std::string> st;
  const json snap = Snap(vm);
  for (const json& t : snap["pairs"][0]["tensors"]) st[t["name"].get<std::string>()] = t["status"].get<std::string>();
  EXPECT_EQ(st[Name(1, Kind::kAct)], "drifting");
  EXPECT_EQ(st[Name(2, Kind::kAct)], "drifted");
  EXPECT_EQ(st[Name(3, Kind::kAct)], "ok");
}

TEST(ViewModel, NanLossIsNaNAndAMissingLossIsNull) {
  ViewModel vm;
  Feeder f(&vm);
  f.Step(1, {{1, Kind::kAct, 0, 0.1}}, 0.5, NAN, /*c_loss_given=*/true);
  json p = Snap(vm)["pairs"][0];
  EXPECT_EQ(p["loss_b"], 0.5);
  EXPECT_EQ(p["loss_c"], "NaN");
  EXPECT_EQ(p["loss_hist"][0][2], "NaN");
  f.Step(2, {{1, Kind::kAct, 0, 0.1}}, 0.5, NAN, /*c_loss_given=*/false);
  p = Snap(vm)["pairs"][0];
  EXPECT_TRUE(p["loss_c"].is_null());

  auto parsed = view::ParseSnapshot(vm.SnapshotJson({}, {}, 0));
  ASSERT_TRUE(parsed.ok());
  EXPECT_FALSE(parsed->pairs[0].has_loss_c);
  EXPECT_EQ(view::FormatLoss(parsed->pairs[0].loss_c, parsed->pairs[0].has_loss_c), "-");
  EXPECT_EQ(view::FormatLoss(NAN, true), "NaN");
  EXPECT_EQ(view::FormatLoss(INFINITY, true), "inf");
}

// Issue 20: top's first-divergence line names the rank, or says all ranks at once.
std::string FirstDivLine(const ViewModel& vm) {
  auto s = view::ParseSnapshot(vm.SnapshotJson({}, {}, 0));
  EXPECT_TRUE(s.ok());
  std::istringstream in(view::FormatPlain(*s, "tcp://127.0.0.1:6201", 100, false));
  for (std::string line; std::getline(in, line);)
    if (line.find("first divergence:") != std::string::npos) return line;
  return "";
}

TEST(ViewModel, FirstDivergenceNamesTheRankOrAllRanks) {
  ViewModel all, one;
  Feeder fa(&all), fo(&one);
  for (uint32_t r = 0; r < 4; ++r) {
    fa.Step(0, {{1, Kind::kAct, 0, 0.1}, {2, Kind::kAct, 1, 0.1}}, 1, 1, true, r);
    fo.Step(0, {{1, Kind::kAct, 0, 0.1}, {2, Kind::kAct, 1, 0.1}}, 1, 1, true, r);
  }
  for (uint32_t r = 0; r < 4; ++r) {
    fa.Step(1, {{1, Kind::kAct, 0, 0.1}, {2, Kind::kAct, 1, 5}}, 1, 1, true, r);  // every rank
    fo.Step(1, {{1, Kind::kAct, 0, r == 3 ? 5 : 0.1}, {2, Kind::kAct, 1, 0.1}}, 1, 1, true, r);  // rank 3
  }
  EXPECT_NE(FirstDivLine(all).find("first divergence: step 1 on all 4 ranks at " + Name(2, Kind::kAct)),
            std::string::npos) << FirstDivLine(all);
  EXPECT_NE(FirstDivLine(one).find("first divergence: step 1 rank 3 at " + Name(1, Kind::kAct)), std::string::npos)
      << FirstDivLine(one);
}

TEST(Snapshot, NumbersAndTimesFitTheirColumnsWhole) {
  EXPECT_EQ(view::FormatSeconds(0.0078), "7.80ms");
  EXPECT_EQ(view::FormatSeconds(0.0781), "78.1ms");
  EXPECT_EQ(view::FormatSeconds(0.781), "781ms");
  EXPECT_EQ(view::FormatSeconds(2.5), "2.50s");
  EXPECT_EQ(view::FormatSeconds(NAN), "-");
  // An exponent is shortened, never cut ("7.8e-0" was 7.8e-03 cut to 6 characters).
  EXPECT_EQ(view::FormatNum(7.8e-5, 6), "7.8e-5");
  EXPECT_EQ(view::FormatNum(123456.0, 6), "1.23e5");
  EXPECT_EQ(view::FormatNum(123456.0, 5), "1.2e5");
  EXPECT_EQ(view::FormatNum(517.61, 6), "517.61");
  EXPECT_EQ(view::FormatNum(0.99998, 7), "0.99998");
  EXPECT_EQ(view::FormatNum(1e30, 6), "inf");
}

TEST(Snapshot, LongNamesKeepTheirLeaf) {
  EXPECT_EQ(view::ShortName("encoder.layers.0.self_attn.out_proj", 20, false), "~self_attn.out_proj");
  EXPECT_EQ(view::ShortName("short.name", 20, false), "short.name");
  const std::string u = view::ShortName("model.transformer.h.11.mlp.c_fc", 12, true);
  EXPECT_EQ(u, "\u2026mlp.c_fc");
}

TEST(Snapshot, PlainTextAt80ColumnsLabelsAlertsAndShowsActivePairsFirst) {
  const char* feed = R"({"v":1,"t":0,"collector":{"records":1,"bad":0},
    "runs":[{"run":"old-solo","role":"solo","experiment":"x","ended":true,"step":9,"loss":null},
            {"run":"b","role":"baseline","experiment":"e","ended":false,"step":4,"loss":0.5,"step_time_s":0.0078},
            {"run":"c","role":"candidate","experiment":"e","ended":false,"step":4,"loss":"NaN","step_time_s":0.0081},
            {"run":"typo","role":"candidate","experiment":"ee","ended":false,"step":1}],
    "pairs":[{"experiment":"e","baseline":"b","candidate":"c","step":4,"compared":4,"loss_b":0.5,"loss_c":"NaN",
              "nan_onset":{"step":3,"tensor":"encoder.layers.0.self_attn.out_proj","kind":"param_grad"},
              "tensors_total":2,"drifting":2,
              "tensors":[{"name":"encoder.layers.0.self_attn.out_proj","kind":"param_grad","order":30,"ratio":1e30,
                          "status":"producer","first":3},
                         {"name":"embed","kind":"act","order":0,"ratio":1e30,"status":"nonfinite","first":4}]}],
    "alerts":{"total":2,"info":0,"warning":1,"critical":1,"recent":[
      {"t":0,"sev":"critical","rule":"nonfinite","runs":["c"],"step":3,"tensor":"x","msg":"x: NaN"},
      {"t":0,"sev":"warning","rule":"stall","runs":["old-solo"],"step":9,"tensor":"","msg":"stalled"}]}})";
  auto s = view::ParseSnapshot(feed);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->runs.front().run, "b");  // live pair runs first, the ended solo run last
  EXPECT_EQ(s->runs.back().run, "old-solo");
  ASSERT_EQ(s->unpaired.size(), 1u);
  EXPECT_NE(s->unpaired[0].find("typo"), std::string::npos);
  EXPECT_NE(s->unpaired[0].find("'e' (b)"), std::string::npos);
  const std::string text = view::FormatPlain(*s, "tcp://127.0.0.1:6201", 80, false);
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) {
    EXPECT_LE(line.size(), 80u) << line;
    lines.push_back(line);
  }
  size_t hdr = 0;
  while (hdr < lines.size() && lines[hdr].find(" KIND ") == std::string::npos) ++hdr;
  ASSERT_LT(hdr + 1, lines.size()) << text;
  EXPECT_NE(lines[hdr + 1].find("~0.self_attn.out_proj       param_grad "), std::string::npos) << text;
  EXPECT_NE(lines[hdr + 1].find("producer"), std::string::npos) << text;
  EXPECT_NE(text.find("7.80ms"), std::string::npos) << text;
  EXPECT_NE(text.find("first NaN/Inf: step 3"), std::string::npos) << text;
  EXPECT_NE(text.find("candidate NaN"), std::string::npos) << text;
  // The solo run's alert is not under the pair, and says whose it is.
  EXPECT_NE(text.find("[old-solo] stall"), std::string::npos) << text;
  EXPECT_EQ(text.find("alerts 2 (1 critical)"), text.find("alerts "));  // one count, in the header
}

// Issue 30 item 6e: "compared 160" on 4 ranks was 40 steps × 4 ranks without saying so.
TEST(Snapshot, ComparedSaysWhatItCounts) {
  EXPECT_EQ(view::ComparedText(40, 1, true), "40 steps");
  EXPECT_EQ(view::ComparedText(160, 4, true), "40 steps \u00d7 4 ranks");
  EXPECT_EQ(view::ComparedText(160, 4, false), "40 steps x 4 ranks");
  EXPECT_EQ(view::ComparedText(161, 4, false), "161 rank-steps over 4 ranks");
  EXPECT_EQ(view::ComparedText(7, 0, false), "7");  // an older collector does not say
  auto s = view::ParseSnapshot(R"({"v":1,"t":0,"runs":[],
    "pairs":[{"experiment":"e","baseline":"b","candidate":"c","step":39,"compared":160,"ranks":4}]})");
  ASSERT_TRUE(s.ok()) << s.status().message();
  const std::string text = view::FormatPlain(*s, "tcp://127.0.0.1:6201", 80, false);
  EXPECT_NE(text.find("PAIR e: b vs c  step 39  compared 40 steps x 4 ranks"), std::string::npos) << text;
}

TEST(ViewModel, TheFeedSaysOverHowManyRanksItCompared) {
  ViewModel vm;
  Feeder f(&vm);
  for (uint64_t s = 0; s < 3; ++s) {
    for (uint32_t r = 0; r < 2; ++r) f.Step(s, {{1, Kind::kAct, 0, 0.1}}, 1.0, 1.0, true, r);
  }
  const json p = Snap(vm)["pairs"][0];
  EXPECT_EQ(p["compared"], 6);
  EXPECT_EQ(p["ranks"], 2);
}

// The feed's writer and reader walk one field list (snapshot_json.h): what the
// collector writes reads back whole, so writing it again gives the same bytes.
TEST(Snapshot, WhatTheCollectorWritesReadsBackWhole) {
  ViewModelOptions opt;
  opt.history_tensors = 1;
  ViewModel vm(opt);
  Feeder f(&vm);
  for (uint64_t s = 0; s < 8; ++s) {
    f.Step(s, {{1, Kind::kAct, 0, s == 3 ? 3.0 : 0.2}, {2, Kind::kParamGrad, 30, s >= 6 ? NAN : 0.5}},
           1.0 + s * 0.01, s == 5 ? NAN : 1.0, /*c_loss_given=*/s != 4, static_cast<uint32_t>(s % 2));
  }
  alerting::Alert a;
  a.rule = "nonfinite";
  a.severity = alerting::Severity::kCritical;
  a.runs = {"base", "cand"};
  a.step = 6;
  vm.OnAlert(a);
  std::vector<RankInfo> ranks(2);
  ranks[0].run = "base";
  ranks[0].hello_seen = true;
  ranks[0].role = "baseline";
  ranks[0].has_step = true;
  ranks[0].last_step = 7;
  ranks[0].last_recv_unix_ns = 1'000'000'000;
  ranks[1] = ranks[0];
  ranks[1].run = "cand";
  ranks[1].role = "candidate";
  ranks[1].last_step = 5;
  const std::string written = vm.SnapshotJson(ranks, ViewExtras{10, 1, 2}, 3'000'000'000);
  auto read = view::ReadSnapshotJson(written);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(view::WriteSnapshotJson(*read), written);
  // Fields top does not show are read all the same.
  EXPECT_EQ(read->analyzer_errors, 2u);
  ASSERT_EQ(read->pairs.size(), 1u);
  EXPECT_EQ(read->pairs[0].first_div_step, 3);
  EXPECT_EQ(read->pairs[0].first_div_rank, 1u);  // step 3 compared on rank 1
  EXPECT_EQ(read->runs[1].lag, 2);  // cand at step 5, its partner at 7
  EXPECT_FALSE(read->pairs[0].loss_hist[4].c_given);
  EXPECT_TRUE(read->pairs[0].loss_hist[5].c_given);  // a NaN loss given
}

}  // namespace
}  // namespace lockstep::collector
