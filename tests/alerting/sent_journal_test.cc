// The sinks' journal (sent_journal.h): what a sink handled survives a restart, so the
// alerts a restarted collector derives again from its logs (replayed) are not sent
// twice, those it never handled are, and the dedup cooldown goes on across the restart.
#include "sent_journal.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "lockstep/alerting/dispatcher.h"
#include "test_util.h"

namespace lockstep::alerting {
namespace {

using namespace std::chrono_literals;
using testing::SampleAlert;

std::vector<nlohmann::json> Lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(nlohmann::json::parse(l));
  return out;
}

TEST(SentJournal, InstanceKeyTellsRunsRankAndSeverityApart) {
  Alert a = SampleAlert("x");
  Alert b = a;
  b.runs = {"other"};
  Alert c = a;
  c.severity = Severity::kWarning;
  Alert d = a;
  d.rank = 4;
  EXPECT_NE(InstanceKey(a), InstanceKey(b));
  EXPECT_NE(InstanceKey(a), InstanceKey(c));
  EXPECT_NE(InstanceKey(a), InstanceKey(d));
  EXPECT_EQ(InstanceKey(a), InstanceKey(SampleAlert("x")));
}

TEST(SentJournal, ReopenedKnowsWhatWasRecordedAndSkipsATornLine) {
  std::string dir = testing::TempDir("journal");
  std::string path = dir + "/sent/x.journal";
  {
    auto j = SentJournal::Open(path);
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    ASSERT_TRUE((*j)->Record(SampleAlert("a"), true, 100).ok());
    ASSERT_TRUE((*j)->Record(SampleAlert("b"), false, 200).ok());
  }
  {
    std::ofstream f(path, std::ios::app);
    f << "300\t1\t2\t0\tfirst_divergence/glm-migration/t\tc|torn";  // no newline: a crash
  }
  auto j = SentJournal::Open(path);
  ASSERT_TRUE(j.ok());
  EXPECT_TRUE((*j)->Contains(InstanceKey(SampleAlert("a"))));
  EXPECT_TRUE((*j)->Contains(InstanceKey(SampleAlert("b"))));
  EXPECT_FALSE((*j)->Contains("c|torn"));
  EXPECT_EQ((*j)->size(), 2u);
  ASSERT_EQ((*j)->passed_at_open().size(), 1u);
  EXPECT_EQ((*j)->passed_at_open()[0].unix_ns, 100);
  EXPECT_EQ((*j)->passed_at_open()[0].dedup_key, SampleAlert("a").DedupKey());
  std::filesystem::remove_all(dir);
}

AlertingOptions JsonlWithJournal(const std::string& dir) {
  SinkOptions file;
  file.kind = "jsonl";
  file.target = dir + "/alerts.jsonl";
  AlertingOptions o;
  o.sinks = {file};
  o.spool_dir = dir + "/spool";
  o.dedup_cooldown = 300s;
  return o;
}

TEST(SentJournal, ReplayedAlertsAreSentOnceAcrossARestart) {
  std::string dir = testing::TempDir("replay");
  AlertingOptions o = JsonlWithJournal(dir);
  {
    auto d = Dispatcher::Create(o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    (*d)->Submit(SampleAlert("a@1", "ta"));
    (*d)->Submit(SampleAlert("b@2", "tb"));
    ASSERT_TRUE((*d)->Flush(5s));
  }  // as if killed now: the file and the journal hold a and b
  auto d = Dispatcher::Create(o);
  ASSERT_TRUE(d.ok());
  // The restart's replay derives all three again.
  const std::pair<const char*, const char*> replay[] = {{"a@1", "ta"}, {"b@2", "tb"}, {"c@3", "tc"}};
  for (auto [id, tensor] : replay) {
    Alert a = SampleAlert(id, tensor);
    a.replayed = true;
    (*d)->Submit(a);
  }
  ASSERT_TRUE((*d)->Flush(5s));
  auto lines = Lines(o.sinks[0].target);
  ASSERT_EQ(lines.size(), 3u);  // a, b before; c (never handled) after
  EXPECT_EQ(lines[0]["id"], "a@1");
  EXPECT_EQ(lines[1]["id"], "b@2");
  EXPECT_EQ(lines[2]["id"], "c@3");
  EXPECT_EQ((*d)->Counters()[0].already_sent, 2u);
  std::filesystem::remove_all(dir);
}

TEST(SentJournal, DedupCooldownGoesOnAcrossARestart) {
  std::string dir = testing::TempDir("cooldown");
  AlertingOptions o = JsonlWithJournal(dir);
  {
    auto d = Dispatcher::Create(o);
    ASSERT_TRUE(d.ok());
    (*d)->Submit(SampleAlert("a@1", "ta"));
    ASSERT_TRUE((*d)->Flush(5s));
  }
  auto d = Dispatcher::Create(o);
  ASSERT_TRUE(d.ok());
  Alert repeat = SampleAlert("a@9", "ta");  // a new, live instance of the same key
  (*d)->Submit(repeat);
  Alert escalation = SampleAlert("a@10", "ta");
  escalation.severity = Severity::kCritical;  // same as sent: still a repeat
  (*d)->Submit(escalation);
  ASSERT_TRUE((*d)->Flush(5s));
  EXPECT_EQ(Lines(o.sinks[0].target).size(), 1u);
  EXPECT_EQ((*d)->Counters()[0].deduped, 2u);
  // Without the journal (no spool dir) the same restart would send it again.
  AlertingOptions no_journal = o;
  no_journal.spool_dir = "";
  auto d2 = Dispatcher::Create(no_journal);
  ASSERT_TRUE(d2.ok());
  (*d2)->Submit(repeat);
  ASSERT_TRUE((*d2)->Flush(5s));
  EXPECT_EQ(Lines(o.sinks[0].target).size(), 2u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lockstep::alerting
