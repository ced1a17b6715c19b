// Alert identity across ranks and kinds: the dedup key and the id the AlertEmitter
// stamps name the run, tensor, kind and rank, so one tensor alerting on two ranks is
// two alerts all the way to a real sink (the dispatcher's dedup cooldown on), with
// distinct ids (issue 20).
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "detect/detector.h"
#include "lockstep/alerting/dispatcher.h"
#include "lockstep/common/clock.h"

namespace lockstep::collector {
namespace {

const FakeClock kClock(/*unix_ns=*/5);

using namespace std::chrono_literals;

alerting::Alert Drift(uint32_t rank, const std::string& kind = "act_grad") {
  alerting::Alert a;
  a.rule = "tensor_drift";
  a.severity = alerting::Severity::kCritical;
  a.experiment = "exp";
  a.runs = {"gpu", "npu"};
  a.step = 7;
  a.rank = rank;
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
  file.kind = alerting::SinkKind::kJsonl;
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

}  // namespace
}  // namespace lockstep::collector
