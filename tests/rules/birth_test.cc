// The birth rule (rules/birth.h) on hand-made steps: which op adds error of its own,
// judged against its dtype's rounding, and what must stay silent.
#include "rules/birth.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace lockstep::collector {
namespace {

constexpr int kK = 16;

// Two steps (baseline, candidate) built row by row; each row's candidate is the
// baseline's tensor moved by a relative distance `err` (its sketch moved so).
class Steps {
 public:
  explicit Steps(NameTable* names) : names_(names) {}

  // A row of `name`/`kind` whose candidate differs by relative distance `err`.
  void Add(const std::string& name, Kind kind, double err, DT dtype_c = DT::kF32, bool repeat = false,
           uint32_t order = 0) {
    const uint32_t id = names_->Intern(name);
    AddTo(&b_, id, kind, 0, DT::kF32, repeat, order);
    AddTo(&c_, id, kind, err, dtype_c, repeat, order);
  }
  // A row that is no repeat with the statistics of the earlier row `like`/`like_kind` in
  // both runs (the same tensor received again: a second consumer of one output).
  void AddLike(const std::string& name, Kind kind, const std::string& like, Kind like_kind, uint32_t order) {
    const uint64_t key = MakeKey(names_->Intern(like), like_kind, 0);
    double mean = -1;
    for (const StatRow& r : b_.rows) {
      if (r.key == key) mean = r.mean;
    }
    next_mean_ = mean;
    Add(name, kind, 0, DT::kF32, false, order);
  }
  // Sorted by key (as a closed step is) and the matched pairs the analyzer hands on.
  std::vector<BirthRow> Rows() {
    rows_.clear();
    for (size_t i = 0; i < b_.rows.size(); ++i) rows_.push_back(BirthRow{&b_.rows[i], &c_.rows[i]});
    return rows_;
  }
  const StepData& b() const { return b_; }
  const StepData& c() const { return c_; }

 private:
  void AddTo(StepData* s, uint32_t id, Kind kind, double err, DT dtype, bool repeat, uint32_t order) {
    StatRow r;
    r.key = MakeKey(id, kind, 0);
    r.order = order != 0 ? order : static_cast<uint32_t>(s->rows.size() + 1);
    r.dtype = dtype;
    r.numel = 1024;
    r.sketch_k = kK;
    r.sketch_off = static_cast<uint32_t>(s->sketch.size());
    r.repeat = repeat;
    // Sketch of a tensor with norm 32: entries of 8 (16 x 64 = 1024 = 32^2). The
    // candidate's first entry moves by err x 32, so ||S(c) - S(b)|| / l2 = err.
    for (int k = 0; k < kK; ++k) s->sketch.push_back(8.0f);
    s->sketch[r.sketch_off] += static_cast<float>(err * 32.0);
    r.l2 = 32.0;
    // Each row another tensor (distinct statistics) unless AddLike says otherwise.
    r.mean = next_mean_ >= 0 ? next_mean_ : static_cast<double>(s->rows.size() + 1) * 1e-3;
    r.std = 1;
    s->rows.push_back(r);
    if (s == &c_) next_mean_ = -1;
  }
  NameTable* names_;
  double next_mean_ = -1;
  StepData b_, c_;
  std::vector<BirthRow> rows_;
};

class BirthTest : public ::testing::Test {
 protected:
  int Analyze(Steps& s) {
    const PeerScales peers(s.b());
    auto rows = s.Rows();
    return finder_.Analyze(s.b(), s.c(), rows, peers, &ops_);
  }
  std::string BirthName(int i) const { return i < 0 ? "(none)" : names_.Name(ops_[static_cast<size_t>(i)].op); }

  NameTable names_;
  RulesConfig cfg_;
  BirthFinder finder_{&names_, &cfg_};
  std::vector<OpBirth> ops_;
};

// fc1 -> act -> fc2: each input repeats the output before it.
void Mlp(Steps& s, double act_out_err, double fc2_out_err) {
  s.Add("mlp.fc1", Kind::kActIn, 0);
  s.Add("mlp.fc1", Kind::kAct, 0);
  s.Add("mlp.act", Kind::kActIn, 0, DT::kF32, true);
  s.Add("mlp.act", Kind::kAct, act_out_err);
  s.Add("mlp.fc2", Kind::kActIn, act_out_err, DT::kF32, true);
  s.Add("mlp.fc2", Kind::kAct, fc2_out_err);
}

TEST_F(BirthTest, AnOpWhoseInputsAgreeAndOutputDiffersIsTheBirthPoint) {
  Steps s(&names_);
  Mlp(s, 2e-4, 3e-4);  // the GELU computes differently; fc2 only carries it on
  const int i = Analyze(s);
  ASSERT_GE(i, 0);
  EXPECT_EQ(BirthName(i), "mlp.act");
  EXPECT_FALSE(ops_[i].backward);
  EXPECT_NEAR(ops_[i].output_error, 2e-4, 1e-6);
  EXPECT_EQ(ops_[i].input_error, 0);
  EXPECT_GT(ops_[i].ratio, 10);
  // Ranked by ratio: the GELU first; fc2's 3e-4 is explained by its input's 2e-4.
  EXPECT_EQ(names_.Name(ops_[0].op), "mlp.act");
  for (const OpBirth& o : ops_) {
    if (names_.Name(o.op) == "mlp.fc2") EXPECT_FALSE(o.born);
  }
}

TEST_F(BirthTest, RoundingOfItsDtypeIsExplained) {
  Steps s(&names_);
  // Platform noise: every op adds ~1e-6 in fp32 (about 17 units of roundoff).
  s.Add("a", Kind::kActIn, 0);
  s.Add("a", Kind::kAct, 1e-6);
  s.Add("b", Kind::kActIn, 1e-6, DT::kF32, true);
  s.Add("b", Kind::kAct, 3e-6);
  EXPECT_EQ(Analyze(s), -1) << BirthName(Analyze(s));
  ASSERT_EQ(ops_.size(), 2u);
  for (const OpBirth& o : ops_) EXPECT_LT(o.ratio, 1) << names_.Name(o.op);
}

TEST_F(BirthTest, ACoarserDtypeExplainsMore) {
  Steps s(&names_);
  // Fed bf16 and handing on bf16 (the candidate), fp32 in the baseline: it differs by
  // bf16 rounding, explained. The same error in an fp32 run pair is not.
  s.Add("lin", Kind::kActIn, 1e-3, DT::kBF16);
  s.Add("lin", Kind::kAct, 3e-3, DT::kBF16);
  EXPECT_EQ(Analyze(s), -1);
  Steps t(&names_);
  t.Add("lin", Kind::kActIn, 0);
  t.Add("lin", Kind::kAct, 3e-3);
  EXPECT_GE(Analyze(t), 0);
}

TEST_F(BirthTest, AnOpThatHandsOnACoarserDtypeChangedThePrecision) {
  // One Linear with an fp16 output in the candidate, fed the same fp32 inputs: the
  // rounding to fp16 is the error it adds (judged by fp32), a precision birth point.
  Steps s(&names_);
  s.Add("lin", Kind::kActIn, 0);
  s.Add("lin", Kind::kAct, 3e-4, DT::kF16);
  s.Add("next", Kind::kActIn, 3e-4, DT::kF16, true);
  s.Add("next", Kind::kAct, 3e-4, DT::kF16);  // fp16 in, fp16 out: not the one that changed it
  const int i = Analyze(s);
  ASSERT_GE(i, 0);
  EXPECT_EQ(BirthName(i), "lin");
  EXPECT_TRUE(ops_[i].precision);
  EXPECT_EQ(ops_[i].dtype_c, DT::kF16);
  for (const OpBirth& o : ops_) {
    if (names_.Name(o.op) == "next") EXPECT_FALSE(o.born || o.precision);
  }
}

TEST_F(BirthTest, TheNoiseGrowsWithTheReductionWidth) {
  const double narrow = BirthFinder::UnitRoundoff(DT::kF32) * (cfg_.birth_ulps + 2.0);
  names_.SetWidth(names_.Intern("wide"), 1 << 20);
  Steps s(&names_);
  s.Add("wide", Kind::kActIn, 0);
  s.Add("wide", Kind::kAct, 4 * narrow);  // beyond an elementwise op's budget, within a 1M-long sum's
  EXPECT_EQ(Analyze(s), -1);
  ASSERT_EQ(ops_.size(), 1u);
  EXPECT_LT(ops_[0].ratio, 1);
}

TEST_F(BirthTest, AContainerIsNamedOnlyWhenNoSubmoduleExplainsIt) {
  {
    Steps s(&names_);
    s.Add("blk", Kind::kActIn, 0);
    Mlp(s, 2e-4, 3e-4);
    s.Add("blk", Kind::kAct, 3e-4, DT::kF32, true);  // the block's output is fc2's
    const int i = Analyze(s);
    EXPECT_EQ(BirthName(i), "mlp.act");
  }
  {
    // attn's own code (a softmax written inline) differs: proj receives a differing
    // input it did not get from a watched module; no submodule adds error.
    Steps s(&names_);
    s.Add("attn", Kind::kActIn, 0);
    s.Add("attn.qkv", Kind::kActIn, 0, DT::kF32, true);
    s.Add("attn.qkv", Kind::kAct, 0);
    s.Add("attn.proj", Kind::kActIn, 3e-4);
    s.Add("attn.proj", Kind::kAct, 3e-4);
    s.Add("attn", Kind::kAct, 3e-4, DT::kF32, true);
    const int i = Analyze(s);
    EXPECT_EQ(BirthName(i), "attn");
    ASSERT_GE(i, 0);
    EXPECT_TRUE(ops_[i].container);  // "in its own code" in the message
    ASSERT_TRUE(ops_[i].has_fed);      // what its code handed on differently, and to whom
    EXPECT_EQ(names_.Name(ops_[i].fed), "attn.proj");
  }
}

TEST_F(BirthTest, AContainerRoundsLikeItsCoarsestSubmodule) {
  // bf16 autocast: the block's matmul hands on bf16 from fp32 inputs (a precision
  // birth point: its own rounding), and the block's fp32 output (a residual add of it)
  // carries that rounding: the block is not named, and not born by itself either.
  Steps s(&names_);
  s.Add("blk", Kind::kActIn, 0);
  s.Add("blk.lin", Kind::kActIn, 0, DT::kF32, true);
  s.Add("blk.lin", Kind::kAct, 3e-3, DT::kBF16);
  s.Add("blk", Kind::kAct, 2e-3);
  const int i = Analyze(s);
  EXPECT_EQ(BirthName(i), "blk.lin");
  for (const OpBirth& o : ops_) {
    if (names_.Name(o.op) == "blk") EXPECT_LT(o.ratio, 1);  // bf16's budget
  }
}

TEST_F(BirthTest, OneDifferingInputOfSeveralExplainsTheOutput) {
  Steps s(&names_);
  s.Add("op[0]", Kind::kActIn, 0);
  s.Add("op[1]", Kind::kActIn, 1e-3);
  s.Add("op", Kind::kAct, 1e-3);
  EXPECT_EQ(Analyze(s), -1);
  ASSERT_EQ(ops_.size(), 1u);
  EXPECT_NEAR(ops_[0].input_error, 1e-3, 1e-5);  // the larger of the two
}

TEST_F(BirthTest, WeightsThatMovedApartAreNoBirthPoint) {
  auto step = [&](double grad_err, double out_err) {
    Steps s(&names_);
    s.Add("net.fc", Kind::kActIn, 0);
    s.Add("net.fc", Kind::kAct, out_err);
    s.Add("net", Kind::kActIn, 0);
    s.Add("net", Kind::kAct, out_err, DT::kF32, true);
    s.Add("net.fc.weight", Kind::kParamGrad, grad_err);
    return Analyze(s);
  };
  // Step 0: the gradients differ (an op elsewhere); the weights agree still.
  EXPECT_EQ(step(1e-6, 0), -1);
  // Step 1: fc's weights moved apart with the update; its output differing is that,
  // and so is the container's.
  EXPECT_EQ(step(1e-6, 5e-4), -1);
  for (const OpBirth& o : ops_) ADD_FAILURE() << "judged " << names_.Name(o.op);
}

TEST_F(BirthTest, TwinsWithIdenticalGradientsKeepBeingJudged) {
  for (int k = 0; k < 3; ++k) {
    Steps s(&names_);
    s.Add("fc", Kind::kActIn, 0);
    s.Add("fc", Kind::kAct, 0);
    s.Add("fc.weight", Kind::kParamGrad, 0);
    EXPECT_EQ(Analyze(s), -1);
  }
  Steps s(&names_);
  s.Add("fc", Kind::kActIn, 0);
  s.Add("fc", Kind::kAct, 1e-3);  // at step 3 it computes differently
  s.Add("fc.weight", Kind::kParamGrad, 0);
  EXPECT_EQ(BirthName(Analyze(s)), "fc");
}

TEST_F(BirthTest, ABackwardThatDiffersIsABackwardBirthPoint) {
  Steps s(&names_);
  // Forward agrees everywhere. Backward order: fc2's output gradient, then the
  // custom op's (received, agrees), then fc1's (what the custom op passed on: 1e-3).
  s.Add("fc1", Kind::kActIn, 0, DT::kF32, false, 1);
  s.Add("fc1", Kind::kAct, 0, DT::kF32, false, 2);
  s.Add("custom", Kind::kActIn, 0, DT::kF32, true, 3);
  s.Add("custom", Kind::kAct, 0, DT::kF32, false, 4);
  s.Add("fc2", Kind::kActIn, 0, DT::kF32, true, 5);
  s.Add("fc2", Kind::kAct, 0, DT::kF32, false, 6);
  s.Add("fc2", Kind::kActGrad, 0, DT::kF32, false, 7);
  s.Add("custom", Kind::kActGrad, 0, DT::kF32, false, 8);
  s.Add("fc1", Kind::kActGrad, 1e-3, DT::kF32, false, 9);
  const int i = Analyze(s);
  ASSERT_GE(i, 0);
  EXPECT_EQ(BirthName(i), "custom");
  EXPECT_TRUE(ops_[i].backward);
  EXPECT_NEAR(ops_[i].output_error, 1e-3, 1e-5);
}

// trunk -> heads.cls and heads.reg, both reading trunk's output (heads.reg's input is
// no repeat: heads.cls's output was recorded in between). Backward order: heads.reg's
// output gradient, heads.cls's, trunk's (their sum).
void TwoHeads(Steps& s, double reg_grad, double cls_grad, double trunk_grad, bool reg_matches = true) {
  s.Add("trunk", Kind::kActIn, 0, DT::kF32, false, 1);
  s.Add("trunk", Kind::kAct, 0, DT::kF32, false, 2);
  s.Add("heads.cls", Kind::kActIn, 0, DT::kF32, true, 3);
  s.Add("heads.cls", Kind::kAct, 0, DT::kF32, false, 4);
  if (reg_matches) {
    s.AddLike("heads.reg", Kind::kActIn, "trunk", Kind::kAct, 5);
  } else {
    s.Add("heads.reg", Kind::kActIn, 0, DT::kF32, false, 5);
  }
  s.Add("heads.reg", Kind::kAct, 0, DT::kF32, false, 6);
  s.Add("heads.reg", Kind::kActGrad, reg_grad, DT::kF32, false, 7);
  s.Add("heads.cls", Kind::kActGrad, cls_grad, DT::kF32, false, 8);
  s.Add("trunk", Kind::kActGrad, trunk_grad, DT::kF32, false, 9);
}

TEST_F(BirthTest, TheGradientASiblingReceivedIsNotWhatTheOtherPassedOn) {
  // A label changed: the gradient arriving at heads.cls differs, heads.reg's agrees.
  // The next gradient recorded after heads.reg's is heads.cls's: not heads.reg's
  // backward, and not heads.cls's (what it received differs).
  for (const bool matches : {true, false}) {
    Steps s(&names_);
    TwoHeads(s, 0, 0.5, 0.3, matches);
    EXPECT_EQ(BirthName(Analyze(s)), "(none)") << matches;
    for (const OpBirth& o : ops_) EXPECT_FALSE(o.backward && o.op == names_.Intern("heads.reg")) << matches;
  }
  // Who received which output: no module received heads.cls's (the loss did); both
  // heads received trunk's.
  std::vector<uint32_t> c;
  ASSERT_TRUE(finder_.ConsumersOf(names_.Intern("heads.cls"), &c));
  EXPECT_TRUE(c.empty());
  ASSERT_TRUE(finder_.ConsumersOf(names_.Intern("trunk"), &c));  // the last step: heads.reg's input unknown
  ASSERT_EQ(c.size(), 1u);
  Steps s(&names_);
  TwoHeads(s, 0, 0.5, 0.3);
  Analyze(s);
  ASSERT_TRUE(finder_.ConsumersOf(names_.Intern("trunk"), &c));
  std::vector<std::string> got;
  for (uint32_t id : c) got.push_back(names_.Name(id));
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::string>{"heads.cls", "heads.reg"}));
  EXPECT_FALSE(finder_.ConsumersOf(names_.Intern("nowhere"), &c));
}

TEST_F(BirthTest, AGradientSummedOverSiblingsBlamesNoneOfThem) {
  // Both heads received agreeing gradients, trunk's differs: one of their backwards
  // computes differently, and trunk's gradient (the sum) cannot tell which.
  Steps s(&names_);
  TwoHeads(s, 0, 0, 1e-3);
  EXPECT_EQ(BirthName(Analyze(s)), "(none)");
  // With one head only reading trunk's output (the other's input is another tensor),
  // that head is the one whose backward passed it on.
  Steps t(&names_);
  TwoHeads(t, 0, 0, 1e-3, false);
  const int i = Analyze(t);
  EXPECT_EQ(BirthName(i), "heads.cls");
  ASSERT_GE(i, 0);
  EXPECT_TRUE(ops_[i].backward);
}

TEST_F(BirthTest, AContainerAndItsFirstChildReceiveOneTensor) {
  // prev -> seq(seq.0 -> seq.1): seq and seq.0 both received prev's output (one chain,
  // not two consumers). seq.0's backward differs: it is named, seq is not.
  Steps s(&names_);
  s.Add("prev", Kind::kActIn, 0, DT::kF32, false, 1);
  s.Add("prev", Kind::kAct, 0, DT::kF32, false, 2);
  s.Add("seq", Kind::kActIn, 0, DT::kF32, true, 3);
  s.Add("seq.0", Kind::kActIn, 0, DT::kF32, true, 4);
  s.Add("seq.0", Kind::kAct, 0, DT::kF32, false, 5);
  s.Add("seq.1", Kind::kActIn, 0, DT::kF32, true, 6);
  s.Add("seq.1", Kind::kAct, 0, DT::kF32, false, 7);
  s.Add("seq", Kind::kAct, 0, DT::kF32, true, 8);
  s.Add("seq.1", Kind::kActGrad, 0, DT::kF32, false, 9);
  s.Add("seq", Kind::kActGrad, 0, DT::kF32, true, 10);
  s.Add("seq.0", Kind::kActGrad, 0, DT::kF32, false, 11);
  s.Add("prev", Kind::kActGrad, 1e-3, DT::kF32, false, 12);
  const int i = Analyze(s);
  EXPECT_EQ(BirthName(i), "seq.0");
  ASSERT_GE(i, 0);
  EXPECT_TRUE(ops_[i].backward);
  std::vector<uint32_t> c;
  ASSERT_TRUE(finder_.ConsumersOf(names_.Intern("prev"), &c));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(names_.Name(c[0]), "seq");
}

TEST_F(BirthTest, AForwardBirthPointComesBeforeABackwardOne) {
  Steps s(&names_);
  s.Add("a", Kind::kActIn, 0, DT::kF32, false, 1);
  s.Add("a", Kind::kAct, 1e-3, DT::kF32, false, 2);
  s.Add("b", Kind::kActIn, 1e-3, DT::kF32, true, 3);
  s.Add("b", Kind::kAct, 1e-3, DT::kF32, false, 4);
  s.Add("b", Kind::kActGrad, 0, DT::kF32, false, 5);
  s.Add("a", Kind::kActGrad, 1e-2, DT::kF32, false, 6);
  const int i = Analyze(s);
  ASSERT_GE(i, 0);
  EXPECT_EQ(BirthName(i), "a");
  EXPECT_FALSE(ops_[i].backward);
}

// A block around a module with three inputs and two outputs (nn.MultiheadAttention:
// query, key, value -> (output, weights)), named as the agent names them: inputs
// `in(i)` (in(0) = "blk.attn(0)"; older logs: "blk.attn[0]"), outputs "blk.attn[i]".
// The types are those the agent declares (an input's and an element's are the module's).
void TupleBlock(NameTable* names, Steps& s, const std::string& in0, const std::string& in1,
                const std::string& in2, double out0_err, double out1_err) {
  for (const auto& n : {in0, in1, in2, std::string("blk.attn[0]"), std::string("blk.attn[1]")}) {
    names->SetModuleType(names->Intern(n), "MultiheadAttention");
  }
  names->SetModuleType(names->Intern("blk"), "Block");
  s.Add("blk", Kind::kActIn, 0);
  s.Add(in0, Kind::kActIn, 0, DT::kF32, true);
  s.Add(in1, Kind::kActIn, 0, DT::kF32, true);
  s.Add(in2, Kind::kActIn, 0, DT::kF32, true);
  s.Add("blk.attn[0]", Kind::kAct, out0_err);
  s.Add("blk.attn[1]", Kind::kAct, out1_err);
  s.Add("blk", Kind::kAct, std::max(out0_err, out1_err));  // a residual add of attn[0]
}

TEST_F(BirthTest, AModuleWithSeveralInputsAndATupleOutputIsJudged) {
  Steps s(&names_);
  TupleBlock(&names_, s, "blk.attn(0)", "blk.attn(1)", "blk.attn(2)", 3e-4, 0);
  const int i = Analyze(s);
  ASSERT_GE(i, 0);
  EXPECT_EQ(BirthName(i), "blk.attn");
  EXPECT_EQ(names_.Display(ops_[i].op), "blk.attn (MultiheadAttention)");
  EXPECT_FALSE(ops_[i].container);  // the block is explained by it, not "in its own code"
  EXPECT_NEAR(ops_[i].output_error, 3e-4, 1e-6);
  EXPECT_EQ(ops_[i].input_error, 0);
  ASSERT_NE(ops_[i].out_c, nullptr);
  EXPECT_EQ(names_.Name(KeyNameId(ops_[i].out_c->key)), "blk.attn[0]");
  EXPECT_EQ(ops_[i].order, ops_[i].out_c->order);
  for (const OpBirth& o : ops_) {
    EXPECT_NE(names_.Name(o.op), "blk.attn[0]");  // an element is no op of its own
    if (names_.Name(o.op) == "blk") EXPECT_FALSE(o.born);
  }
}

TEST_F(BirthTest, TheLargestErrorAmongTheOutputsIsTheOutputError) {
  // Only the second output (the attention weights) differs: it is the op's output too.
  Steps s(&names_);
  TupleBlock(&names_, s, "blk.attn(0)", "blk.attn(1)", "blk.attn(2)", 0, 5e-4);
  const int i = Analyze(s);
  ASSERT_GE(i, 0);
  EXPECT_EQ(BirthName(i), "blk.attn");
  EXPECT_NEAR(ops_[i].output_error, 5e-4, 1e-6);
  EXPECT_EQ(names_.Name(KeyNameId(ops_[i].out_c->key)), "blk.attn[1]");
  // Its order is the first output's: it comes before anything computed from either.
  EXPECT_LT(ops_[i].order, ops_[i].out_c->order);
}

TEST_F(BirthTest, OlderLogsNameSeveralInputsWithBrackets) {
  // Before inputs were named "attn(0)", they were "attn[0]": the same string as the
  // first output element (another kind). The act_in row is still an input of blk.attn.
  Steps s(&names_);
  TupleBlock(&names_, s, "blk.attn[0]", "blk.attn[1]", "blk.attn[2]", 3e-4, 0);
  const int i = Analyze(s);
  ASSERT_GE(i, 0);
  EXPECT_EQ(BirthName(i), "blk.attn");
  EXPECT_NEAR(ops_[i].output_error, 3e-4, 1e-6);
}

TEST_F(BirthTest, KeywordAndNestedInputsBelongToTheModule) {
  // torch >= 2.0: keyword inputs (attn(attention_mask)) and the elements of a tuple
  // argument (attn(position_embeddings)[0]); one of them differing explains the output.
  Steps s(&names_);
  s.Add("attn(hidden_states)", Kind::kActIn, 0);
  s.Add("attn(position_embeddings)[0]", Kind::kActIn, 1e-3);
  s.Add("attn(position_embeddings)[1]", Kind::kActIn, 0);
  s.Add("attn[0]", Kind::kAct, 1e-3);
  EXPECT_EQ(Analyze(s), -1);
  ASSERT_EQ(ops_.size(), 1u);
  EXPECT_EQ(names_.Name(ops_[0].op), "attn");
  EXPECT_NEAR(ops_[0].input_error, 1e-3, 1e-5);
  Steps t(&names_);
  t.Add("attn(hidden_states)", Kind::kActIn, 0);
  t.Add("attn(position_embeddings)[0]", Kind::kActIn, 0);
  t.Add("attn(position_embeddings)[1]", Kind::kActIn, 0);
  t.Add("attn[0]", Kind::kAct, 1e-3);
  EXPECT_EQ(BirthName(Analyze(t)), "attn");
}

TEST_F(BirthTest, RoundingInEveryOutputIsExplained) {
  // Platform noise: each output differs by a few units of fp32 roundoff.
  Steps s(&names_);
  TupleBlock(&names_, s, "blk.attn(0)", "blk.attn(1)", "blk.attn(2)", 1e-6, 1.5e-6);
  EXPECT_EQ(Analyze(s), -1) << BirthName(Analyze(s));
  bool judged = false;
  for (const OpBirth& o : ops_) judged = judged || names_.Name(o.op) == "blk.attn";
  EXPECT_TRUE(judged);
}

TEST_F(BirthTest, ATupleOutputModuleWhoseWeightsMovedIsNoBirthPoint) {
  // Its parameter's row comes first in the step (before the input that interns
  // "blk.attn"): the weights are still its.
  auto step = [&](double grad_err, double out_err) {
    Steps s(&names_);
    s.Add("blk.attn.in_proj_weight", Kind::kParamGrad, grad_err);
    TupleBlock(&names_, s, "blk.attn(0)", "blk.attn(1)", "blk.attn(2)", out_err, 0);
    return Analyze(s);
  };
  EXPECT_EQ(step(1e-6, 0), -1);
  EXPECT_EQ(step(0, 5e-4), -1);
  for (const OpBirth& o : ops_) ADD_FAILURE() << "judged " << names_.Name(o.op);
  EXPECT_GE(finder_.WeightsMovedSince(static_cast<uint32_t>(names_.Find("blk.attn"))), 0);
}

TEST_F(BirthTest, NamedtupleFieldsAreOutputsAndChildModulesAreNot) {
  // heads returns a namedtuple (heads.logits, heads.aux); heads.proj is a submodule
  // with its own type (an int input: no act_in) that differs too.
  for (const char* n : {"heads", "heads.logits", "heads.aux"}) names_.SetModuleType(names_.Intern(n), "Heads");
  names_.SetModuleType(names_.Intern("heads.proj"), "Embedding");
  Steps s(&names_);
  s.Add("heads", Kind::kActIn, 0);
  s.Add("heads.proj", Kind::kAct, 1e-2);
  s.Add("heads.logits", Kind::kAct, 2e-4);
  s.Add("heads.aux", Kind::kAct, 0);
  const int i = Analyze(s);
  ASSERT_GE(i, 0);
  EXPECT_EQ(BirthName(i), "heads");
  EXPECT_NEAR(ops_[i].output_error, 2e-4, 1e-6);  // not heads.proj's 1e-2
  EXPECT_TRUE(ops_[i].container);  // heads.proj is a submodule
}

TEST_F(BirthTest, NonFiniteOnOneSideIsAnInfiniteError) {
  StepData b, c;
  StatRow rb, rc;
  rb.numel = rc.numel = 4;
  rb.l2 = rc.l2 = 2;
  rc.nan_count = 1;
  EXPECT_TRUE(std::isinf(BirthFinder::RelError(b, rb, c, rc, 1)));
  rb.nan_count = 1;
  EXPECT_TRUE(std::isnan(BirthFinder::RelError(b, rb, c, rc, 1)));
}

}  // namespace
}  // namespace lockstep::collector
