// fuzz_runlog: arbitrary file bytes as a run log (torn tails, flipped bits, bad
// lengths), read the ways lockstep reads logs:
//   1. as `lockstep inspect` does: LogReader, each record through the envelope check,
//      the inspect rendering and the --summary registry — on the bytes as they are
//      (after a mutation mostly a checksum mismatch) and again with every checksum
//      made right, so mutated lengths and payloads get past the CRC;
//   2. as a restarting collector does (Collector::Impl::Rebuild): LogWriter::Recover
//      cuts the bad tail, each good record goes to the registry; after it the file must
//      read cleanly to its end with the same records, and take a new record.
// The file lives in memory (MemFile).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "lockstep/common/envelope_check.h"
#include "lockstep/collector/registry.h"
#include "runlog/crc32c.h"
#include "cli/inspect_format.h"
#include "runlog/log_format.h"
#include "runlog/log_reader.h"
#include "runlog/log_writer.h"

namespace lockstep::fuzz {
namespace {

using collector::LogReader;
using collector::LogWriter;
namespace runlog = collector::runlog;

uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
void Store32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// Recomputes the header's and every whole record's checksum, as if the bytes had been
// written by a LogWriter. Stops at the first record whose length does not fit.
void RepairChecksums(std::vector<uint8_t>* b) {
  auto& f = *b;
  if (f.size() < runlog::kFileHeaderBytes) return;
  Store32(&f[12], collector::crc32c::Value(f.data(), 12));
  size_t pos = runlog::kFileHeaderBytes;
  while (pos + runlog::kRecordHeaderBytes <= f.size()) {
    uint32_t len = Load32(&f[pos]) & ~runlog::kBlockFlag;  // a block's is flagged
    if (len == 0 || len > f.size() - pos - runlog::kRecordHeaderBytes) return;
    uint32_t crc = collector::crc32c::Extend(0, &f[pos], 4);
    crc = collector::crc32c::Extend(crc, &f[pos + 8], 8);
    crc = collector::crc32c::Extend(crc, &f[pos + runlog::kRecordHeaderBytes], len);
    Store32(&f[pos + 4], crc);
    pos += runlog::kRecordHeaderBytes + len;
  }
}

// `lockstep inspect` over the file; returns the records read.
uint64_t Inspect(const MemFile& file, uint64_t file_size) {
  auto reader = LogReader::Open(file.path());
  if (!reader.ok()) return 0;
  collector::InspectFormatter fmt;
  collector::Registry registry;
  std::string line;
  LogReader::Record rec;
  LogReader::Result res;
  uint64_t expect_offset = runlog::kFileHeaderBytes, block_offset = 0;
  while ((res = (*reader)->Next(&rec)) == LogReader::Result::kRecord) {
    if ((*reader)->blocks() > 0) {
      // The records of a compressed block carry the block's offset, and the block's
      // length is the reader's: each record lies in a block that starts inside the file
      // at or after the last one.
      if (rec.offset < block_offset || rec.offset + runlog::kRecordHeaderBytes > file_size || rec.size == 0)
        Fail("a record of a block at offset " + std::to_string(rec.offset) + " lies outside the file");
      expect_offset = UINT64_MAX;  // known again only from offset() at the end
    } else if (rec.offset != expect_offset || rec.size == 0 ||
               rec.offset + runlog::kRecordHeaderBytes + rec.size > file_size) {
      Fail("a record at offset " + std::to_string(rec.offset) + " of " + std::to_string(rec.size) +
           " bytes does not follow the previous one inside the file");
    } else {
      expect_offset = rec.offset + runlog::kRecordHeaderBytes + rec.size;
    }
    block_offset = rec.offset;
    auto env = LogReader::Envelope(rec, runlog::kMaxRecordBytes);
    if (!env.ok()) continue;
    registry.OnMessage(**env, rec.recv_unix_ns, rec.size);
    line.clear();
    fmt.Record(**env, rec.recv_unix_ns, rec.offset, rec.size, &line);
  }
  if ((*reader)->blocks() > 0) expect_offset = (*reader)->offset();
  if ((*reader)->offset() != expect_offset) Fail("offset() is not the end of the last good record");
  if (res == LogReader::Result::kEnd && expect_offset != file_size)
    Fail("a clean end before the end of the file");
  if (res != LogReader::Result::kEnd && (*reader)->problem().empty())
    Fail("a torn or corrupt log without a problem sentence");
  for (const auto& r : registry.Snapshot()) collector::RankSummaryJson(r, &line);
  return (*reader)->records();
}

// The collector's start-up on this file, then one more append.
void Recover(const MemFile& file, uint64_t file_size, uint64_t inspected) {
  collector::Registry registry;
  auto rec = LogWriter::Recover(file.path(), [&](const LogReader::Record& r) {
    collector::EnvelopeCheck c = collector::CheckEnvelope(r.data, r.size, runlog::kMaxRecordBytes);
    if (c.reject == collector::Reject::kNone) registry.OnMessage(*c.env, r.recv_unix_ns, r.size);
  });
  if (!rec.ok()) return;  // not a run log at all: left untouched
  if (file_size >= runlog::kFileHeaderBytes && rec->records != inspected)
    Fail("Recover kept " + std::to_string(rec->records) + " records where the reader read " +
         std::to_string(inspected));
  if (rec->valid_bytes + rec->cut_bytes != file_size && file_size >= runlog::kFileHeaderBytes)
    Fail("Recover's kept and cut bytes do not add up to the file size");

  // Appending after the cut: the log must hold exactly the kept records and the new one.
  auto w = LogWriter::Open(file.path(), /*recover=*/false);
  if (!w.ok()) Fail("cannot reopen a recovered log: " + w.status().message());
  const uint8_t payload[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  if (!(*w)->Append(payload, sizeof payload, 42).ok() || !(*w)->Flush().ok())
    Fail("cannot append to a recovered log");
  w->reset();
  auto reader = LogReader::Open(file.path());
  if (!reader.ok()) Fail("a recovered log does not open: " + reader.status().message());
  LogReader::Record r;
  LogReader::Result res;
  uint64_t n = 0;
  bool last_is_new = false;
  while ((res = (*reader)->Next(&r)) == LogReader::Result::kRecord) {
    ++n;
    last_is_new = r.size == sizeof payload && std::memcmp(r.data, payload, sizeof payload) == 0 &&
                  r.recv_unix_ns == 42;
  }
  if (res != LogReader::Result::kEnd || n != rec->records + 1 || !last_is_new)
    Fail("after recovery and one append the log reads " + std::to_string(n) + " records (" +
         (*reader)->problem() + "), expected " + std::to_string(rec->records + 1));
}

void OneFile(const uint8_t* data, size_t size) {
  MemFile file;
  file.Set(data, size);
  Inspect(file, size);

  std::vector<uint8_t> repaired(data, data + size);
  RepairChecksums(&repaired);
  file.Set(repaired.data(), repaired.size());
  uint64_t n = Inspect(file, size);
  Recover(file, size, n);
}

}  // namespace
}  // namespace lockstep::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  lockstep::fuzz::Quiet();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lockstep::fuzz::OneFile(data, size);
  return 0;
}
