// IncidentGrouper: one cause, few messages (docs/alerting.md "Incidents"). Time is
// passed in, so digests and resolutions need no sleeps.
#include "incidents.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace lockstep::alerting {
namespace {

using namespace std::chrono_literals;
using testing::SampleAlert;

Alert Drift(const std::string& tensor, Severity sev, uint64_t step) {
  Alert a = SampleAlert("d-" + tensor, tensor);
  a.rule = "tensor_drift";
  a.severity = sev;
  a.step = step;
  a.incident = "divergence/exp/b/c";
  a.message = tensor + " drifts";
  return a;
}

IncidentGrouper Grouper() { return IncidentGrouper(5min, 10min); }

TEST(IncidentGrouper, AFloodOfDriftIsOneOpenedMessageAndOneDigest) {
  IncidentGrouper g = Grouper();
  std::vector<Alert> out;
  Alert fd = Drift("blocks.2", Severity::kWarning, 0);
  fd.rule = "first_divergence";
  g.Add(fd, 0s, &out);
  for (int i = 0; i < 200; ++i) g.Add(Drift("t" + std::to_string(i), Severity::kWarning, i), 1s * i / 10, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].notification, "opened");
  EXPECT_EQ(out[0].rule, "first_divergence");
  EXPECT_EQ(out[0].incident, "divergence/exp/b/c");
  ASSERT_EQ(out[0].facts.size(), 1u);
  EXPECT_EQ(out[0].facts[0].tensor, "blocks.2");
  // No digest before the interval, one after it, none again without news.
  g.Tick(4min, true, &out);
  EXPECT_EQ(out.size(), 1u);
  g.Tick(5min, true, &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].notification, "update");
  EXPECT_EQ(out[1].incident_alerts, 201u);
  EXPECT_NE(out[1].message.find("200 more alert(s)"), std::string::npos) << out[1].message;
  EXPECT_NE(out[1].message.find("tensor_drift 200"), std::string::npos) << out[1].message;
  g.Tick(9min, true, &out);  // no news since the digest: nothing
  EXPECT_EQ(out.size(), 2u);
}

TEST(IncidentGrouper, EscalatesOnHigherSeverityAndOnANewCriticalFactOnly) {
  IncidentGrouper g = Grouper();
  std::vector<Alert> out;
  Alert over = Drift("blocks.2", Severity::kWarning, 5);
  over.rule = "overflow";
  over.incident = "numerics/exp/c";
  g.Add(over, 0s, &out);
  Alert nan = over;
  nan.rule = "nonfinite";
  nan.severity = Severity::kCritical;
  nan.tensor = "blocks.2.mlp.fc2";
  nan.message = "first NaN/Inf in blocks.2.mlp.fc2";
  g.Add(nan, 1s, &out);  // severity rises
  Alert nan_other = nan;
  nan_other.tensor = "blocks.3";
  g.Add(nan_other, 2s, &out);  // the same fact again (nonfinite already critical): news only
  Alert loss = nan;
  loss.tensor = "loss";
  loss.kind = "loss";
  loss.message = "the loss is NaN";
  g.Add(loss, 3s, &out);  // a new critical fact at the same severity
  Alert loss_drift = loss;
  loss_drift.rule = "loss_drift";
  g.Add(loss_drift, 4s, &out);  // the same fact (the loss) by another rule: news only
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].notification, "opened");
  EXPECT_EQ(out[1].notification, "escalated");
  EXPECT_EQ(out[1].severity, Severity::kCritical);
  EXPECT_EQ(out[2].notification, "escalated");
  ASSERT_EQ(out[2].facts.size(), 3u);
  EXPECT_EQ(out[2].facts[1].tensor, "blocks.2.mlp.fc2");
  EXPECT_EQ(out[2].facts[2].kind, "loss");
  EXPECT_NE(out[2].message.find("1 more alert(s)"), std::string::npos) << out[2].message;
}

TEST(IncidentGrouper, SeparateKeysAreSeparateIncidents) {
  IncidentGrouper g = Grouper();
  std::vector<Alert> out;
  Alert a = Drift("x", Severity::kWarning, 1);
  Alert b = a;
  b.incident = "numerics/exp/c";
  g.Add(a, 0s, &out);
  g.Add(b, 0s, &out);
  EXPECT_EQ(out.size(), 2u);
  EXPECT_EQ(g.open(), 2u);
}

TEST(IncidentGrouper, ResolvesAfterQuietAndForgets) {
  IncidentGrouper g = Grouper();
  std::vector<Alert> out;
  g.Add(Drift("x", Severity::kWarning, 1), 0s, &out);
  g.Add(Drift("y", Severity::kWarning, 2), 1min, &out);
  EXPECT_EQ(g.NextDue(), 5min);  // the digest of y (5 min after "opened") comes first
  g.Tick(5min, true, &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].notification, "update");
  EXPECT_EQ(g.NextDue(), 11min);  // then the resolution, 10 min after the last alert
  g.Tick(11min, false, &out);    // no token: the resolution waits
  EXPECT_EQ(out.size(), 2u);
  g.Tick(12min, true, &out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2].notification, "resolved");
  EXPECT_NE(out[2].message.find("no new alert for 11 min"), std::string::npos) << out[2].message;
  EXPECT_EQ(g.open(), 0u);
  g.Add(Drift("z", Severity::kWarning, 3), 13min, &out);  // a new cause: opened again
  EXPECT_EQ(out.back().notification, "opened");
}

TEST(IncidentGrouper, AHeldMessageIsMergedIntoTheNextOneNotLost) {
  IncidentGrouper g = Grouper();
  std::vector<Alert> out;
  g.Add(Drift("x", Severity::kWarning, 1), 0s, &out);
  ASSERT_EQ(out.size(), 1u);
  g.Hold(out[0]);  // the rate limit said no
  EXPECT_EQ(g.held(), 1u);
  EXPECT_EQ(g.NextDue(), 0s);
  g.Add(Drift("y", Severity::kWarning, 2), 1s, &out);
  g.Tick(2s, false, &out);
  EXPECT_EQ(out.size(), 1u);  // still no token
  g.Tick(3s, true, &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].notification, "opened");  // what was held keeps its state
  EXPECT_EQ(out[1].incident_alerts, 2u);
  EXPECT_NE(out[1].message.find("2 more alert(s)"), std::string::npos) << out[1].message;
  EXPECT_EQ(g.held(), 0u);
}

TEST(IncidentGrouper, NoDigestsWhenTheIntervalIsZero) {
  IncidentGrouper g(0s, 0s);
  std::vector<Alert> out;
  g.Add(Drift("x", Severity::kWarning, 1), 0s, &out);
  g.Add(Drift("y", Severity::kWarning, 2), 1s, &out);
  EXPECT_EQ(g.NextDue(), IncidentGrouper::Ns::max());
  g.Tick(24h, true, &out);
  EXPECT_EQ(out.size(), 1u);
}

}  // namespace
}  // namespace lockstep::alerting
