// The analyzer and every rule on synthetic streams (real FlatBuffers messages from a
// fake agent, tests/detect/stream_builder.h).
#include "detect/analyzer.h"

#include <chrono>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lockstep/common/clock.h"
#include "stream_builder.h"

namespace lockstep::collector {
namespace {

using lockstep::testing::AsEnvelope;
using lockstep::testing::FakeScalars;
using lockstep::testing::FakeStat;
using lockstep::testing::FakeTensor;
using lockstep::testing::StreamBuilder;

constexpr int kTensors = 5;

std::vector<FakeTensor> Model(const std::string& prefix = "", wire::DType dt = wire::DType::F32) {
  std::vector<FakeTensor> v;
  for (int i = 0; i < kTensors; ++i) {
    v.push_back(FakeTensor{prefix + "layers." + std::to_string(i), wire::TensorKind::Act, dt, static_cast<uint32_t>(i)});
  }
  return v;
}

std::vector<double> Values(int tensor, uint64_t step) {
  std::vector<double> v(64);
  for (size_t j = 0; j < v.size(); ++j) v[j] = std::sin(0.37 * tensor + 0.11 * step + 0.05 * j) + 0.1 * tensor;
  return v;
}

using Perturb = std::function<void(uint64_t step, int tensor, std::vector<double>* v)>;

struct Harness {
  std::vector<alerting::Alert> alerts;
  FakeClock clock;  // unix 1.7e18 ns
  std::unique_ptr<Analyzer> an;

  explicit Harness(AnalyzerOptions opt = {}) {
    an = std::make_unique<Analyzer>(
        std::move(opt), [this](alerting::Alert a) { alerts.push_back(std::move(a)); }, &clock);
  }
  void Feed(const std::vector<uint8_t>& m) { an->OnMessage(AsEnvelope(m), Now()); }
  int64_t Now() const { return clock.NowUnixNs(); }
  size_t Count(const std::string& rule) const {
    size_t n = 0;
    for (const auto& a : alerts) n += a.rule == rule;
    return n;
  }
  const alerting::Alert* First(const std::string& rule) const {
    for (const auto& a : alerts) {
      if (a.rule == rule) return &a;
    }
    return nullptr;
  }
  std::string Dump() const {
    std::string s;
    for (const auto& a : alerts) s += a.rule + ": " + a.message + "\n";
    return s;
  }
};

std::vector<uint8_t> StepMsg(StreamBuilder& sb, uint64_t step, const Perturb& perturb) {
  std::vector<FakeStat> stats;
  for (int i = 0; i < kTensors; ++i) {
    auto v = Values(i, step);
    if (perturb) perturb(step, i, &v);
    auto s = FakeStat::Vec(i, v);
    s.order = i;
    stats.push_back(s);
  }
  return sb.Stats(step, stats);
}

// Baseline and candidate step by step, interleaved; the candidate's values perturbed.
void RunPair(Harness& h, uint64_t steps, const Perturb& perturb, const std::string& cand_prefix = "",
             std::function<double(uint64_t)> cand_loss = nullptr) {
  StreamBuilder b("base", "exp", wire::Role::Baseline), c("cand", "exp", wire::Role::Candidate);
  h.Feed(b.Hello());
  h.Feed(c.Hello());
  h.Feed(b.Directory(Model()));
  h.Feed(c.Directory(Model(cand_prefix)));
  for (uint64_t s = 0; s < steps; ++s) {
    FakeScalars sc;
    sc.loss = 2.0 - 0.001 * s;
    h.Feed(StepMsg(b, s, nullptr));
    h.Feed(b.Scalars(s, sc));
    if (cand_loss) sc.loss = cand_loss(s);
    h.Feed(StepMsg(c, s, perturb));
    h.Feed(c.Scalars(s, sc));
  }
  h.Feed(b.Goodbye(steps - 1));
  h.Feed(c.Goodbye(steps - 1));
  h.an->Finish();
}

TEST(Analyzer, IdenticalRunsRaiseNoAlert) {
  Harness h;
  RunPair(h, 200, nullptr);
  EXPECT_TRUE(h.alerts.empty()) << h.Dump();
  auto r = h.an->Reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].steps_compared, 200u);
  EXPECT_EQ(h.an->counters().pairs_compared, 200u * kTensors);
  EXPECT_FALSE(r[0].diverged);
  EXPECT_EQ(r[0].tensors.size(), static_cast<size_t>(kTensors));
  for (const auto& t : r[0].tensors) EXPECT_EQ(t.status, "ok");
}

// Issue 15: fingerprints, the setup rule, the scalars rule and the first divergence's cause.
void RunFingerprinted(Harness& h, uint64_t steps, const std::vector<std::pair<std::string, std::string>>& fb,
                      const std::vector<std::pair<std::string, std::string>>& fc, const Perturb& perturb,
                      std::function<double(uint64_t)> cand_lr = nullptr) {
  StreamBuilder b("base", "exp", wire::Role::Baseline), c("cand", "exp", wire::Role::Candidate);
  h.Feed(b.Hello());
  h.Feed(c.Hello());
  h.Feed(b.Fingerprint(fb));
  h.Feed(c.Fingerprint(fc));
  h.Feed(b.Directory(Model()));
  h.Feed(c.Directory(Model()));
  for (uint64_t s = 0; s < steps; ++s) {
    FakeScalars sc;
    sc.loss = 2.0;
    sc.lr = 1e-3;
    h.Feed(StepMsg(b, s, nullptr));
    h.Feed(b.Scalars(s, sc));
    if (cand_lr) sc.lr = cand_lr(s);
    h.Feed(StepMsg(c, s, perturb));
    h.Feed(c.Scalars(s, sc));
  }
  h.Feed(b.Goodbye(steps - 1));
  h.Feed(c.Goodbye(steps - 1));
  h.an->Finish();
}

const std::vector<std::pair<std::string, std::string>> kFp = {
    {"module.drop.p", "0.0"}, {"optim.group0.weight_decay", "0.01"}, {"version.torch", "2.1.0"}};

TEST(Analyzer, EqualFingerprintsRaiseNoSetupAlert) {
  Harness h;
  RunFingerprinted(h, 5, kFp, kFp, nullptr);
  EXPECT_TRUE(h.alerts.empty()) << h.Dump();
  auto r = h.an->Reports();
  EXPECT_TRUE(r[0].setup_known);
  EXPECT_TRUE(r[0].setup.empty());
}

TEST(Analyzer, SetupListsEveryDifferenceOnceAndNamesTheCause) {
  Harness h;
  auto fc = kFp;
  fc[1].second = "0.1";        // weight decay: config, warning
  fc[2].second = "2.4.0";      // torch version: environment, info
  fc.push_back({"amp", "bfloat16"});  // only the candidate: precision
  RunFingerprinted(h, 12, kFp, fc, [](uint64_t s, int t, std::vector<double>* v) {
    if (s >= 7 && t >= 2) for (double& x : *v) x *= 1.05;
  });
  ASSERT_EQ(h.Count("setup"), 1u) << h.Dump();
  const auto* s = h.First("setup");
  EXPECT_EQ(s->severity, alerting::Severity::kWarning);
  EXPECT_EQ(s->step, 0u);
  EXPECT_NE(s->message.find("optim.group0.weight_decay 0.01 vs 0.1"), std::string::npos) << s->message;
  EXPECT_NE(s->message.find("version.torch 2.1.0 vs 2.4.0"), std::string::npos) << s->message;
  EXPECT_NE(s->message.find("amp (absent) vs bfloat16"), std::string::npos) << s->message;
  EXPECT_EQ(s->incident, "setup/exp/base/cand");
  auto r = h.an->Reports();
  ASSERT_EQ(r[0].setup.size(), 3u);
  EXPECT_EQ(r[0].setup[0].key, "amp");
  EXPECT_EQ(r[0].setup[0].category, "precision");
  EXPECT_EQ(r[0].setup[1].category, "config");
  EXPECT_EQ(r[0].setup[2].category, "environment");
  EXPECT_EQ(r[0].setup[2].severity, alerting::Severity::kInfo);
  const auto* fd = h.First("first_divergence");
  ASSERT_NE(fd, nullptr) << h.Dump();
  EXPECT_EQ(fd->cause, "config");  // a config difference wins over a precision one
  EXPECT_NE(fd->message.find("weight_decay"), std::string::npos) << fd->message;
}

// Issue 30 item 5: a run resumed under its own run id reads its fingerprint at its
// start_step, where a scheduler has moved lr; the baseline read it at step 0.
TEST(SetupRule, ScheduledValuesReadAtDifferentStepsAreNotCompared) {
  const Fingerprint b = {{"fingerprint.step", "0"},           {"optim.group0.lr", "0.001"},
                         {"optim.group0.initial_lr", "0.001"}, {"optim.group0.betas", "(0.9, 0.999)"},
                         {"optim.group0.weight_decay", "0.01"}, {"optim.group1.lr", "0.01"}};
  Fingerprint c = b;
  c["fingerprint.step"] = "400";
  c["optim.group0.lr"] = "0.00025";
  c["optim.group0.betas"] = "(0.85, 0.999)";
  c["optim.group1.lr"] = "0.0025";
  std::string note;
  EXPECT_TRUE(DiffFingerprints(b, c, &note).empty());
  EXPECT_EQ(note,
            "the fingerprints were read at step 0 vs 400 (a run resumed under its own run id): the optimizer's "
            "scheduled values (lr, momentum, betas) are not compared (optim.group0.betas (0.9, 0.999) vs (0.85, "
            "0.999); optim.group0.lr 0.001 vs 0.00025; optim.group1.lr 0.01 vs 0.0025); lr is compared step by "
            "step by the scalars rule when step(lr=) is given");
  // Many param groups: the first three named, the rest counted.
  Fingerprint b4 = b, c4 = c;
  b4["optim.group2.lr"] = "0.1";
  c4["optim.group2.lr"] = "0.025";
  EXPECT_TRUE(DiffFingerprints(b4, c4, &note).empty());
  EXPECT_NE(note.find("optim.group1.lr 0.01 vs 0.0025; +1 more)"), std::string::npos) << note;
  // The scheduler's base lr and every other hyperparameter stay compared.
  c["optim.group0.initial_lr"] = "0.002";
  c["optim.group0.weight_decay"] = "0.1";
  auto d = DiffFingerprints(b, c, &note);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].key, "optim.group0.initial_lr");
  EXPECT_EQ(d[1].key, "optim.group0.weight_decay");
  EXPECT_EQ(d[1].severity, alerting::Severity::kWarning);
}

TEST(SetupRule, SameStepOrAnOldAgentComparesLrAsBefore) {
  Fingerprint b = {{"fingerprint.step", "0"}, {"optim.group0.lr", "0.001"}};
  Fingerprint c = {{"fingerprint.step", "0"}, {"optim.group0.lr", "0.002"}};
  std::string note = "stale";
  auto d = DiffFingerprints(b, c, &note);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].key, "optim.group0.lr");
  EXPECT_EQ(note, "");
  // An agent that does not say where it read it (fingerprint.step on one side only):
  // compared as before, and the step itself is no setting.
  c.erase("fingerprint.step");
  c["optim.group0.lr"] = "0.00025";
  d = DiffFingerprints(b, c, &note);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].key, "optim.group0.lr");
  EXPECT_EQ(d[0].candidate, "0.00025");
  EXPECT_EQ(note, "");
}

TEST(SetupRule, AnInitialLrOnOneSideIsComparedWithTheEarlierReadLr) {
  // The baseline made its scheduler after watch(): no initial_lr there; its lr at step 0
  // is the base lr the resumed run's scheduler kept.
  Fingerprint b = {{"fingerprint.step", "0"}, {"optim.group0.lr", "0.001"}};
  Fingerprint c = {{"fingerprint.step", "400"}, {"optim.group0.lr", "0.00025"}, {"optim.group0.initial_lr", "0.001"}};
  EXPECT_TRUE(DiffFingerprints(b, c).empty());
  c["optim.group0.initial_lr"] = "0.002";
  auto d = DiffFingerprints(b, c);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].key, "optim.group0.initial_lr");
  EXPECT_EQ(d[0].baseline, "(absent; lr 0.001)");
  // The side read later has a scheduled lr: its absence is shown as it is.
  std::swap(b["fingerprint.step"], c["fingerprint.step"]);
  d = DiffFingerprints(b, c);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].baseline, "(absent)");
}

TEST(Analyzer, TheSetupAlertSaysWhatWasNotCompared) {
  Harness h;
  std::vector<std::pair<std::string, std::string>> fb = {
      {"fingerprint.step", "0"}, {"optim.group0.lr", "0.001"}, {"optim.group0.weight_decay", "0.01"}};
  auto fc = fb;
  fc[0].second = "5";
  fc[1].second = "0.0005";
  fc[2].second = "0.1";
  RunFingerprinted(h, 3, fb, fc, nullptr);
  ASSERT_EQ(h.Count("setup"), 1u) << h.Dump();
  EXPECT_EQ(h.First("setup")->message,
            "runs base and cand are set up differently: 1 setting differs (1 to check, 0 info): "
            "optim.group0.weight_decay 0.01 vs 0.1; the fingerprints were read at step 0 vs 5 (a run resumed under "
            "its own run id): the optimizer's scheduled values (lr, momentum, betas) are not compared "
            "(optim.group0.lr 0.001 vs 0.0005); lr is compared step by step by the scalars rule when step(lr=) is "
            "given");
  EXPECT_EQ(h.an->Reports()[0].setup_note.rfind("the fingerprints were read at step 0 vs 5", 0), 0u);
}

TEST(Analyzer, AVersionAloneIsInfoAndTheCauseIsUnknownWithoutInputs) {
  Harness h;
  auto fc = kFp;
  fc[2].second = "2.4.0";
  fc.push_back({"env.HCCL_DETERMINISTIC", "true"});  // set on one platform only: info too
  RunFingerprinted(h, 12, kFp, fc, [](uint64_t s, int t, std::vector<double>* v) {
    if (s >= 7 && t >= 2) for (double& x : *v) x *= 1.05;
  });
  ASSERT_EQ(h.Count("setup"), 1u) << h.Dump();
  EXPECT_EQ(h.First("setup")->severity, alerting::Severity::kInfo);
  const auto* fd = h.First("first_divergence");
  ASSERT_NE(fd, nullptr);
  EXPECT_EQ(fd->cause, "unknown");  // no input statistics: data cannot be told from an op
}

TEST(Analyzer, LrRuleFiresOnceAtTheFirstStepItDiffersAndIsTheCause) {
  Harness h;
  RunFingerprinted(h, 12, kFp, kFp, [](uint64_t s, int t, std::vector<double>* v) {
    if (s >= 6 && t >= 1) for (double& x : *v) x *= 1.05;
  }, [](uint64_t s) { return s >= 5 ? 1e-2 : 1e-3; });
  ASSERT_EQ(h.Count("scalars"), 1u) << h.Dump();
  const auto* lr = h.First("scalars");
  EXPECT_EQ(lr->step, 5u);
  EXPECT_EQ(lr->tensor, "lr");
  EXPECT_EQ(lr->message, "lr differs from step 5: 0.001 vs 0.01");
  const auto* fd = h.First("first_divergence");
  ASSERT_NE(fd, nullptr);
  EXPECT_EQ(fd->step, 6u);
  EXPECT_EQ(fd->cause, "config");
  EXPECT_NE(fd->message.find("lr differs from step 5"), std::string::npos) << fd->message;
}

TEST(Analyzer, FirstDivergenceNamesEarliestDriftingTensorWithBothValues) {
  Harness h;
  // From step 7, tensor 2 is off by 5% and everything after it inherits the error.
  RunPair(h, 20, [](uint64_t s, int t, std::vector<double>* v) {
    if (s >= 7 && t >= 2) for (double& x : *v) x *= 1.05;
  });
  const auto* fd = h.First("first_divergence");
  ASSERT_NE(fd, nullptr) << h.Dump();
  EXPECT_EQ(h.Count("first_divergence"), 1u);
  EXPECT_EQ(fd->step, 7u);
  EXPECT_EQ(fd->tensor, "layers.2");
  EXPECT_EQ(fd->kind, "act");
  EXPECT_FALSE(std::isnan(fd->baseline_value));
  EXPECT_NEAR(fd->candidate_value / fd->baseline_value, 1.05, 1e-6);
  EXPECT_EQ(fd->severity, alerting::Severity::kCritical);  // 5% vs fp32 tolerance 1e-3
  EXPECT_EQ(fd->runs, (std::vector<std::string>{"base", "cand"}));
  // tensor_drift: once per tensor, capped per step, earliest first.
  EXPECT_EQ(h.Count("tensor_drift"), 3u) << h.Dump();
  auto r = h.an->Reports();
  EXPECT_TRUE(r[0].diverged);
  EXPECT_EQ(r[0].first_divergence.tensor, "layers.2");
  EXPECT_EQ(r[0].tensors[1].status, "ok");
  EXPECT_EQ(r[0].tensors[2].first_drift_step, 7);
  EXPECT_EQ(fd->message.find("had no tensors"), std::string::npos) << fd->message;  // every step recorded
}

// A sampled pair (tensors every 5th step, scalars and StepEnd every step: watch(every=5),
// --sample-quiet): a change from step 7 is first seen at step 10, and the first
// divergence says that it may have begun at any of steps 6..9.
TEST(Analyzer, AnOnsetAfterStepsWithoutTensorsSaysWhereItMayHaveBegun) {
  Harness h;
  StreamBuilder b("base", "exp", wire::Role::Baseline), c("cand", "exp", wire::Role::Candidate);
  b.minor = c.minor = 3;
  h.Feed(b.Hello());
  h.Feed(c.Hello());
  h.Feed(b.Directory(Model()));
  h.Feed(c.Directory(Model()));
  const Perturb perturb = [](uint64_t s, int t, std::vector<double>* v) {
    if (s >= 7 && t >= 2) for (double& x : *v) x *= 1.05;
  };
  for (uint64_t s = 0; s < 20; ++s) {
    FakeScalars sc;
    sc.loss = 2.0 - 0.001 * s;
    for (StreamBuilder* sb : {&b, &c}) {
      const bool sampled = s % 5 == 0;
      if (sampled) h.Feed(StepMsg(*sb, s, sb == &c ? perturb : nullptr));
      h.Feed(sb->Scalars(s, sc));
      h.Feed(sb->StepEnd(s, sampled ? kTensors : 0));
    }
  }
  h.Feed(b.Goodbye(19));
  h.Feed(c.Goodbye(19));
  h.an->Finish();
  const auto* fd = h.First("first_divergence");
  ASSERT_NE(fd, nullptr) << h.Dump();
  EXPECT_EQ(fd->step, 10u);
  EXPECT_EQ(fd->tensor, "layers.2");
  EXPECT_NE(fd->message.find("; steps 6..9 had no tensors (sampled): the change may have begun at any of them, "
                             "and this is where it shows first"),
            std::string::npos)
      << fd->message;
}

// Issue 14: a chain of ops layers.0 -> ... -> layers.4, each recording what it received
// (act_in: the data for layers.0, a repeat of the previous op's output after it). From
// step 3 the candidate's layers.2 computes 2e-4 differently, under the fp32 tolerance,
// and every op after it inherits the error.
std::vector<uint8_t> ChainStepMsg(StreamBuilder& sb, uint64_t step, bool cand) {
  auto out = [&](int i) {
    auto v = Values(i < 0 ? 99 : i, step);
    if (cand && step >= 3 && i >= 2)
      for (double& x : v) x *= 1 + 2e-4;
    return v;
  };
  std::vector<FakeStat> stats;
  for (int i = 0; i < kTensors; ++i) {
    auto in = FakeStat::Vec(kTensors + i, out(i - 1));
    in.order = 2 * i;
    if (i > 0) in.flags = static_cast<uint8_t>(wire::StatFlags::kRepeat);
    stats.push_back(in);
    auto o = FakeStat::Vec(i, out(i));
    o.order = 2 * i + 1;
    stats.push_back(o);
  }
  return sb.Stats(step, stats);
}

TEST(Analyzer, FirstDivergenceNamesTheOpWhereTheErrorIsBornBelowTheTolerance) {
  Harness h;
  StreamBuilder b("base", "exp", wire::Role::Baseline), c("cand", "exp", wire::Role::Candidate);
  auto dir = Model();
  for (int i = 0; i < kTensors; ++i) {
    dir.push_back(FakeTensor{"layers." + std::to_string(i), wire::TensorKind::ActIn, wire::DType::F32,
                             static_cast<uint32_t>(kTensors + i)});
  }
  for (StreamBuilder* sb : {&b, &c}) {
    h.Feed(sb->Hello());
    h.Feed(sb->Directory(dir));
  }
  constexpr uint64_t kSteps = 8;
  for (uint64_t s = 0; s < kSteps; ++s) {
    FakeScalars sc;
    sc.loss = 2.0;
    h.Feed(ChainStepMsg(b, s, false));
    h.Feed(b.Scalars(s, sc));
    h.Feed(ChainStepMsg(c, s, true));
    h.Feed(c.Scalars(s, sc));
  }
  h.Feed(b.Goodbye(kSteps - 1));
  h.Feed(c.Goodbye(kSteps - 1));
  h.an->Finish();

  const auto* fd = h.First("first_divergence");
  ASSERT_NE(fd, nullptr) << h.Dump();
  EXPECT_EQ(h.Count("first_divergence"), 1u);
  EXPECT_EQ(fd->step, 3u);
  EXPECT_EQ(fd->tensor, "layers.2");  // not layers.3/4, which only carry it on
  EXPECT_EQ(fd->kind, "act");
  EXPECT_EQ(fd->severity, alerting::Severity::kWarning);  // 2e-4: under the tolerance
  EXPECT_EQ(fd->cause, "op");
  EXPECT_EQ(fd->metric, "added_error");
  EXPECT_NEAR(fd->error, 2e-4, 2e-5);
  EXPECT_NE(fd->message.find("the error is born in layers.2"), std::string::npos) << fd->message;
  EXPECT_NE(fd->message.find("its inputs agree (rel. distance 0)"), std::string::npos) << fd->message;
  EXPECT_EQ(h.Count("tensor_drift"), 0u) << h.Dump();

  // The report ranks each step's ops: at step 3 layers.2 first, the only one born.
  auto r = h.an->Reports();
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(r[0].births.size(), kSteps);
  const BirthReport& at3 = r[0].births[3];
  EXPECT_EQ(at3.step, 3u);
  ASSERT_FALSE(at3.ops.empty());
  EXPECT_EQ(at3.ops[0].name, "layers.2");
  EXPECT_EQ(at3.ops[0].pass, "forward");
  EXPECT_TRUE(at3.ops[0].born);
  for (size_t i = 1; i < at3.ops.size(); ++i) EXPECT_FALSE(at3.ops[i].born) << at3.ops[i].name;
  for (const auto& o : r[0].births[2].ops) EXPECT_EQ(o.output_error, 0) << o.name;  // before: identical
}

// Issue 30: a graph of modules given row by row (name, kind, values, repeat), the same
// rows in both runs except where the candidate scales one (`cand_scale`, from step 2).
struct GraphRow {
  std::string name;
  wire::TensorKind kind;
  int values;                 // Values(values, step): rows with one index are one tensor
  bool repeat = false;        // repeats the row before it (in both runs)
  double cand_scale = 1;      // the candidate's values times this from step 2
  bool new_when_changed = false;  // the candidate's changed row is no repeat (a new tensor)
};

void RunGraph(Harness& h, const std::vector<GraphRow>& rows) {
  StreamBuilder b("base", "exp", wire::Role::Baseline), c("cand", "exp", wire::Role::Candidate);
  std::vector<FakeTensor> dir;
  for (size_t i = 0; i < rows.size(); ++i) {
    dir.push_back(FakeTensor{rows[i].name, rows[i].kind, wire::DType::F32, static_cast<uint32_t>(i)});
  }
  for (StreamBuilder* sb : {&b, &c}) {
    h.Feed(sb->Hello());
    h.Feed(sb->Directory(dir));
  }
  constexpr uint64_t kSteps = 4;
  for (uint64_t s = 0; s < kSteps; ++s) {
    for (const bool cand : {false, true}) {
      std::vector<FakeStat> stats;
      for (size_t i = 0; i < rows.size(); ++i) {
        const GraphRow& r = rows[i];
        auto v = Values(r.values, s);
        const bool changed = cand && s >= 2 && r.cand_scale != 1;
        if (changed) {
          for (double& x : v) x *= r.cand_scale;
        }
        auto st = FakeStat::Vec(static_cast<uint32_t>(i), v);
        st.order = static_cast<uint32_t>(i);
        if (r.repeat && !(changed && r.new_when_changed)) st.flags = static_cast<uint8_t>(wire::StatFlags::kRepeat);
        stats.push_back(st);
      }
      FakeScalars sc;
      sc.loss = 2.0;
      StreamBuilder& sb = cand ? c : b;
      h.Feed(sb.Stats(s, stats));
      h.Feed(sb.Scalars(s, sc));
    }
  }
  h.Feed(b.Goodbye(kSteps - 1));
  h.Feed(c.Goodbye(kSteps - 1));
  h.an->Finish();
}

// trunk -> heads.cls and heads.reg, both reading trunk's output; heads.reg's input is
// no repeat (heads.cls's output came in between). Backward: heads.reg's output
// gradient, heads.cls's, trunk's (their sum).
std::vector<GraphRow> TwoHeadRows(double cls_grad_scale, double trunk_grad_scale) {
  using K = wire::TensorKind;
  return {{"input[0]", K::Input, 0},
          {"trunk", K::ActIn, 0, true},
          {"trunk", K::Act, 1},
          {"heads.cls", K::ActIn, 1, true},
          {"heads.cls", K::Act, 2},
          {"heads.reg", K::ActIn, 1},
          {"heads.reg", K::Act, 3},
          {"heads.reg", K::ActGrad, 4},
          {"heads.cls", K::ActGrad, 5, false, cls_grad_scale},
          {"trunk", K::ActGrad, 6, false, trunk_grad_scale}};
}

TEST(Analyzer, AGradientFromTheLossThatDiffersWhileTheForwardAgreesIsData) {
  // A changed label: the gradient the loss hands heads.cls differs, and so does trunk's.
  Harness h;
  RunGraph(h, TwoHeadRows(1.05, 1.03));
  const auto* fd = h.First("first_divergence");
  ASSERT_NE(fd, nullptr) << h.Dump();
  EXPECT_EQ(fd->step, 2u);
  EXPECT_EQ(fd->tensor, "heads.cls");
  EXPECT_EQ(fd->kind, "act_grad");
  EXPECT_EQ(fd->cause, "data") << fd->message;
  EXPECT_NE(fd->message.find("the labels or targets"), std::string::npos) << fd->message;
  EXPECT_EQ(fd->message.find("backward of heads.reg"), std::string::npos) << fd->message;
}

TEST(Analyzer, AGradientSummedOverSiblingsNamesThemAll) {
  // Both heads received agreeing gradients, trunk's differs: the backward of one of
  // them computes differently, and the sum does not say which.
  Harness h;
  RunGraph(h, TwoHeadRows(1, 1.03));
  const auto* fd = h.First("first_divergence");
  ASSERT_NE(fd, nullptr) << h.Dump();
  EXPECT_EQ(fd->tensor, "trunk");
  EXPECT_EQ(fd->kind, "act_grad");
  EXPECT_EQ(fd->cause, "op");
  EXPECT_NE(fd->message.find("the sum of what heads.cls and heads.reg pass on"), std::string::npos) << fd->message;
}

TEST(Analyzer, AnInputMadeByTheParentsOwnCodeNamesTheParent) {
  // The root computes x * 1.01 between trunk and frozen in the candidate: frozen's input
  // repeats trunk's output in the baseline only (from step 2).
  using K = wire::TensorKind;
  Harness h;
  RunGraph(h, {{"input[0]", K::Input, 0},
                        {"trunk", K::ActIn, 0, true},
                        {"trunk", K::Act, 1},
                        {"frozen", K::ActIn, 1, true, 1.01, true},
                        {"frozen", K::Act, 2, false, 1.01},
                        {"<root>", K::Act, 2, true, 1.01}});
  const auto* fd = h.First("first_divergence");
  ASSERT_NE(fd, nullptr) << h.Dump();
  EXPECT_EQ(fd->step, 2u);
  EXPECT_EQ(fd->tensor, "frozen");
  EXPECT_EQ(fd->kind, "act_in");
  EXPECT_EQ(fd->cause, "op");
  EXPECT_NE(fd->message.find("frozen receives a different input from its parent's own code: the computation of <root>"),
            std::string::npos)
      << fd->message;
  EXPECT_EQ(fd->message.find("frozen computes differently"), std::string::npos) << fd->message;
}

TEST(Analyzer, WrapperPrefixesAreStrippedBeforeMatching) {
  Harness h;
  RunPair(h, 10, nullptr, "module._orig_mod.");
  EXPECT_TRUE(h.alerts.empty()) << h.Dump();
  auto r = h.an->Reports();
  EXPECT_TRUE(r[0].unmatched.empty());
  EXPECT_EQ(h.an->counters().pairs_compared, 10u * kTensors);
}

TEST(Analyzer, NameMapRulesMatchRenamedLayers) {
  AnalyzerOptions opt;
  opt.canon = NameCanonicalizer::FromText("^blocks\\.(\\d+)$ => layers.$1\n", "test").value();
  Harness h(std::move(opt));
  StreamBuilder b("base", "exp", wire::Role::Baseline), c("cand", "exp", wire::Role::Candidate);
  h.Feed(b.Hello());
  h.Feed(c.Hello());
  h.Feed(b.Directory(Model()));
  auto renamed = Model();
  for (auto& t : renamed) t.name = "blocks." + t.name.substr(7);
  h.Feed(c.Directory(renamed));
  for (uint64_t s = 0; s < 3; ++s) {
    h.Feed(StepMsg(b, s, nullptr));
    h.Feed(StepMsg(c, s, nullptr));
  }
  h.an->Finish();
  EXPECT_EQ(h.an->counters().pairs_compared, 3u * kTensors);
  EXPECT_TRUE(h.an->Reports()[0].unmatched.empty());
}

TEST(Analyzer, TensorOnOneSideIsListedNotDropped) {
  Harness h;
  StreamBuilder b("base", "exp", wire::Role::Baseline), c("cand", "exp", wire::Role::Candidate);
  h.Feed(b.Hello());
  h.Feed(c.Hello());
  auto extra = Model();
  extra.push_back(FakeTensor{"extra.adapter", wire::TensorKind::ParamGrad, wire::DType::F32, 5});
  h.Feed(b.Directory(Model()));
  h.Feed(c.Directory(extra));
  for (uint64_t s = 0; s < 4; ++s) {
    h.Feed(StepMsg(b, s, nullptr));
    std::vector<FakeStat> stats;
    for (int i = 0; i <= kTensors; ++i) {
      auto st = FakeStat::Vec(i, Values(i, s));
      st.order = i;
      stats.push_back(st);
    }
    h.Feed(c.Stats(s, stats));
  }
  h.an->Finish();
  auto r = h.an->Reports();
  ASSERT_EQ(r[0].unmatched.size(), 1u);
  EXPECT_EQ(r[0].unmatched[0].name, "extra.adapter");
  EXPECT_EQ(r[0].unmatched[0].kind, "param_grad");
  EXPECT_EQ(r[0].unmatched[0].side, "candidate");
  EXPECT_EQ(r[0].unmatched[0].first_step, 0u);
  EXPECT_EQ(r[0].unmatched[0].steps, 4u);
  EXPECT_EQ(h.an->counters().unmatched_tensors, 1u);
  EXPECT_EQ(r[0].steps_compared, 4u);
  EXPECT_TRUE(h.alerts.empty()) << h.Dump();
}

TEST(Analyzer, NonfiniteNamesTheProducerNotItsConsumers) {
  Harness h;
  RunPair(h, 12, [](uint64_t s, int t, std::vector<double>* v) {
    if (s == 5 && t == 1) (*v)[3] = NAN;
    if (s == 5 && t > 1) (*v)[0] = INFINITY;  // downstream of it
  });
  const auto* nf = h.First("nonfinite");
  ASSERT_NE(nf, nullptr) << h.Dump();
  EXPECT_EQ(h.Count("nonfinite"), 1u);
  EXPECT_EQ(nf->step, 5u);
  EXPECT_EQ(nf->tensor, "layers.1");
  EXPECT_EQ(nf->runs, std::vector<std::string>{"cand"});
  EXPECT_EQ(nf->severity, alerting::Severity::kCritical);
  // The pair rules see it too: a NaN on one side only is a critical divergence.
  const auto* fd = h.First("first_divergence");
  ASSERT_NE(fd, nullptr);
  EXPECT_EQ(fd->tensor, "layers.1");
  EXPECT_EQ(fd->metric, "nonfinite_mismatch");
}

TEST(Analyzer, OverflowPastFp16RangeWarnsBeforeAnyNan) {
  Harness h;
  RunPair(h, 10, [](uint64_t s, int t, std::vector<double>* v) {
    if (s >= 4 && t == 3) (*v)[0] = 70000.0 * (1 + s);
  });
  const auto* of = h.First("overflow");
  ASSERT_NE(of, nullptr) << h.Dump();
  EXPECT_EQ(of->step, 4u);
  EXPECT_EQ(of->tensor, "layers.3");
  EXPECT_EQ(of->severity, alerting::Severity::kWarning);  // fp32 tensor, fp16 limit
  EXPECT_EQ(h.Count("nonfinite"), 0u);
  EXPECT_EQ(h.Count("overflow"), 1u);  // once per tensor
}

TEST(Analyzer, AnAdditiveMaskAtFp32sOwnMinimumIsNoOverflow) {
  // transformers' eager attention mask: torch.finfo(float32).min where masked. In an fp16
  // run it is fp16's own minimum, so "would overflow fp16" would be a false alarm on
  // every step of every such model; a value past fp16's range that is not the dtype's
  // extreme still warns.
  Harness h;
  RunPair(h, 6, [](uint64_t s, int t, std::vector<double>* v) {
    if (t == 2) (*v)[0] = (*v)[1] = -3.4028234663852886e38;
    if (s >= 3 && t == 3) (*v)[0] = 70000.0;
  });
  ASSERT_EQ(h.Count("overflow"), 1u) << h.Dump();
  EXPECT_EQ(h.First("overflow")->tensor, "layers.3");
  EXPECT_EQ(h.First("overflow")->step, 3u);
}

TEST(Analyzer, AnFp16MaskMadeOutsideModulesIsNoOverflowButASaturatedOutputIs) {
  // An fp16 run's additive mask is fp16's own minimum (-65504). Read as a mask only where
  // no module produced it (act_in) and only the negative extreme: a module's output at
  // -65504 (a saturating cast) and an act_in at +65504 stay critical.
  Harness h;
  StreamBuilder a("solo1", "exp", wire::Role::Solo);
  h.Feed(a.Hello());
  auto model = Model("", wire::DType::F16);
  model[1].kind = wire::TensorKind::ActIn;  // the mask: -65504 where masked, else 0
  model[3].kind = wire::TensorKind::ActIn;  // +65504: not a mask's sign
  h.Feed(a.Directory(model));
  std::vector<FakeStat> stats;
  for (int i = 0; i < kTensors; ++i) {
    auto v = Values(i, 0);
    if (i == 1 || i == 2) v = {-65504.0, -65504.0, 0.0, 0.0};
    if (i == 3) v = {65504.0, 0.0};
    auto s = FakeStat::Vec(i, v);
    s.order = i;
    stats.push_back(s);
  }
  h.Feed(a.Stats(0, stats));
  h.an->Finish();
  std::vector<std::string> named;
  for (const auto& al : h.alerts) {
    if (al.rule != "overflow") continue;
    named.push_back(al.tensor);
    EXPECT_EQ(al.severity, alerting::Severity::kCritical) << h.Dump();
  }
  EXPECT_EQ(named, (std::vector<std::string>{"layers.2", "layers.3"})) << h.Dump();
}

TEST(Analyzer, SaturatedLowPrecisionTensorIsCritical) {
  Harness h;
  StreamBuilder a("solo1", "exp", wire::Role::Solo);
  h.Feed(a.Hello());
  h.Feed(a.Directory(Model("", wire::DType::F16)));
  std::vector<FakeStat> stats;
  for (int i = 0; i < kTensors; ++i) {
    auto s = FakeStat::Vec(i, Values(i, 0));
    s.order = i;
    if (i == 2) {
      s.sat = 3;
      s.absmax = 65504;
    }
    stats.push_back(s);
  }
  h.Feed(a.Stats(0, stats));
  h.an->Finish();
  const auto* of = h.First("overflow");
  ASSERT_NE(of, nullptr);
  EXPECT_EQ(of->severity, alerting::Severity::kCritical);
  EXPECT_EQ(of->tensor, "layers.2");
}

TEST(Analyzer, UnderflowJudgesLowPrecisionTensorsAndIgnoresDenormalsInFp32) {
  Harness h;
  StreamBuilder a("solo1", "exp", wire::Role::Solo);
  h.Feed(a.Hello());
  auto model = Model();
  model[1].dtype = wire::DType::BF16;
  h.Feed(a.Directory(model));
  for (uint64_t step = 0; step < 3; ++step) {
    std::vector<FakeStat> stats;
    for (int i = 0; i < kTensors; ++i) {
      std::vector<double> v(100, 1e-6);  // all below fp16's min normal
      if (i == 4) v.assign(100, 0.0);    // all zeros: no underflow
      auto s = FakeStat::Vec(i, v);
      s.order = i;
      s.limit = i == 1 ? wire::DType::BF16 : wire::DType::F16;
      stats.push_back(s);
    }
    h.Feed(a.Stats(step, stats));
  }
  h.an->Finish();
  // Only the bf16 tensor: fp32 tensors' fp16-denormal counts are not an underflow.
  EXPECT_EQ(h.Count("underflow"), 1u) << h.Dump();
  EXPECT_EQ(h.First("underflow")->tensor, "layers.1");
}

TEST(Analyzer, ZeroedGradientIsAnUnderflow) {
  Harness h;
  StreamBuilder a("solo1", "exp", wire::Role::Solo);
  h.Feed(a.Hello());
  h.Feed(a.Directory({FakeTensor{"w", wire::TensorKind::ParamGrad, wire::DType::F32, 0}}));
  for (uint64_t s = 0; s < 4; ++s) {
    auto st = FakeStat::Vec(0, std::vector<double>(10, s < 2 ? 0.5 : 0.0));
    h.Feed(a.Stats(s, {st}));
  }
  h.an->Finish();
  ASSERT_EQ(h.Count("underflow"), 1u) << h.Dump();
  EXPECT_EQ(h.First("underflow")->step, 2u);
}

TEST(Analyzer, SpikeInBothDirections) {
  Harness h;
  StreamBuilder a("solo1", "exp", wire::Role::Solo);
  h.Feed(a.Hello());
  for (uint64_t s = 0; s < 60; ++s) {
    FakeScalars sc;
    sc.loss = 2.0 + 0.01 * std::sin(s);
    if (s == 30) sc.loss = 9.0;
    if (s == 50) sc.loss = 0.2;
    sc.grad_norm = 1.0 + 0.01 * std::cos(s);
    h.Feed(a.Scalars(s, sc));
  }
  h.an->Finish();
  ASSERT_EQ(h.Count("spike"), 2u) << h.Dump();
  EXPECT_EQ(h.alerts[0].step, 30u);
  EXPECT_EQ(h.alerts[0].tensor, "loss");
  EXPECT_GT(h.alerts[0].candidate_value, h.alerts[0].baseline_value);
  EXPECT_EQ(h.alerts[1].step, 50u);
  EXPECT_LT(h.alerts[1].candidate_value, h.alerts[1].baseline_value);
}

TEST(Analyzer, StallUsesTheInjectedClockAndGoodbyeEndsQuietly) {
  Harness h;
  StreamBuilder a("solo1", "exp", wire::Role::Solo), g("solo2", "exp", wire::Role::Solo);
  h.Feed(a.Hello());
  h.Feed(g.Hello());
  h.Feed(a.Scalars(0, FakeScalars{}));
  h.Feed(g.Goodbye(0));
  h.clock.Advance(std::chrono::nanoseconds(119'000'000'000));
  h.an->Tick(h.Now());
  EXPECT_EQ(h.Count("stall"), 0u);
  h.clock.Advance(std::chrono::nanoseconds(2'000'000'000));
  h.an->Tick(h.Now());
  h.an->Tick(h.Now() + 1);
  ASSERT_EQ(h.Count("stall"), 1u) << h.Dump();
  EXPECT_EQ(h.First("stall")->runs, std::vector<std::string>{"solo1"});
  // Heartbeats without steps: a second kind of stall, once.
  for (int i = 0; i < 130; ++i) {
    h.clock.Advance(std::chrono::nanoseconds(1'000'000'000));
    h.Feed(a.Heartbeat());
    h.an->Tick(h.Now());
  }
  EXPECT_EQ(h.Count("stall"), 2u) << h.Dump();
}

TEST(Analyzer, ResumeAfterARestartDoesNotCountTheCollectorsDowntimeAsAStall) {
  for (bool resume : {true, false}) {
    Harness h;
    StreamBuilder a("solo1", "exp", wire::Role::Solo);
    h.Feed(a.Hello());
    h.Feed(a.Scalars(0, FakeScalars{}));
    h.clock.Advance(std::chrono::nanoseconds(300'000'000'000));  // the collector was down for 5 minutes, then replayed its logs
    if (resume) h.an->Resume(h.Now());
    h.an->Tick(h.Now() + 1);
    EXPECT_EQ(h.Count("stall"), resume ? 0u : 1u) << h.Dump();
    if (!resume) continue;
    h.clock.Advance(std::chrono::nanoseconds(121'000'000'000));  // but a run silent after the restart still stalls
    h.an->Tick(h.Now());
    EXPECT_EQ(h.Count("stall"), 1u) << h.Dump();
  }
}

TEST(Analyzer, LossDriftWarnsThenEscalates) {
  Harness h;
  RunPair(h, 10, nullptr, "", [](uint64_t s) { return (2.0 - 0.001 * s) * (s < 3 ? 1.0 : s < 6 ? 1.002 : 1.05); });
  ASSERT_EQ(h.Count("loss_drift"), 2u) << h.Dump();
  EXPECT_EQ(h.alerts[0].step, 3u);
  EXPECT_EQ(h.alerts[0].severity, alerting::Severity::kWarning);
  EXPECT_EQ(h.alerts[1].step, 6u);
  EXPECT_EQ(h.alerts[1].severity, alerting::Severity::kCritical);
}

TEST(Analyzer, ZeroNoiseFloorJudgesAgainstTheTolerance) {
  // Deterministic twins: the floor stays 0, so a difference just past the fp32
  // tolerance after the learning steps is a drift.
  Harness h;
  RunPair(h, 12, [](uint64_t s, int t, std::vector<double>* v) {
    if (s == 9 && t == 4) for (double& x : *v) x *= 1.003;
  });
  const auto* fd = h.First("first_divergence");
  ASSERT_NE(fd, nullptr) << h.Dump();
  EXPECT_EQ(fd->step, 9u);
  EXPECT_EQ(fd->severity, alerting::Severity::kWarning);
}

TEST(Analyzer, NonZeroNoiseFloorRaisesTheThreshold) {
  // Steps 0..4 carry a normal 0.8e-3 relative difference (below the 1e-3 tolerance):
  // the floor learns it; a later 2e-3 difference is within 3 x floor, 3e-3 is not.
  auto perturb = [](uint64_t s, int t, std::vector<double>* v) {
    if (t != 0) return;
    const double f = s < 5 ? 1.0008 : s < 10 ? 1.002 : 1.003;
    for (double& x : *v) x *= f;
  };
  Harness h;
  RunPair(h, 15, perturb);
  const auto* fd = h.First("first_divergence");
  ASSERT_NE(fd, nullptr) << h.Dump();
  EXPECT_EQ(fd->step, 10u);

  AnalyzerOptions no_floor;
  no_floor.rules.floor_steps = 0;
  Harness h2(no_floor);
  RunPair(h2, 15, perturb);
  ASSERT_NE(h2.First("first_divergence"), nullptr);
  EXPECT_EQ(h2.First("first_divergence")->step, 5u);
}

TEST(Analyzer, TrendIsReportedBeforeTheToleranceIsCrossed) {
  Harness h;
  // Relative error doubling every two steps from step 6: 1e-5 .. crosses 1e-3 at ~19.
  RunPair(h, 30, [](uint64_t s, int t, std::vector<double>* v) {
    if (t != 3 || s < 6) return;
    const double e = 1e-5 * std::pow(2.0, (s - 6) / 2.0);
    for (double& x : *v) x *= 1 + e;
  });
  const auto* tr = h.First("trend");
  const auto* fd = h.First("first_divergence");
  ASSERT_NE(tr, nullptr) << h.Dump();
  ASSERT_NE(fd, nullptr) << h.Dump();
  EXPECT_EQ(tr->tensor, "layers.3");
  EXPECT_LT(tr->step, fd->step);
}

// Issue 30 item 6f: after a rank's first drifting tensor, a trend is that divergence
// spreading: counted in the pair, not an alert of its own (137 of resnet18's 182 were).
TEST(Analyzer, ATrendDownstreamOfTheFirstDivergenceIsCountedNotAlerted) {
  auto grow = [](uint64_t s, int t, std::vector<double>* v) {
    if (t == 3 && s >= 6) {
      const double e = 1e-5 * std::pow(2.0, (s - 6) / 2.0);
      for (double& x : *v) x *= 1 + e;
    }
  };
  Harness h;
  RunPair(h, 30, [&](uint64_t s, int t, std::vector<double>* v) {
    if (t == 1 && s >= 4) for (double& x : *v) x *= 1.05;  // the first divergence, upstream
    grow(s, t, v);
  });
  const auto* fd = h.First("first_divergence");
  ASSERT_NE(fd, nullptr) << h.Dump();
  EXPECT_EQ(fd->step, 4u);
  EXPECT_EQ(fd->tensor, "layers.1");
  EXPECT_EQ(h.Count("trend"), 0u) << h.Dump();
  EXPECT_EQ(h.an->Reports()[0].trends_downstream, 1u);
  EXPECT_GE(h.Count("tensor_drift"), 1u);  // layers.3 still alerts when it crosses
  // Without the upstream divergence the same growth is the trend it always was.
  Harness alone;
  RunPair(alone, 30, grow);
  EXPECT_EQ(alone.Count("trend"), 1u) << alone.Dump();
  EXPECT_EQ(alone.an->Reports()[0].trends_downstream, 0u);
}

TEST(Analyzer, CandidateAheadWaitsForSlowBaseline) {
  Harness h;
  StreamBuilder b("base", "exp", wire::Role::Baseline), c("cand", "exp", wire::Role::Candidate);
  h.Feed(c.Hello());  // the candidate arrives first and runs ahead
  h.Feed(c.Directory(Model()));
  for (uint64_t s = 0; s < 10; ++s) h.Feed(StepMsg(c, s, nullptr));
  h.Feed(c.Goodbye(9));
  EXPECT_EQ(h.an->counters().steps_compared, 0u);
  h.Feed(b.Hello());
  h.Feed(b.Directory(Model()));
  for (uint64_t s = 0; s < 10; ++s) h.Feed(StepMsg(b, s, nullptr));
  h.Feed(b.Goodbye(9));
  h.an->Finish();
  EXPECT_EQ(h.an->counters().steps_compared, 10u);
  EXPECT_EQ(h.an->counters().buffered_steps, 0u);
  EXPECT_TRUE(h.alerts.empty()) << h.Dump();
}

TEST(Analyzer, BaselineThatEndsEarlyLeavesCandidateStepsCounted) {
  Harness h;
  StreamBuilder b("base", "exp", wire::Role::Baseline), c("cand", "exp", wire::Role::Candidate);
  h.Feed(b.Hello());
  h.Feed(c.Hello());
  h.Feed(b.Directory(Model()));
  h.Feed(c.Directory(Model()));
  for (uint64_t s = 0; s < 10; ++s) {
    if (s < 4) h.Feed(StepMsg(b, s, nullptr));
    if (s == 4) h.Feed(b.Goodbye(3));
    h.Feed(StepMsg(c, s, nullptr));
  }
  // Without the candidate's end: every step the baseline cannot have is settled.
  EXPECT_EQ(h.an->counters().steps_compared, 4u);
  h.an->Finish();
  auto r = h.an->Reports();
  EXPECT_EQ(r[0].steps_compared, 4u);
  EXPECT_EQ(r[0].steps_only_candidate, 6u);
  EXPECT_EQ(h.an->counters().buffered_steps, 0u);
}

// Two ranks per run, stepping together: rank 0 of both runs ends first, and candidate
// rank 1's last step overtakes baseline rank 1's. Rank 0's Goodbye must not end the
// baseline's rank 1: its last step is still on its way, and is compared when it comes.
TEST(Analyzer, OneRankSayingGoodbyeDoesNotEndTheOtherRanks) {
  Harness h;
  StreamBuilder b0("base", "exp", wire::Role::Baseline, 0), b1("base", "exp", wire::Role::Baseline, 1);
  StreamBuilder c0("cand", "exp", wire::Role::Candidate, 0), c1("cand", "exp", wire::Role::Candidate, 1);
  for (StreamBuilder* sb : {&b0, &b1, &c0, &c1}) {
    h.Feed(sb->Hello());
    h.Feed(sb->Directory(Model()));
  }
  FakeScalars sc;
  auto step = [&](StreamBuilder& sb, uint64_t s) {
    h.Feed(StepMsg(sb, s, nullptr));
    h.Feed(sb.Scalars(s, sc));
  };
  for (uint64_t s = 0; s < 5; ++s) {
    for (StreamBuilder* sb : {&b0, &b1, &c0, &c1}) step(*sb, s);
  }
  step(b0, 5);
  h.Feed(b0.Goodbye(5));
  step(c0, 5);
  h.Feed(c0.Goodbye(5));
  step(c1, 5);
  EXPECT_EQ(h.an->counters().steps_compared, 11u);  // baseline rank 1's step 5 not in yet
  step(b1, 5);
  h.Feed(b1.Goodbye(5));
  h.Feed(c1.Goodbye(5));
  EXPECT_EQ(h.an->counters().steps_compared, 12u);
  EXPECT_EQ(h.an->counters().buffered_steps, 0u);
  h.an->Finish();
  auto r = h.an->Reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].steps_compared, 12u);
  EXPECT_EQ(r[0].steps_only_candidate, 0u);
  EXPECT_EQ(r[0].steps_only_baseline, 0u);
}

// A candidate rank the baseline never had is settled (counted, released) once every
// rank the baseline has said Goodbye, without waiting for Finish.
TEST(Analyzer, CandidateRankTheBaselineNeverHadIsSettledWhenTheBaselineEnds) {
  Harness h;
  StreamBuilder b0("base", "exp", wire::Role::Baseline, 0);
  StreamBuilder c0("cand", "exp", wire::Role::Candidate, 0), c1("cand", "exp", wire::Role::Candidate, 1);
  for (StreamBuilder* sb : {&b0, &c0, &c1}) {
    h.Feed(sb->Hello());
    h.Feed(sb->Directory(Model()));
  }
  FakeScalars sc;
  for (uint64_t s = 0; s < 3; ++s) {
    for (StreamBuilder* sb : {&b0, &c0, &c1}) {
      h.Feed(StepMsg(*sb, s, nullptr));
      h.Feed(sb->Scalars(s, sc));
    }
  }
  EXPECT_EQ(h.an->counters().steps_compared, 3u);
  EXPECT_EQ(h.an->counters().buffered_steps, 3u);  // candidate rank 1 waits
  h.Feed(b0.Goodbye(2));
  EXPECT_EQ(h.an->counters().buffered_steps, 0u);
  h.an->Finish();
  auto r = h.an->Reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].steps_compared, 3u);
  EXPECT_EQ(r[0].steps_only_candidate, 3u);
}

TEST(Analyzer, LateRecordsAreCountedAndTheRankLearnsToWait) {
  Harness h;
  StreamBuilder a("solo1", "exp", wire::Role::Solo);
  h.Feed(a.Hello());
  h.Feed(a.Directory(Model()));
  auto one = [](uint32_t id, uint64_t s) {
    auto st = FakeStat::Vec(id, Values(id, s));
    st.order = id;
    return std::vector<FakeStat>{st};
  };
  // Device-style: step s's second record arrives after step s+1's first.
  h.Feed(a.Stats(0, one(0, 0)));
  h.Feed(a.Stats(1, one(0, 1)));   // closes step 0
  h.Feed(a.Stats(0, one(1, 0)));   // late: counted, the rank now waits one more step
  h.Feed(a.Stats(2, one(0, 2)));   // with lag 1, step 1 stays open
  h.Feed(a.Stats(1, one(1, 1)));   // not late any more
  h.Feed(a.Stats(3, one(0, 3)));
  h.an->Finish();
  EXPECT_EQ(h.an->counters().late_records, 1u);
  EXPECT_EQ(h.an->counters().steps_closed, 4u);
}

TEST(Analyzer, MemoryIsBoundedWhenThePartnerNeverComes) {
  AnalyzerOptions opt;
  opt.max_buffered_steps = 16;
  Harness h(opt);
  StreamBuilder c("cand", "exp", wire::Role::Candidate);
  h.Feed(c.Hello());
  h.Feed(c.Directory(Model()));
  for (uint64_t s = 0; s < 1000; ++s) h.Feed(StepMsg(c, s, nullptr));
  auto cnt = h.an->counters();
  EXPECT_LE(cnt.buffered_steps, 16u);
  EXPECT_EQ(cnt.steps_evicted, 999u - 16u);  // step 999 is still open
  EXPECT_LT(cnt.peak_buffered_bytes, 17u * 8192u);
  // A baseline that shows up late still pairs with what is left.
  StreamBuilder b("base", "exp", wire::Role::Baseline);
  h.Feed(b.Hello());
  h.Feed(b.Directory(Model()));
  for (uint64_t s = 980; s < 1000; ++s) h.Feed(StepMsg(b, s, nullptr));
  h.an->Finish();
  auto r = h.an->Reports();
  EXPECT_EQ(r[0].steps_compared, 17u);  // 983..999
  EXPECT_EQ(r[0].steps_evicted, 983u);
}

TEST(Analyzer, SeveralCandidatesShareOneBaseline) {
  Harness h;
  StreamBuilder b("base", "exp", wire::Role::Baseline), c1("c1", "exp", wire::Role::Candidate),
      c2("c2", "exp", wire::Role::Candidate);
  for (auto* s : {&b, &c1, &c2}) {
    h.Feed(s->Hello());
    h.Feed(s->Directory(Model()));
  }
  for (uint64_t s = 0; s < 8; ++s) {
    h.Feed(StepMsg(b, s, nullptr));
    h.Feed(StepMsg(c1, s, nullptr));
    h.Feed(StepMsg(c2, s, [](uint64_t st, int t, std::vector<double>* v) {
      if (st >= 3 && t == 0) (*v)[0] += 1.0;
    }));
  }
  h.an->Finish();
  auto r = h.an->Reports();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].steps_compared, 8u);
  EXPECT_EQ(r[1].steps_compared, 8u);
  ASSERT_EQ(h.Count("first_divergence"), 1u);
  EXPECT_EQ(h.First("first_divergence")->runs, (std::vector<std::string>{"base", "c2"}));
  EXPECT_EQ(h.an->counters().buffered_steps, 0u);
}

TEST(Analyzer, ZerosAndDenormalsCompareEqual) {
  Harness h;
  RunPair(h, 6, [](uint64_t, int t, std::vector<double>* v) {
    if (t == 0) v->assign(v->size(), 0.0);
  });
  // Baseline tensor 0 is not zero, so that drifts; make a pair where both are zero
  // and one holds denormals instead.
  Harness h2;
  StreamBuilder b("base", "exp", wire::Role::Baseline), c("cand", "exp", wire::Role::Candidate);
  h2.Feed(b.Hello());
  h2.Feed(c.Hello());
  h2.Feed(b.Directory(Model()));
  h2.Feed(c.Directory(Model()));
  for (uint64_t s = 0; s < 6; ++s) {
    std::vector<FakeStat> sb, sc;
    for (int i = 0; i < kTensors; ++i) {
      auto z = FakeStat::Vec(i, std::vector<double>(32, 0.0));
      auto d = FakeStat::Vec(i, std::vector<double>(32, i == 2 ? 1e-40 : 0.0));
      z.order = d.order = i;
      sb.push_back(z);
      sc.push_back(d);
    }
    h2.Feed(b.Stats(s, sb));
    h2.Feed(c.Stats(s, sc));
  }
  h2.an->Finish();
  EXPECT_EQ(h2.Count("tensor_drift"), 0u) << h2.Dump();
  EXPECT_EQ(h2.Count("first_divergence"), 0u);
  EXPECT_EQ(h2.an->counters().pairs_compared, 6u * kTensors);
  EXPECT_EQ(h.First("first_divergence")->tensor, "layers.0");
}

// The replica check (rule replicas, rules/replica_rule.h) through the whole analyzer:
// two 2-rank runs whose grad_reduced rows differ between the runs (never compared across
// runs: no drift, nothing unmatched, no row in the table) and, in the candidate, between
// its ranks at one step only (one critical alert, the candidate's rank 1), whatever order
// the ranks' steps arrive in.
TEST(Analyzer, ReplicasAreJudgedWithinARunNeverAcrossRuns) {
  Harness h;
  constexpr uint64_t kSteps = 8, kBadStep = 3;
  std::vector<FakeTensor> model = Model();
  model.push_back(FakeTensor{"w", wire::TensorKind::GradReduced, wire::DType::F32, kTensors});
  model.push_back(FakeTensor{"v", wire::TensorKind::GradReduced, wire::DType::F32, kTensors + 1});
  std::vector<StreamBuilder> b, c;
  for (uint32_t r = 0; r < 2; ++r) {
    b.emplace_back("base", "exp", wire::Role::Baseline, r);
    c.emplace_back("cand", "exp", wire::Role::Candidate, r);
  }
  for (uint32_t r = 0; r < 2; ++r) {
    h.Feed(b[r].Hello(2));
    h.Feed(c[r].Hello(2));
    h.Feed(b[r].Directory(model));
    h.Feed(c[r].Directory(model));
  }
  auto step = [&](StreamBuilder& sb, uint64_t s, uint32_t rank, double reduced_scale) {
    std::vector<FakeStat> stats;
    for (int i = 0; i < kTensors + 2; ++i) {
      auto v = Values(i, s);
      if (i >= kTensors) {
        for (double& x : v) x *= reduced_scale;
        if (reduced_scale != 1 && rank == 1 && s == kBadStep && i == kTensors + 1) v[7] += 1e-9;
      }
      auto st = FakeStat::Vec(static_cast<uint32_t>(i), v);
      st.order = static_cast<uint32_t>(i);
      stats.push_back(st);
    }
    h.Feed(sb.Stats(s, stats));
  };
  for (uint64_t s = 0; s < kSteps; ++s) {
    for (uint32_t r : {1u, 0u}) step(b[r], s, r, 1.0);
    for (uint32_t r : {0u, 1u}) step(c[r], s, r, 2.0);  // other reduced gradients than the baseline's
  }
  for (uint32_t r = 0; r < 2; ++r) {
    h.Feed(b[r].Goodbye(kSteps - 1));
    h.Feed(c[r].Goodbye(kSteps - 1));
  }
  h.an->Finish();
  ASSERT_EQ(h.alerts.size(), 1u) << h.Dump();
  const alerting::Alert& a = h.alerts[0];
  EXPECT_EQ(a.rule, "replicas");
  EXPECT_EQ(a.runs, std::vector<std::string>{"cand"});
  EXPECT_EQ(a.step, kBadStep);
  EXPECT_EQ(a.rank, 1u);
  EXPECT_EQ(a.tensor, "v");
  EXPECT_EQ(a.kind, "grad_reduced");
  auto r = h.an->Reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].tensors.size(), static_cast<size_t>(kTensors));
  for (const auto& t : r[0].tensors) EXPECT_NE(t.kind, "grad_reduced") << t.name;
  EXPECT_EQ(h.an->counters().unmatched_tensors, 0u);
}

}  // namespace
}  // namespace lockstep::collector
