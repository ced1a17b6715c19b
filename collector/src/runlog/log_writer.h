// LogWriter: appends records to one run log (`<run>.lslog`, see log_format.h).
//
// Records go to an in-memory buffer; Flush() hands it to the kernel with one write(),
// Sync() also fdatasync()s. The ingest thread flushes whenever its socket runs dry and
// syncs on --fsync-interval-ms and at shutdown, so a process crash loses at most the
// messages of the current burst and a power loss at most one fsync period.
//
// Opening an existing log first scans it (Recover): a torn or corrupt tail is cut with
// one warning naming the file and offset; every record before it is kept.
//
// Compression (the default for a new log): each flush writes what was buffered as one
// zstd block (log_format.h), or as plain records when that is not smaller. A log of
// format 1 (plain records only, older lockstep) stays plain when appended to, so the
// lockstep that wrote it can still read it.
//
// Segments (log_format.h): with SetSegmentBytes(n), a flush that leaves the file at n
// bytes or more closes it: fdatasync, rename to "<run>.lslog.<NNNNNN>", fsync of the
// directory, and a new open file. Closed segments are never written again by the
// writer (retention may rewrite them: runlog/retention.h).
//
// Single-threaded: owned and called by the ingest thread only.
#ifndef LOCKSTEP_COLLECTOR_RUNLOG_LOG_WRITER_H_
#define LOCKSTEP_COLLECTOR_RUNLOG_LOG_WRITER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/common/status.h"
#include "runlog/log_format.h"
#include "runlog/log_reader.h"

struct ZSTD_CCtx_s;  // zstd.h's compression context (ZSTD_CCtx)

namespace lockstep::collector {

class LogWriter {
 public:
  struct Recovery {
    uint64_t records = 0;      // good records kept
    uint64_t valid_bytes = 0;  // file size after the cut
    uint64_t cut_bytes = 0;    // bytes removed from the tail (0 = clean)
  };
  // Called for each good record during a scan (registry rebuild at start-up).
  using RecordFn = std::function<void(const LogReader::Record&)>;

  // Scans an existing log, cuts a torn/corrupt tail (one spdlog warning) and reports
  // each good record to `on_record` (may be empty). A file shorter than the header is
  // reset to an empty log. Corruption when the file is not a run log (left untouched).
  static StatusOr<Recovery> Recover(const std::string& path, const RecordFn& on_record);

  // Opens `path` for appending, creating it with a header when missing. With
  // `recover` true an existing file is first scanned by Recover(); pass false only
  // when this process already recovered it. `buffer_bytes` is the flush threshold.
  // `compress` false: a new log is created in format 1 and holds plain records only.
  static StatusOr<std::unique_ptr<LogWriter>> Open(const std::string& path, bool recover,
                                                   size_t buffer_bytes = 256 << 10,
                                                   bool compress = true);
  ~LogWriter();  // Sync()s, best effort
  LogWriter(const LogWriter&) = delete;
  LogWriter& operator=(const LogWriter&) = delete;

  // Buffers one record; flushes first when the buffer would overflow. `n` must be in
  // 1..kMaxRecordBytes. On an I/O error (disk full) the buffered records are dropped,
  // counted in lost_records(), the file is cut back to its last record boundary, and
  // the error is returned; later appends may succeed.
  Status Append(const uint8_t* payload, uint32_t n, int64_t recv_unix_ns);
  Status Flush();
  Status Sync();  // Flush() + fdatasync()
  // Closes the file into a segment once it holds `bytes` (0 = never, the default).
  void SetSegmentBytes(uint64_t bytes) { segment_bytes_ = bytes; }
  // Writes a thinning note (log_format.h) after what was appended; retention only.
  Status AppendNote(const uint8_t* note, uint32_t n);

  uint64_t lost_records() const { return lost_records_; }
  bool has_buffered() const { return !buf_.empty(); }
  bool dirty() const { return dirty_; }  // written since the last Sync()
  uint64_t size() const { return size_ + buf_.size(); }  // bytes incl. buffered
  const std::string& path() const { return path_; }
  bool compressing() const { return cctx_ != nullptr; }
  // Bytes handed to Append() (with record headers) and bytes written for them.
  uint64_t raw_bytes() const { return raw_bytes_; }
  uint64_t written_bytes() const { return written_bytes_; }

 private:
  LogWriter(std::string path, int fd, uint64_t size, size_t buffer_bytes, bool compress);
  // Writes `n` bytes at the end of the file; on failure cuts the file back to size_.
  Status WriteTail(const uint8_t* p, size_t n);
  Status OpenHead();  // (re)creates the open file at path_ with its header
  Status Rotate();

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;  // bytes in the file (excludes buf_)
  size_t buffer_bytes_;
  std::vector<uint8_t> buf_;
  uint64_t buffered_records_ = 0;
  uint64_t lost_records_ = 0;
  bool dirty_ = false;
  ::ZSTD_CCtx_s* cctx_ = nullptr;  // set when this log gets compressed blocks
  std::vector<uint8_t> zbuf_;           // a block: its header, then the zstd frame
  int64_t first_recv_ = 0;              // of the first buffered record
  uint64_t raw_bytes_ = 0, written_bytes_ = 0;
  uint64_t segment_bytes_ = 0;
  uint64_t last_segment_ = 0;  // the highest segment number of this log
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RUNLOG_LOG_WRITER_H_
