// LogReader: sequential reader of one run log (`<run>.lslog`, see log_format.h).
//
// Used by the collector's start-up rebuild, the log writer's tail recovery, the
// aligner reading back a run that is far ahead, `lockstep compare`, `--baseline`,
// `lockstep inspect` and tests. Open() checks the file header; Next() yields records
// until the end of the file, a torn tail or a corrupt record, each reported as a
// value (never an exception, never a crash on bad bytes).
//
// Reading a log that the collector is still appending is fine: a partly written last
// record reads as kTruncated, and calling Next() again later retries from the same
// record.
//
// A compressed block (log_format.h) is checked and decompressed whole when reached; its
// records are then handed out one by one, each with the block's file offset.
//
// Segments (log_format.h): Open() reads a log's closed segments, oldest first, then the
// open "<run>.lslog", as one log; a reader at the end of the open file that finds it
// renamed into a segment (the collector rotated it) reads the rest of it and goes on
// with what followed. offset() and path() are those of the file being read. A closed
// segment rewritten by retention meanwhile is read whole in one of its two versions
// (the reader keeps the file it opened). OpenFile() reads one file only.
//
// Thread-compatible: one thread per LogReader.
#ifndef LOCKSTEP_COLLECTOR_RUNLOG_LOG_READER_H_
#define LOCKSTEP_COLLECTOR_RUNLOG_LOG_READER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/common/status.h"
#include "lockstep/common/wire.h"

namespace lockstep::wire {
struct Envelope;
}

namespace lockstep::collector {

class LogReader {
 public:
  enum class Result {
    kRecord,     // *rec holds the next record
    kEnd,        // clean end of file
    kTruncated,  // the file ends inside a record (torn write, or still being written)
    kCorrupt,    // bad checksum or absurd length at offset(): nothing after it is trusted
  };

  struct Record {
    const uint8_t* data = nullptr;  // the envelope bytes; valid until the next Next() call
    uint32_t size = 0;
    int64_t recv_unix_ns = 0;
    uint64_t offset = 0;  // file offset of the record header (of its block, if in one)
  };

  // Opens the log at `path` (its closed segments, then `path`) and checks the first
  // file's header. NotFound / IOError when it cannot be read, Corruption when it is not
  // a run log or is of an unknown format major.
  static StatusOr<std::unique_ptr<LogReader>> Open(const std::string& path);
  // The one file at `path`, without its segments (recovery, retention).
  static StatusOr<std::unique_ptr<LogReader>> OpenFile(const std::string& path);
  ~LogReader();
  LogReader(const LogReader&) = delete;
  LogReader& operator=(const LogReader&) = delete;

  Result Next(Record* rec);

  // Offset of the next record (or block) to read; after kTruncated/kCorrupt, of the bad
  // one (so everything before it is good and a writer may cut the file there). While
  // the records of a block are handed out, the block's own offset.
  uint64_t offset() const { return offset_; }
  // Records returned so far.
  uint64_t records() const { return records_; }
  // One sentence describing the last kTruncated/kCorrupt (names the file and offset).
  const std::string& problem() const { return problem_; }
  const std::string& path() const { return path_; }
  // The file's format major (runlog::kFormatMajor or kFormatMajorPlain).
  uint16_t format_major() const { return major_; }
  // Compressed blocks read so far.
  uint64_t blocks() const { return blocks_; }

  // What retention thinned in the files read so far (their thinning notes, log_format.h),
  // in log order: steps first_step..last_step kept every `every`-th step in full (and
  // incident neighbourhoods, the window); the other steps' tensor statistics messages
  // were emptied (hollowed: envelope and step kept, no statistics).
  struct ThinNote {
    uint64_t first_step = 0, last_step = 0;
    uint32_t every = 0;
    uint64_t full_steps = 0;        // steps of the range still in full
    uint64_t dropped_messages = 0;  // StepStats messages emptied
  };
  const std::vector<ThinNote>& thinned() const { return thinned_; }
  // One line per contiguous thinned range ("steps 0-97999 thinned: every 100th step in
  // full, ..."), "" when nothing was.
  static std::string DescribeThinning(const std::vector<ThinNote>& notes);

  // Verifies a record's payload as an envelope (size cap, flatbuffers Verifier, file
  // identifier, schema major, run id): Corruption with the reason when it fails. The
  // pointer aliases `rec.data` and shares its lifetime.
  static StatusOr<const wire::Envelope*> Envelope(const Record& rec,
                                                  size_t max_bytes = kMaxMessageBytes);

 private:
  LogReader(std::string path, FILE* f);
  static StatusOr<FILE*> OpenOne(const std::string& path, uint16_t* major);
  Result Fail(Result r, std::string why);
  Result NextInFile(Record* rec);
  // At the end of the current file: opens the next file of the log. False when there is
  // none (yet).
  bool Advance();
  // Opens the open file "<run>.lslog" (or a segment that appeared before it).
  bool OpenNextOrHead();
  void SwitchTo(std::string path, FILE* f, uint16_t major);
  // The next record of the block being handed out (kEnd when it has none left).
  Result NextInBlock(Record* rec);
  Result ReadBlock(uint32_t len);

  std::string path_;
  FILE* file_ = nullptr;
  uint16_t major_ = 0;
  uint64_t offset_ = 0;
  uint64_t records_ = 0;
  uint64_t blocks_ = 0;
  std::vector<uint8_t> buf_;  // operator new storage: aligned for flatbuffers
  // The decompressed block being handed out: its records are copied into buf_ one at a
  // time (aligned); block_pos_ is the next one's start, block_end_ the file offset
  // after the block.
  std::vector<uint8_t> block_;
  size_t block_size_ = 0, block_pos_ = 0;
  uint64_t block_end_ = 0;
  std::string problem_;
  // Chain mode (Open): the open file's path, segments still to read, the highest
  // segment number seen, and whether the file being read is the open one.
  bool chain_ = false;
  std::string log_path_;
  std::vector<std::string> pending_;
  uint64_t last_segment_ = 0;
  bool at_head_ = false;
  std::vector<ThinNote> thinned_;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RUNLOG_LOG_READER_H_
