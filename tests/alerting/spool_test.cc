// The on-disk spool: order, persistence across reopen, size cap, torn and corrupt files.
#include "spool.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace lockstep::alerting {
namespace {

namespace fs = std::filesystem;
using testing::SampleAlert;
using testing::TempDir;

TEST(Spool, DiskSpoolSurvivesReopenInOrder) {
  std::string dir = TempDir("spool");
  {
    auto s = Spool::Open(dir, 1 << 20, 0);
    ASSERT_TRUE(s.ok());
    for (int i = 0; i < 5; ++i) EXPECT_EQ((*s)->Push(SampleAlert("id" + std::to_string(i)), nullptr), 0u);
    ASSERT_NE((*s)->Front(), nullptr);
    EXPECT_EQ((*s)->Front()->id, "id0");
    (*s)->PopFront();
  }
  std::ofstream(dir + "/.tmp-99") << "{torn";  // a crash mid-write
  auto s = Spool::Open(dir, 1 << 20, 0);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->Size(), 4u);
  EXPECT_FALSE(fs::exists(dir + "/.tmp-99"));
  for (int i = 1; i < 5; ++i) {
    ASSERT_NE((*s)->Front(), nullptr);
    EXPECT_EQ((*s)->Front()->id, "id" + std::to_string(i));
    EXPECT_EQ((*s)->Front()->DedupKey(), SampleAlert().DedupKey());
    (*s)->PopFront();
  }
  EXPECT_TRUE((*s)->Empty());
  (*s)->Push(SampleAlert("new"), nullptr);  // sequence continues after the old files
  auto again = Spool::Open(dir, 1 << 20, 0);
  ASSERT_EQ((*again)->Size(), 1u);
  EXPECT_EQ((*again)->Front()->id, "new");
  fs::remove_all(dir);
}

TEST(Spool, SizeCapDropsOldestAndCounts) {
  std::string dir = TempDir("spoolcap");
  auto s = Spool::Open(dir, 4096, 0);
  ASSERT_TRUE(s.ok());
  uint64_t dropped = 0;
  for (int i = 0; i < 40; ++i) dropped += (*s)->Push(SampleAlert("id" + std::to_string(i)), nullptr);
  EXPECT_GT(dropped, 0u);
  EXPECT_EQ((*s)->Size() + dropped, 40u);
  EXPECT_EQ((*s)->Front()->id, "id" + std::to_string(dropped));  // the oldest went first
  size_t files = 0;
  for (auto& e : fs::directory_iterator(dir)) files += e.path().extension() == ".json";
  EXPECT_EQ(files, (*s)->Size());
  fs::remove_all(dir);
}

TEST(Spool, CorruptRecordIsSkippedAndCounted) {
  std::string dir = TempDir("spoolbad");
  {
    auto s = Spool::Open(dir, 1 << 20, 0);
    (*s)->Push(SampleAlert("x"), nullptr);
    (*s)->Push(SampleAlert("y"), nullptr);
  }
  std::ofstream(dir + "/00000000000000000001.json", std::ios::trunc) << "garbage";
  auto s = Spool::Open(dir, 1 << 20, 0);
  ASSERT_NE((*s)->Front(), nullptr);
  EXPECT_EQ((*s)->Front()->id, "y");
  EXPECT_EQ((*s)->corrupt_dropped(), 1u);
  fs::remove_all(dir);
}

TEST(Spool, MemorySpoolCapsByCount) {
  auto s = Spool::Open("", 0, 3);
  ASSERT_TRUE(s.ok());
  uint64_t dropped = 0;
  for (int i = 0; i < 5; ++i) dropped += (*s)->Push(SampleAlert("m" + std::to_string(i)), nullptr);
  EXPECT_EQ(dropped, 2u);
  EXPECT_EQ((*s)->Front()->id, "m2");
  EXPECT_FALSE((*s)->on_disk());
}

TEST(Spool, UnwritableDirIsOneSentence) {
  auto s = Spool::Open("/proc/lockstep-no-such/spool", 1 << 20, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--alert-spool-dir"), std::string::npos);
}

TEST(Spool, SubdirNameHidesTheUrl) {
  std::string n = SpoolSubdirName("slack", "https://hooks.slack.com/services/T/B/SECRET");
  EXPECT_EQ(n.rfind("slack-", 0), 0u);
  EXPECT_EQ(n.find("SECRET"), std::string::npos);
  EXPECT_EQ(n, SpoolSubdirName("slack", "https://hooks.slack.com/services/T/B/SECRET"));
  EXPECT_NE(n, SpoolSubdirName("slack", "https://hooks.slack.com/services/T/B/OTHER"));
}

}  // namespace
}  // namespace lockstep::alerting
