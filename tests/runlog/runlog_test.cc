#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>

#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_format.h"
#include "runlog/log_reader.h"
#include "runlog/log_writer.h"
#include "file_size_limit.h"
#include "test_dir.h"
#include "test_messages.h"

// The largest operator new of this test binary since the last reset: lets a test see
// that reading a small file allocated nothing big.
namespace {
std::atomic<size_t> g_largest_new{0};
}  // namespace

void* operator new(size_t n) {
  size_t prev = g_largest_new.load(std::memory_order_relaxed);
  while (n > prev && !g_largest_new.compare_exchange_weak(prev, n, std::memory_order_relaxed)) {
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace lockstep::collector {
namespace {

namespace fs = std::filesystem;
using testing::At;
using testing::Bytes;

std::vector<Bytes> SomeMessages(int n) {
  std::vector<Bytes> v;
  for (int i = 0; i < n; ++i) v.push_back(testing::Stats(At("run-a", 0, i), i, 1 + i % 3));
  return v;
}

void WriteLog(const std::string& path, const std::vector<Bytes>& msgs, size_t buffer = 256 << 10) {
  auto w = LogWriter::Open(path, true, buffer);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (size_t i = 0; i < msgs.size(); ++i)
    ASSERT_TRUE((*w)->Append(msgs[i].data(), msgs[i].size(), 1000 + i).ok());
  ASSERT_TRUE((*w)->Sync().ok());
}

// Reads every record; returns the payloads and the final result.
std::vector<Bytes> ReadAll(const std::string& path, LogReader::Result* last = nullptr,
                           std::vector<int64_t>* recv = nullptr) {
  std::vector<Bytes> out;
  auto r = LogReader::Open(path);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return out;
  LogReader::Record rec;
  LogReader::Result res;
  while ((res = (*r)->Next(&rec)) == LogReader::Result::kRecord) {
    out.emplace_back(rec.data, rec.data + rec.size);
    if (recv) recv->push_back(rec.recv_unix_ns);
  }
  if (last) *last = res;
  return out;
}

TEST(RunLog, WriteReadRoundTrip) {
  testing::TempDir dir;
  std::string path = dir / "run-a.lslog";
  auto msgs = SomeMessages(50);
  // A small buffer forces many flushes, and a message bigger than the buffer.
  msgs.push_back(testing::Stats(At("run-a", 0, 50), 50, 200));
  WriteLog(path, msgs, 1024);
  LogReader::Result last;
  std::vector<int64_t> recv;
  auto got = ReadAll(path, &last, &recv);
  EXPECT_EQ(last, LogReader::Result::kEnd);
  ASSERT_EQ(got.size(), msgs.size());
  for (size_t i = 0; i < msgs.size(); ++i) {
    EXPECT_EQ(got[i], msgs[i]) << i;
    EXPECT_EQ(recv[i], static_cast<int64_t>(1000 + i));
  }
  // And each payload verifies as the envelope it was.
  auto r = LogReader::Open(path);
  LogReader::Record rec;
  ASSERT_EQ((*r)->Next(&rec), LogReader::Result::kRecord);
  auto env = LogReader::Envelope(rec);
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_EQ((*env)->seq(), 0u);
  EXPECT_EQ((*env)->body_type(), wire::Body::StepStats);
}

TEST(RunLog, AFailedWriteLosesOnlyWhatWasNotWrittenCountsItAndKeepsTheFileWhole) {
  testing::TempDir dir;
  std::string path = dir / "run-a.lslog";
  auto msgs = SomeMessages(12);
  auto w = LogWriter::Open(path, true, 300);  // a small buffer: Append() flushes too
  ASSERT_TRUE(w.ok());
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE((*w)->Append(msgs[i].data(), msgs[i].size(), 1).ok());
  ASSERT_TRUE((*w)->Flush().ok());
  const uint64_t good = (*w)->size();
  {
    // The disk is full 8 bytes later: each write is cut short there, then refused.
    testing::FileSizeLimit full(good + 8);
    uint64_t failed = 0;
    for (size_t i = 4; i < 8; ++i)
      failed += !(*w)->Append(msgs[i].data(), msgs[i].size(), 1).ok();
    failed += !(*w)->Flush().ok();
    EXPECT_GE(failed, 1u);
    EXPECT_EQ(fs::file_size(path), good);  // cut back to the last whole record
  }
  const uint64_t lost = (*w)->lost_records();
  EXPECT_EQ(lost, 4u);  // every record of 4..7, including one whose Append() failed
  for (size_t i = 8; i < 12; ++i) ASSERT_TRUE((*w)->Append(msgs[i].data(), msgs[i].size(), 1).ok());
  ASSERT_TRUE((*w)->Sync().ok());
  LogReader::Result last;
  auto got = ReadAll(path, &last);
  EXPECT_EQ(last, LogReader::Result::kEnd);
  std::vector<Bytes> want(msgs.begin(), msgs.begin() + 4);
  want.insert(want.end(), msgs.begin() + 8, msgs.end());
  EXPECT_EQ(got, want);
}

TEST(RunLog, ReopenAppendsAfterExistingRecords) {
  testing::TempDir dir;
  std::string path = dir / "run-a.lslog";
  auto msgs = SomeMessages(10);
  WriteLog(path, {msgs.begin(), msgs.begin() + 4});
  WriteLog(path, {msgs.begin() + 4, msgs.end()});
  EXPECT_EQ(ReadAll(path), msgs);
}

TEST(RunLog, TornTailAtEveryOffsetIsCutAndEarlierRecordsKept) {
  testing::TempDir dir;
  std::string good = dir / "good.lslog";
  // A small last record keeps the every-offset loop (one fsync each) quick.
  auto msgs = SomeMessages(4);
  msgs.push_back(testing::Heartbeat(At("run-a", 0, 4), 1, 2));
  WriteLog(good, msgs);
  uint64_t full = fs::file_size(good);
  uint64_t last_len = runlog::kRecordHeaderBytes + msgs.back().size();
  uint64_t last_start = full - last_len;
  auto extra = testing::Stats(At("run-a", 0, 5), 5, 1);
  for (uint64_t cut = last_start + 1; cut < full; ++cut) {
    std::string path = dir / "torn.lslog";
    fs::copy_file(good, path, fs::copy_options::overwrite_existing);
    fs::resize_file(path, cut);
    // The reader stops at the tear and says where.
    LogReader::Result last;
    auto got = ReadAll(path, &last);
    ASSERT_EQ(last, LogReader::Result::kTruncated) << cut;
    ASSERT_EQ(got.size(), 4u) << cut;
    // Recovery cuts exactly the torn record; appending afterwards works.
    auto rec = LogWriter::Recover(path, nullptr);
    ASSERT_TRUE(rec.ok());
    EXPECT_EQ(rec->records, 4u);
    EXPECT_EQ(rec->valid_bytes, last_start);
    EXPECT_EQ(rec->cut_bytes, cut - last_start);
    EXPECT_EQ(fs::file_size(path), last_start);
    WriteLog(path, {extra});
    got = ReadAll(path, &last);
    EXPECT_EQ(last, LogReader::Result::kEnd);
    ASSERT_EQ(got.size(), 5u);
    EXPECT_EQ(got[3], msgs[3]);
    EXPECT_EQ(got[4], extra);
  }
}

TEST(RunLog, FlippedBitIsCutFromThereOn) {
  testing::TempDir dir;
  std::string good = dir / "good.lslog";
  auto msgs = SomeMessages(6);
  WriteLog(good, msgs);
  // Record 3 starts after the header and three records.
  uint64_t start3 = runlog::kFileHeaderBytes;
  for (int i = 0; i < 3; ++i) start3 += runlog::kRecordHeaderBytes + msgs[i].size();
  uint64_t len3 = runlog::kRecordHeaderBytes + msgs[3].size();
  // Every bit of record 3 except its length field (whose corruption reads as a torn or
  // absurd record, tested elsewhere): checksum, receive time, payload.
  for (uint64_t byte = start3 + 4; byte < start3 + len3; byte += 7) {
    std::string path = dir / "flip.lslog";
    fs::copy_file(good, path, fs::copy_options::overwrite_existing);
    {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(static_cast<std::streamoff>(byte));
      char c;
      f.get(c);
      f.seekp(static_cast<std::streamoff>(byte));
      f.put(static_cast<char>(c ^ 0x10));
    }
    LogReader::Result last;
    auto got = ReadAll(path, &last);
    EXPECT_EQ(last, LogReader::Result::kCorrupt) << byte;
    EXPECT_EQ(got.size(), 3u);
    auto rec = LogWriter::Recover(path, nullptr);
    ASSERT_TRUE(rec.ok());
    EXPECT_EQ(rec->records, 3u);
    EXPECT_EQ(fs::file_size(path), start3);
    got = ReadAll(path, &last);
    EXPECT_EQ(last, LogReader::Result::kEnd);
    EXPECT_EQ(got, std::vector<Bytes>(msgs.begin(), msgs.begin() + 3));
  }
}

// A log of two records whose second length field is overwritten with `length`;
// returns the second record's offset.
uint64_t WriteTwoWithSecondLength(const std::string& path, uint32_t length) {
  auto msgs = SomeMessages(2);
  WriteLog(path, msgs);
  uint64_t start1 = runlog::kFileHeaderBytes + runlog::kRecordHeaderBytes + msgs[0].size();
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(start1));
  f.write(reinterpret_cast<const char*>(&length), 4);
  return start1;
}

TEST(RunLog, AbsurdLengthIsCorruption) {
  testing::TempDir dir;
  std::string path = dir / "a.lslog";
  uint64_t start1 = WriteTwoWithSecondLength(path, 0xFFFFFFF0u);
  auto r = LogReader::Open(path);
  ASSERT_TRUE(r.ok());
  LogReader::Record rec;
  EXPECT_EQ((*r)->Next(&rec), LogReader::Result::kRecord);
  EXPECT_EQ((*r)->Next(&rec), LogReader::Result::kCorrupt);
  EXPECT_EQ((*r)->offset(), start1);
  EXPECT_NE((*r)->problem().find("absurd record length"), std::string::npos);
  EXPECT_NE((*r)->problem().find("a.lslog"), std::string::npos);
}

// fuzz_runlog: a flipped bit that turned a record's length into 200 MiB (under the
// "absurd" cap) in a file of a few hundred bytes made LogReader::Next allocate and
// zero the 200 MiB before finding the file too short. It is a torn record, read as
// such without the allocation, and the reader still retries it once the file grows.
TEST(RunLog, HugeLengthInASmallFileIsTornWithoutAllocatingIt) {
  testing::TempDir dir;
  std::string path = dir / "a.lslog";
  uint32_t huge = 200u << 20;
  ASSERT_LT(huge, runlog::kMaxRecordBytes);
  uint64_t start1 = WriteTwoWithSecondLength(path, huge);
  auto r = LogReader::Open(path);
  ASSERT_TRUE(r.ok());
  g_largest_new.store(0);
  LogReader::Record rec;
  EXPECT_EQ((*r)->Next(&rec), LogReader::Result::kRecord);
  EXPECT_EQ((*r)->Next(&rec), LogReader::Result::kTruncated);
  EXPECT_EQ((*r)->offset(), start1);
  EXPECT_LT(g_largest_new.load(), size_t{1} << 20);
  auto rec_status = LogWriter::Recover(path, nullptr);
  ASSERT_TRUE(rec_status.ok());
  EXPECT_EQ(rec_status->records, 1u);
  EXPECT_EQ(fs::file_size(path), start1);
}

TEST(RunLog, ReaderRetriesAGrowingTail) {
  testing::TempDir dir;
  std::string path = dir / "live.lslog";
  auto msgs = SomeMessages(3);
  auto w = LogWriter::Open(path, true);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append(msgs[0].data(), msgs[0].size(), 1).ok());
  ASSERT_TRUE((*w)->Flush().ok());
  auto r = LogReader::Open(path);
  ASSERT_TRUE(r.ok());
  LogReader::Record rec;
  EXPECT_EQ((*r)->Next(&rec), LogReader::Result::kRecord);
  EXPECT_EQ((*r)->Next(&rec), LogReader::Result::kEnd);
  ASSERT_TRUE((*w)->Append(msgs[1].data(), msgs[1].size(), 2).ok());
  ASSERT_TRUE((*w)->Flush().ok());
  ASSERT_EQ((*r)->Next(&rec), LogReader::Result::kRecord);
  EXPECT_EQ(Bytes(rec.data, rec.data + rec.size), msgs[1]);
}

TEST(RunLog, NotALogIsRefusedAndLeftAlone) {
  testing::TempDir dir;
  std::string path = dir / "x.lslog";
  { std::ofstream(path) << "this is not a run log at all, just text"; }
  auto r = LogReader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsCorruption());
  EXPECT_NE(r.status().message().find("not a lockstep run log"), std::string::npos);
  auto rec = LogWriter::Recover(path, nullptr);
  EXPECT_FALSE(rec.ok());
  EXPECT_EQ(fs::file_size(path), 39u);
  EXPECT_TRUE(LogReader::Open(dir / "missing.lslog").status().IsNotFound());
}

TEST(RunLog, TornHeaderStartsAfresh) {
  testing::TempDir dir;
  std::string path = dir / "h.lslog";
  WriteLog(path, SomeMessages(1));
  fs::resize_file(path, 7);
  auto msgs = SomeMessages(2);
  WriteLog(path, msgs);
  EXPECT_EQ(ReadAll(path), msgs);
}

}  // namespace
}  // namespace lockstep::collector
