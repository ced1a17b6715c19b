// Alert identity across ranks and kinds: the dedup key and the id the AlertEmitter
// stamps name the run, tensor, kind and rank, so one tensor alerting on two ranks is
// two alerts all the way to a real sink (the dispatcher's dedup cooldown on), with
// distinct ids (issue 20). The same holds for micro steps of gradient accumulation:
// each micro batch's tensor is its own finding (issue 30), while the incident (one per
// cause) does not split.
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "rules/detector.h"
#include "rules/incident_key.h"
#include "lockstep/alerting/dispatcher.h"
#include "lockstep/common/clock.h"

namespace lockstep::collector {
namespace {

const FakeClock kClock(/*unix_ns=*/5);

using namespace std::chrono_literals;

alerting::Alert Drift(uint32_t rank, const std::string& kind = "act_grad", uint32_t micro = 0) {
  alerting::Alert a;
  a.rule = "tensor_drift";
  a.severity = alerting::Severity::kCritical;
  a.experiment = "exp";
  a.runs = {"gpu", "npu"};
  a.step = 7;
  a.rank = rank;
  a.micro_step = micro;
  a.tensor = "features.0";
  a.kind = kind;
  a.message = "features.0 drifts";
  return a;
}

TEST(AlertIdentity, IdAndDedupKeyNameRankKindAndRun) {
  std::vector<alerting::Alert> out;
  AlertEmitter em([&](alerting::Alert a) { out.push_back(std::move(a)); }, &kClock);
  em.Emit(Drift(0));
  em.Emit(Drift(1));
  em.Emit(Drift(1, "act"));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].id, "tensor_drift/exp/npu/features.0/act_grad/rank0@7");
  EXPECT_EQ(out[1].id, "tensor_drift/exp/npu/features.0/act_grad/rank1@7");
  EXPECT_EQ(out[2].id, "tensor_drift/exp/npu/features.0/act/rank1@7");
  EXPECT_NE(out[0].DedupKey(), out[1].DedupKey());
  EXPECT_NE(out[1].DedupKey(), out[2].DedupKey());
  auto other_candidate = Drift(0);
  other_candidate.runs = {"gpu", "npu2"};
  EXPECT_NE(other_candidate.DedupKey(), out[0].DedupKey());
}

TEST(AlertIdentity, TwoRanksOnOneTensorAreBothDeliveredWithDistinctIds) {
  std::random_device rd;
  const auto dir = std::filesystem::temp_directory_path() / ("lockstep-ident-" + std::to_string(rd()));
  alerting::SinkOptions file;
  file.kind = "jsonl";
  file.target = (dir / "alerts.jsonl").string();
  alerting::AlertingOptions o;
  o.sinks = {file};
  o.dedup_cooldown = 300s;  // the default: repeats of one key would be suppressed
  auto d = alerting::Dispatcher::Create(o);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  AlertEmitter em([&](alerting::Alert a) { (*d)->Submit(std::move(a)); }, &kClock);
  em.Emit(Drift(0));
  em.Emit(Drift(1));
  em.Emit(Drift(1));  // a true repeat (same rank, same step) is still deduplicated
  ASSERT_TRUE((*d)->Flush(5s));
  std::ifstream in(file.target);
  std::set<std::string> ids;
  std::set<uint32_t> ranks;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    ids.insert(j["id"].get<std::string>());
    ranks.insert(j["rank"].get<uint32_t>());
  }
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(ranks, (std::set<uint32_t>{0, 1}));
  EXPECT_EQ((*d)->Counters()[0].delivered, 2u);
  (*d)->Shutdown(1s);
  std::filesystem::remove_all(dir);
}

TEST(AlertIdentity, MicroStepsAreInTheIdAndKeyButNotTheIncident) {
  std::vector<alerting::Alert> out;
  AlertEmitter em([&](alerting::Alert a) { out.push_back(std::move(a)); }, &kClock);
  for (uint32_t m = 0; m < 4; ++m) em.Emit(Drift(0, "param_grad", m));
  ASSERT_EQ(out.size(), 4u);
  // Micro step 0 (and every job without accumulation) keeps the key it always had.
  EXPECT_EQ(out[0].id, "tensor_drift/exp/npu/features.0/param_grad/rank0@7");
  EXPECT_EQ(out[1].id, "tensor_drift/exp/npu/features.0/param_grad/rank0/micro1@7");
  EXPECT_EQ(out[3].DedupKey(), "tensor_drift/exp/npu/features.0/param_grad/rank0/micro3");
  std::set<std::string> ids, keys, incidents;
  for (const auto& a : out) {
    ids.insert(a.id);
    keys.insert(a.DedupKey());
    incidents.insert(a.incident);
  }
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_EQ(keys.size(), 4u);
  // One cause, one incident: micro steps do not split it.
  EXPECT_EQ(incidents, (std::set<std::string>{"divergence/exp/gpu/npu"}));
  EXPECT_EQ(IncidentKey(Drift(0, "param_grad", 2)), IncidentKey(Drift(0, "param_grad", 0)));
  // Rank and micro step do not collide: rank 1 micro 0 is not rank 0 micro 1.
  EXPECT_NE(Drift(1, "param_grad", 0).DedupKey(), Drift(0, "param_grad", 1).DedupKey());
}

TEST(AlertIdentity, MicroStepsOfOneTensorAreAllDeliveredUnderTheCooldown) {
  std::random_device rd;
  const auto dir = std::filesystem::temp_directory_path() / ("lockstep-micro-" + std::to_string(rd()));
  alerting::SinkOptions file;
  file.kind = "jsonl";
  file.target = (dir / "alerts.jsonl").string();
  alerting::AlertingOptions o;
  o.sinks = {file};
  o.dedup_cooldown = 300s;  // the default: before issue 30, micro steps 1..3 were swallowed here
  auto d = alerting::Dispatcher::Create(o);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  AlertEmitter em([&](alerting::Alert a) { (*d)->Submit(std::move(a)); }, &kClock);
  for (uint32_t m = 0; m < 4; ++m) em.Emit(Drift(0, "param_grad", m));
  em.Emit(Drift(0, "param_grad", 2));  // a true repeat (same micro step) is still deduplicated
  ASSERT_TRUE((*d)->Flush(5s));
  std::ifstream in(file.target);
  std::set<std::string> ids;
  std::set<uint32_t> micros;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    ids.insert(j["id"].get<std::string>());
    micros.insert(j["micro_step"].get<uint32_t>());
    EXPECT_EQ(j["dedup_key"].get<std::string>() + "@7", j["id"].get<std::string>());
  }
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_EQ(micros, (std::set<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ((*d)->Counters()[0].delivered, 4u);
  EXPECT_EQ((*d)->Counters()[0].deduped, 1u);
  (*d)->Shutdown(1s);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lockstep::collector
