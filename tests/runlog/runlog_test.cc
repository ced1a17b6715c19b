#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>

#include <zstd.h>

#include "lockstep/schema/lockstep_generated.h"
#include "runlog/crc32c.h"
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

// Plain records unless `compress`: the layout tests below count bytes of records.
void WriteLog(const std::string& path, const std::vector<Bytes>& msgs, size_t buffer = 256 << 10,
              bool compress = false) {
  auto w = LogWriter::Open(path, true, buffer, compress);
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

// The log at `path` holds `msgs` as WriteLog wrote them (receive times 1000, 1001, ...)
// and ends cleanly.
void ExpectWhatWriteLogWrote(const std::string& path, const std::vector<Bytes>& msgs) {
  LogReader::Result last;
  std::vector<int64_t> recv;
  auto got = ReadAll(path, &last, &recv);
  EXPECT_EQ(last, LogReader::Result::kEnd);
  ASSERT_EQ(got.size(), msgs.size());
  for (size_t i = 0; i < msgs.size(); ++i) {
    EXPECT_EQ(got[i], msgs[i]) << i;
    EXPECT_EQ(recv[i], static_cast<int64_t>(1000 + i));
  }
}

TEST(RunLog, WriteReadRoundTrip) {
  testing::TempDir dir;
  std::string path = dir / "run-a.lslog";
  auto msgs = SomeMessages(50);
  // A small buffer forces many flushes, and a message bigger than the buffer.
  msgs.push_back(testing::Stats(At("run-a", 0, 50), 50, 200));
  WriteLog(path, msgs, 1024);
  ExpectWhatWriteLogWrote(path, msgs);
  // And each payload verifies as the envelope it was.
  auto r = LogReader::Open(path);
  LogReader::Record rec;
  ASSERT_EQ((*r)->Next(&rec), LogReader::Result::kRecord);
  auto env = LogReader::Envelope(rec);
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_EQ((*env)->seq(), 0u);
  EXPECT_EQ((*env)->body_type(), wire::Body::StepStats);
}

uint16_t MajorOf(const std::string& path) {
  auto r = LogReader::Open(path);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? (*r)->format_major() : 0;
}

TEST(RunLog, CompressedBlocksReadBackRecordByRecord) {
  testing::TempDir dir;
  std::string path = dir / "run-a.lslog", plain = dir / "plain.lslog";
  auto msgs = SomeMessages(300);
  msgs.push_back(testing::Stats(At("run-a", 0, 300), 300, 400));  // larger than the buffer
  WriteLog(path, msgs, 8 << 10, /*compress=*/true);
  WriteLog(plain, msgs, 8 << 10, /*compress=*/false);
  EXPECT_EQ(MajorOf(path), runlog::kFormatMajor);
  EXPECT_EQ(MajorOf(plain), runlog::kFormatMajorPlain);
  ExpectWhatWriteLogWrote(path, msgs);
  auto r = LogReader::Open(path);
  LogReader::Record rec;
  uint64_t first_offset = 0, n = 0;
  while ((*r)->Next(&rec) == LogReader::Result::kRecord) {
    if (n++ == 0) first_offset = rec.offset;
    ASSERT_TRUE(LogReader::Envelope(rec).ok()) << n;  // aligned, verifiable payloads
  }
  EXPECT_EQ(first_offset, runlog::kFileHeaderBytes);  // a block's records carry its offset
  EXPECT_GT((*r)->blocks(), 5u);
  EXPECT_EQ((*r)->offset(), fs::file_size(path));
  // The test messages are alike, as a run's steps are: the blocks are much smaller.
  EXPECT_LT(fs::file_size(path) * 2, fs::file_size(plain));
}

TEST(RunLog, ATornOrCorruptBlockIsCutWholeAndEarlierBlocksKept) {
  testing::TempDir dir;
  std::string good = dir / "good.lslog";
  auto msgs = SomeMessages(40);
  WriteLog(good, {msgs.begin(), msgs.begin() + 20}, 256 << 10, true);  // block 1
  const uint64_t start2 = fs::file_size(good);
  WriteLog(good, {msgs.begin() + 20, msgs.end()}, 256 << 10, true);    // block 2
  const uint64_t full = fs::file_size(good);
  ASSERT_LT(full - start2, 20 * msgs[20].size());  // it is a block
  auto extra = testing::Stats(At("run-a", 0, 40), 40, 1);
  const std::vector<Bytes> first(msgs.begin(), msgs.begin() + 20);
  for (uint64_t cut = start2 + 1; cut < full; cut += 7) {
    std::string path = dir / "torn.lslog";
    fs::copy_file(good, path, fs::copy_options::overwrite_existing);
    fs::resize_file(path, cut);
    LogReader::Result last;
    auto got0 = ReadAll(path, &last);
    ASSERT_EQ(got0.size(), first.size()) << cut << " of " << full << " from " << start2;
    ASSERT_EQ(got0, first) << cut;
    ASSERT_EQ(last, LogReader::Result::kTruncated) << cut;
    auto rec = LogWriter::Recover(path, nullptr);
    ASSERT_TRUE(rec.ok());
    EXPECT_EQ(rec->records, 20u);
    EXPECT_EQ(rec->valid_bytes, start2);
    WriteLog(path, {extra}, 256 << 10, true);
    auto got = ReadAll(path, &last);
    EXPECT_EQ(last, LogReader::Result::kEnd);
    ASSERT_EQ(got.size(), 21u) << cut;
    EXPECT_EQ(got.back(), extra);
  }
  for (uint64_t byte = start2; byte < full; byte += 5) {
    std::string path = dir / "flipped.lslog";
    fs::copy_file(good, path, fs::copy_options::overwrite_existing);
    {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(static_cast<std::streamoff>(byte));
      char c;
      f.get(c);
      c ^= 0x10;
      f.seekp(static_cast<std::streamoff>(byte));
      f.put(c);
    }
    LogReader::Result last;
    auto got = ReadAll(path, &last);
    EXPECT_EQ(got, first) << byte;  // nothing of the bad block, all of the good one
    EXPECT_NE(last, LogReader::Result::kEnd) << byte;
  }
}

// fuzz_runlog: a block whose own checksum holds but whose second record does not (a
// writer's or decompressor's bug) handed out its first record and then stopped, so the
// reader counted a record that recovery then cut with the block. A block is checked
// whole before any of its records is handed out.
TEST(RunLog, ABlockWithABadRecordInsideIsCutWhole) {
  testing::TempDir dir;
  std::string path = dir / "inner.lslog";
  auto msgs = SomeMessages(3);
  WriteLog(path, {msgs[0]}, 256 << 10, true);
  const uint64_t start = fs::file_size(path);
  std::vector<uint8_t> raw;  // two records, the second with a wrong checksum
  for (int i = 1; i < 3; ++i) {
    uint8_t h[runlog::kRecordHeaderBytes] = {};
    const uint32_t n = static_cast<uint32_t>(msgs[i].size());
    std::memcpy(h, &n, 4);
    uint32_t crc = crc32c::Extend(crc32c::Extend(crc32c::Extend(0, h, 4), h + 8, 8), msgs[i].data(), n);
    crc += i == 2;
    std::memcpy(h + 4, &crc, 4);
    raw.insert(raw.end(), h, h + sizeof h);
    raw.insert(raw.end(), msgs[i].begin(), msgs[i].end());
  }
  std::vector<uint8_t> block(runlog::kRecordHeaderBytes + ZSTD_compressBound(raw.size()));
  const size_t z = ZSTD_compress(block.data() + runlog::kRecordHeaderBytes, block.size() - 16, raw.data(), raw.size(), 1);
  ASSERT_FALSE(ZSTD_isError(z));
  const uint32_t field = static_cast<uint32_t>(z) | runlog::kBlockFlag;
  std::memcpy(block.data(), &field, 4);
  uint32_t crc = crc32c::Extend(crc32c::Extend(0, block.data(), 4), block.data() + 8, 8);
  crc = crc32c::Extend(crc, block.data() + runlog::kRecordHeaderBytes, z);
  std::memcpy(block.data() + 4, &crc, 4);
  {
    std::ofstream f(path, std::ios::app | std::ios::binary);
    f.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(16 + z));
  }
  LogReader::Result last;
  EXPECT_EQ(ReadAll(path, &last), std::vector<Bytes>{msgs[0]});  // not msgs[1] either
  EXPECT_EQ(last, LogReader::Result::kCorrupt);
  auto rec = LogWriter::Recover(path, nullptr);
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->records, 1u);
  EXPECT_EQ(rec->valid_bytes, start);
}

TEST(RunLog, AFormatOneLogStaysPlainWhenAppendedTo) {
  testing::TempDir dir;
  std::string path = dir / "old.lslog";
  auto msgs = SomeMessages(30);
  WriteLog(path, {msgs.begin(), msgs.begin() + 10}, 256 << 10, /*compress=*/false);
  WriteLog(path, {msgs.begin() + 10, msgs.end()}, 256 << 10, /*compress=*/true);
  EXPECT_EQ(MajorOf(path), runlog::kFormatMajorPlain);  // the lockstep that wrote it reads it
  EXPECT_EQ(ReadAll(path), msgs);
  auto r = LogReader::Open(path);
  LogReader::Record rec;
  while ((*r)->Next(&rec) == LogReader::Result::kRecord) {
  }
  EXPECT_EQ((*r)->blocks(), 0u);
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
