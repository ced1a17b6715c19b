#include "runlog/log_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "runlog/crc32c.h"
#include "runlog/log_format.h"

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

void FileHeader(uint8_t* h) {
  std::memcpy(h, runlog::kMagic, 8);
  uint16_t major = runlog::kFormatMajor, minor = runlog::kFormatMinor;
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
  auto reader = LogReader::Open(path);
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
                                                     size_t buffer_bytes) {
  if (recover) {
    auto r = Recover(path, nullptr);
    if (!r.ok()) return r.status();
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
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
    FileHeader(h);
    if (!WriteAll(fd, h, sizeof h)) {
      Status s = Errno("cannot write the header of", path);
      ::close(fd);
      return s;
    }
    size = sizeof h;
  }
  return std::unique_ptr<LogWriter>(new LogWriter(path, fd, size, buffer_bytes));
}

LogWriter::LogWriter(std::string path, int fd, uint64_t size, size_t buffer_bytes)
    : path_(std::move(path)), fd_(fd), size_(size), buffer_bytes_(buffer_bytes) {
  buf_.reserve(buffer_bytes_ + runlog::kRecordHeaderBytes);
}

LogWriter::~LogWriter() {
  Status s = Sync();
  if (!s.ok()) spdlog::error("{}", s.message());
  ::close(fd_);
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

Status LogWriter::Flush() {
  if (buf_.empty()) return Status::OK();
  if (!WriteAll(fd_, buf_.data(), buf_.size())) {
    Status s = Errno("cannot append to", path_);
    // Cut whatever part of the batch made it, so the file ends on a record boundary
    // and later appends are not hidden behind a torn record.
    if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      // Left for the next open's recovery to cut.
    }
    buf_.clear();
    lost_records_ += buffered_records_;
    buffered_records_ = 0;
    return s;
  }
  size_ += buf_.size();
  buf_.clear();
  buffered_records_ = 0;
  dirty_ = true;
  return Status::OK();
}

Status LogWriter::Sync() {
  LOCKSTEP_RETURN_IF_ERROR(Flush());
  if (!dirty_) return Status::OK();
  if (::fdatasync(fd_) != 0) return Errno("cannot fsync", path_);
  dirty_ = false;
  return Status::OK();
}

}  // namespace lockstep::collector
