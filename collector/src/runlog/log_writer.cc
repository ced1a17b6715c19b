#include "runlog/log_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>
#include <zstd.h>

#include "runlog/crc32c.h"
#include "runlog/log_format.h"
#include "runlog/segments.h"

namespace lockstep::collector {
namespace {

Status Errno(const std::string& what, const std::string& path) {
  return Status::IOError(what + " run log '" + path + "': " + std::strerror(errno));
}

// write() all of it, retrying on EINTR and short writes.
bool WriteAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// zstd level 1: on a resnet18 bench run's log (7.3 MB), 256 KB blocks compress 3.2x
// at level 1 and 3.2x at level 3 (measured with the zstd tool), and level 1 costs the
// ingest thread about half the CPU.
constexpr int kZstdLevel = 1;

void FileHeader(uint8_t* h, uint16_t major) {
  std::memcpy(h, runlog::kMagic, 8);
  uint16_t minor = runlog::kFormatMinor;
  std::memcpy(h + 8, &major, 2);
  std::memcpy(h + 10, &minor, 2);
  uint32_t crc = crc32c::Value(h, 12);
  std::memcpy(h + 12, &crc, 4);
}

}  // namespace

StatusOr<LogWriter::Recovery> LogWriter::Recover(const std::string& path,
                                                 const RecordFn& on_record) {
  Recovery rec;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return rec;
    return Errno("cannot stat", path);
  }
  uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < runlog::kFileHeaderBytes) {
    // Torn while writing the header: nothing was ever recorded in it.
    if (file_size > 0) {
      spdlog::warn("run log '{}': torn header ({} bytes); starting it afresh", path, file_size);
      if (::truncate(path.c_str(), 0) != 0) return Errno("cannot truncate", path);
      rec.cut_bytes = file_size;
    }
    return rec;
  }
  auto reader = LogReader::OpenFile(path);  // only the open file: segments are closed
  if (!reader.ok()) return reader.status();
  LogReader::Record r;
  LogReader::Result res;
  while ((res = (*reader)->Next(&r)) == LogReader::Result::kRecord) {
    if (on_record) on_record(r);
  }
  rec.records = (*reader)->records();
  rec.valid_bytes = (*reader)->offset();
  if (res != LogReader::Result::kEnd) {
    rec.cut_bytes = file_size - rec.valid_bytes;
    spdlog::warn("{}; cutting the {} bytes from there, keeping {} good records",
                 (*reader)->problem(), rec.cut_bytes, rec.records);
    if (::truncate(path.c_str(), static_cast<off_t>(rec.valid_bytes)) != 0)
      return Errno("cannot cut the torn tail of", path);
  }
  return rec;
}

StatusOr<std::unique_ptr<LogWriter>> LogWriter::Open(const std::string& path, bool recover,
                                                     size_t buffer_bytes, bool compress) {
  if (recover) {
    auto r = Recover(path, nullptr);
    if (!r.ok()) return r.status();
  }
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);  // R: the header
  if (fd < 0) return Errno("cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = Errno("cannot stat", path);
    ::close(fd);
    return s;
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {
    uint8_t h[runlog::kFileHeaderBytes];
    FileHeader(h, compress ? runlog::kFormatMajor : runlog::kFormatMajorPlain);
    if (!WriteAll(fd, h, sizeof h)) {
      Status s = Errno("cannot write the header of", path);
      ::close(fd);
      return s;
    }
    size = sizeof h;
  } else if (compress) {
    // An existing log keeps its format: blocks only in a format 2 one.
    uint8_t h[runlog::kFileHeaderBytes];
    uint16_t major = 0;
    if (::pread(fd, h, sizeof h, 0) == static_cast<ssize_t>(sizeof h)) std::memcpy(&major, h + 8, 2);
    compress = major == runlog::kFormatMajor;
  }
  auto w = std::unique_ptr<LogWriter>(new LogWriter(path, fd, size, buffer_bytes, compress));
  auto segs = runlog::ListSegments(path);
  if (!segs.empty()) w->last_segment_ = segs.back().number;
  return w;
}

// fsync of the directory holding `path`, so that a rename in it survives a power loss.
static Status SyncDirOf(const std::string& path) {
  std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
  if (dir.empty()) dir = path.find('/') == 0 ? "/" : ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Errno("cannot open the directory of", path);
  const int rc = ::fsync(dfd);
  ::close(dfd);
  if (rc != 0) return Errno("cannot fsync the directory of", path);
  return Status::OK();
}

Status LogWriter::OpenHead() {
  int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot open", path_);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = Errno("cannot stat", path_);
    ::close(fd);
    return s;
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {
    uint8_t h[runlog::kFileHeaderBytes];
    FileHeader(h, cctx_ != nullptr ? runlog::kFormatMajor : runlog::kFormatMajorPlain);
    if (!WriteAll(fd, h, sizeof h)) {
      Status s = Errno("cannot write the header of", path_);
      ::close(fd);
      return s;
    }
    size = sizeof h;
  }
  fd_ = fd;
  size_ = size;
  return Status::OK();
}

// The order makes a kill at any point safe: the file is synced before it is named a
// segment (a closed segment is complete), and the rename is atomic (the records are
// under one of the two names, never both, never neither). Killed after the rename and
// before the new open file exists, the log is its segments alone: readers and the
// next collector's start-up accept that (segments.h ListRunLogs).
Status LogWriter::Rotate() {
  if (::fdatasync(fd_) != 0) return Errno("cannot fsync", path_);
  const std::string seg = runlog::SegmentPathFor(path_, last_segment_ + 1);
  if (::rename(path_.c_str(), seg.c_str()) != 0) return Errno("cannot rename into a segment", path_);
  ++last_segment_;
  ::close(fd_);
  fd_ = -1;
  size_ = 0;
  dirty_ = false;
  Status s = SyncDirOf(path_);
  Status o = OpenHead();  // on failure the next write tries again (WriteTail)
  return s.ok() ? o : s;
}

LogWriter::LogWriter(std::string path, int fd, uint64_t size, size_t buffer_bytes, bool compress)
    : path_(std::move(path)), fd_(fd), size_(size), buffer_bytes_(buffer_bytes) {
  buf_.reserve(buffer_bytes_ + runlog::kRecordHeaderBytes);
  if (compress) {
    cctx_ = ZSTD_createCCtx();  // nullptr (out of memory): plain records, still a good log
    if (cctx_ != nullptr) {
      ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, kZstdLevel);
      // Sized now for a full buffer, so that a flush does not allocate (the ingest
      // thread's steady state; only a record larger than the buffer grows it).
      zbuf_.resize(runlog::kRecordHeaderBytes + ZSTD_compressBound(buffer_bytes_ + runlog::kRecordHeaderBytes));
    }
  }
}

LogWriter::~LogWriter() {
  Status s = Sync();
  if (!s.ok()) spdlog::error("{}", s.message());
  if (fd_ >= 0) ::close(fd_);
  ZSTD_freeCCtx(cctx_);
}

Status LogWriter::Append(const uint8_t* payload, uint32_t n, int64_t recv_unix_ns) {
  if (n == 0 || n > runlog::kMaxRecordBytes)
    return Status::InvalidArgument("record of " + std::to_string(n) + " bytes for run log '" +
                                   path_ + "' is empty or too large");
  size_t need = runlog::kRecordHeaderBytes + n;
  if (!buf_.empty() && buf_.size() + need > buffer_bytes_) {
    Status s = Flush();
    if (!s.ok()) {
      ++lost_records_;  // this record too: it was never buffered
      return s;
    }
  }
  uint8_t h[runlog::kRecordHeaderBytes];
  std::memcpy(h, &n, 4);
  std::memcpy(h + 8, &recv_unix_ns, 8);
  uint32_t crc = crc32c::Extend(0, h, 4);
  crc = crc32c::Extend(crc, h + 8, 8);
  crc = crc32c::Extend(crc, payload, n);
  std::memcpy(h + 4, &crc, 4);
  if (buf_.empty()) first_recv_ = recv_unix_ns;
  raw_bytes_ += need;
  if (buf_.empty() && need > buffer_bytes_) {
    // Larger than the whole buffer: straight through, header and payload together so
    // a failure leaves at most a torn tail that the next open cuts.
    buf_.insert(buf_.end(), h, h + sizeof h);
    buf_.insert(buf_.end(), payload, payload + n);
    ++buffered_records_;
    return Flush();
  }
  buf_.insert(buf_.end(), h, h + sizeof h);
  buf_.insert(buf_.end(), payload, payload + n);
  ++buffered_records_;
  return Status::OK();
}

Status LogWriter::WriteTail(const uint8_t* p, size_t n) {
  if (fd_ < 0) LOCKSTEP_RETURN_IF_ERROR(OpenHead());
  if (!WriteAll(fd_, p, n)) {
    Status s = Errno("cannot append to", path_);
    // Cut whatever part of the batch made it, so the file ends on a record boundary
    // and later appends are not hidden behind a torn record.
    if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      // Left for the next open's recovery to cut.
    }
    return s;
  }
  size_ += n;
  written_bytes_ += n;
  return Status::OK();
}

Status LogWriter::Flush() {
  if (buf_.empty()) return Status::OK();
  Status s;
  size_t z = 0;
  if (cctx_ != nullptr) {
    const size_t bound = ZSTD_compressBound(buf_.size());
    if (zbuf_.size() < runlog::kRecordHeaderBytes + bound) zbuf_.resize(runlog::kRecordHeaderBytes + bound);
    z = ZSTD_compress2(cctx_, zbuf_.data() + runlog::kRecordHeaderBytes, bound, buf_.data(), buf_.size());
    // Not smaller, or a failure (which leaves the context ready for the next frame):
    // the records go as they are.
    if (ZSTD_isError(z) || z + runlog::kRecordHeaderBytes >= buf_.size() || z > runlog::kMaxRecordBytes) z = 0;
  }
  if (z > 0) {
    uint8_t* h = zbuf_.data();
    const uint32_t field = static_cast<uint32_t>(z) | runlog::kBlockFlag;
    std::memcpy(h, &field, 4);
    std::memcpy(h + 8, &first_recv_, 8);
    uint32_t crc = crc32c::Extend(0, h, 4);
    crc = crc32c::Extend(crc, h + 8, 8);
    crc = crc32c::Extend(crc, h + runlog::kRecordHeaderBytes, z);
    std::memcpy(h + 4, &crc, 4);
    s = WriteTail(zbuf_.data(), runlog::kRecordHeaderBytes + z);
  } else {
    s = WriteTail(buf_.data(), buf_.size());
  }
  buf_.clear();
  if (!s.ok()) {
    lost_records_ += buffered_records_;
    buffered_records_ = 0;
    return s;
  }
  buffered_records_ = 0;
  dirty_ = true;
  if (segment_bytes_ > 0 && size_ >= segment_bytes_) {
    // The records are written: a failed rotation only leaves the open file longer.
    Status r = Rotate();
    if (!r.ok()) spdlog::warn("{}; the run log goes on in one file", r.message());
  }
  return Status::OK();
}

Status LogWriter::AppendNote(const uint8_t* note, uint32_t n) {
  LOCKSTEP_RETURN_IF_ERROR(Flush());
  uint8_t h[runlog::kRecordHeaderBytes] = {};
  const uint32_t field = runlog::kNoteFlag | n;
  std::memcpy(h, &field, 4);
  uint32_t crc = crc32c::Extend(0, h, 4);
  crc = crc32c::Extend(crc, h + 8, 8);
  crc = crc32c::Extend(crc, note, n);
  std::memcpy(h + 4, &crc, 4);
  std::vector<uint8_t> all(h, h + sizeof h);
  all.insert(all.end(), note, note + n);
  LOCKSTEP_RETURN_IF_ERROR(WriteTail(all.data(), all.size()));
  dirty_ = true;
  return Status::OK();
}

Status LogWriter::Sync() {
  LOCKSTEP_RETURN_IF_ERROR(Flush());
  if (!dirty_ || fd_ < 0) return Status::OK();
  if (::fdatasync(fd_) != 0) return Errno("cannot fsync", path_);
  dirty_ = false;
  return Status::OK();
}

}  // namespace lockstep::collector
