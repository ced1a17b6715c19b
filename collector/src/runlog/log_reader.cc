#include "runlog/log_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <zstd.h>

#include "lockstep/common/envelope_check.h"
#include "runlog/crc32c.h"
#include "runlog/log_format.h"
#include "runlog/segments.h"

namespace lockstep::collector {
namespace {

uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// "'DIR' is a directory, not a run log: give one of its run logs, e.g. DIR/a.lslog, ..."
std::string DirectoryMessage(const std::string& path) {
  std::vector<std::string> logs;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".lslog") logs.push_back(it->path().string());
  std::sort(logs.begin(), logs.end());
  std::string msg = "'" + path + "' is a directory, not a run log: ";
  if (logs.empty()) return msg + "give a .lslog file written by 'lockstep collect' (it holds none)";
  msg += "give one of its run logs, e.g. " + logs[0];
  for (size_t i = 1; i < logs.size() && i < 3; ++i) msg += ", " + logs[i];
  if (logs.size() > 3) msg += " (" + std::to_string(logs.size()) + " in all)";
  return msg;
}

}  // namespace

StatusOr<FILE*> LogReader::OpenOne(const std::string& path, uint16_t* major_out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    int e = errno;
    std::string msg = "cannot open run log '" + path + "': " + std::strerror(e);
    if (e == ENOENT) return Status::NotFound(msg);
    return Status::IOError(msg);
  }
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::fclose(f);
    return Status::InvalidArgument(DirectoryMessage(path));
  }
  // Large stdio buffer: records are read with two small freads each.
  std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
  uint8_t h[runlog::kFileHeaderBytes];
  size_t got = std::fread(h, 1, sizeof h, f);
  if (got != sizeof h || std::memcmp(h, runlog::kMagic, sizeof runlog::kMagic) != 0 ||
      crc32c::Value(h, 12) != Load32(h + 12)) {
    std::fclose(f);
    if (got == 0) return Status::Corruption("run log '" + path + "' is empty (no header)");
    return Status::Corruption("'" + path +
                              "' is not a lockstep run log (bad header); pass a .lslog file "
                              "written by 'lockstep collect'");
  }
  uint16_t major;
  std::memcpy(&major, h + 8, 2);
  if (major != runlog::kFormatMajor && major != runlog::kFormatMajorPlain) {
    std::fclose(f);
    return Status::Corruption("run log '" + path + "' has format version " +
                              std::to_string(major) + ", this lockstep reads version " +
                              std::to_string(runlog::kFormatMajor) +
                              ": use the lockstep that wrote it");
  }
  *major_out = major;
  return f;
}

StatusOr<std::unique_ptr<LogReader>> LogReader::OpenFile(const std::string& path) {
  uint16_t major = 0;
  auto f = OpenOne(path, &major);
  if (!f.ok()) return f.status();
  auto r = std::unique_ptr<LogReader>(new LogReader(path, *f));
  r->major_ = major;
  r->offset_ = runlog::kFileHeaderBytes;
  return r;
}

StatusOr<std::unique_ptr<LogReader>> LogReader::Open(const std::string& path) {
  std::vector<runlog::Segment> segs = runlog::ListSegments(path);
  const std::string first = segs.empty() ? path : segs.front().path;
  auto r = OpenFile(first);
  if (!r.ok()) {
    // The open file missing while segments exist: a collector killed while it rotated.
    return r.status();
  }
  (*r)->chain_ = true;
  (*r)->log_path_ = path;
  (*r)->at_head_ = segs.empty();
  for (size_t i = 1; i < segs.size(); ++i) (*r)->pending_.push_back(segs[i].path);
  (*r)->last_segment_ = segs.empty() ? 0 : segs.back().number;
  if (!segs.empty()) (*r)->pending_.push_back(path);
  return r;
}

LogReader::LogReader(std::string path, FILE* f) : path_(std::move(path)), file_(f) {}

LogReader::~LogReader() {
  if (file_ != nullptr) std::fclose(file_);
}

LogReader::Result LogReader::Fail(Result r, std::string why) {
  problem_ = "run log '" + path_ + "': " + why + " at byte " + std::to_string(offset_);
  // Rewind to the record start so a retry (a live log growing) starts over cleanly.
  std::clearerr(file_);
  std::fseek(file_, static_cast<long>(offset_), SEEK_SET);
  return r;
}

void LogReader::SwitchTo(std::string path, FILE* f, uint16_t major) {
  std::fclose(file_);
  file_ = f;
  path_ = std::move(path);
  major_ = major;
  offset_ = runlog::kFileHeaderBytes;
  block_size_ = block_pos_ = 0;
}

bool LogReader::OpenNextOrHead() {
  while (!pending_.empty()) {
    // About to open the open file: a rotation since the listing put segments before it.
    if (pending_.size() == 1 && pending_.front() == log_path_) {
      auto more = runlog::ListSegments(log_path_, last_segment_);
      if (!more.empty()) {
        pending_.clear();
        for (auto& sg : more) pending_.push_back(sg.path);
        pending_.push_back(log_path_);
        last_segment_ = more.back().number;
      }
    }
    const std::string next = pending_.front();
    uint16_t major = 0;
    auto f = OpenOne(next, &major);
    if (!f.ok()) {
      // A segment is never removed; the open file may be missing for a moment (the
      // rotation renames it before creating the next one): retried at the next Next().
      if (next == log_path_) return false;
      pending_.erase(pending_.begin());
      continue;
    }
    pending_.erase(pending_.begin());
    SwitchTo(next, *f, major);
    at_head_ = next == log_path_;
    if (at_head_) {
      // Opened the open file: a rotation between the listing and the open would hide the
      // segment it made behind it, so list once more (that segment is not this file).
      struct stat mine;
      if (::fstat(::fileno(file_), &mine) == 0) {
        auto more = runlog::ListSegments(log_path_, last_segment_);
        std::vector<std::string> before;
        for (auto& sg : more) {
          struct stat st;
          last_segment_ = sg.number;
          if (::stat(sg.path.c_str(), &st) == 0 && st.st_ino == mine.st_ino && st.st_dev == mine.st_dev)
            continue;
          before.push_back(sg.path);
        }
        if (!before.empty()) {
          before.push_back(log_path_);
          pending_ = std::move(before);
          return OpenNextOrHead();
        }
      }
    }
    return true;
  }
  return false;
}

bool LogReader::Advance() {
  if (!chain_) return false;
  if (!at_head_) return OpenNextOrHead();
  // At the end of the open file: has the collector renamed it into a segment?
  struct stat mine, now;
  if (::fstat(::fileno(file_), &mine) != 0) return false;
  if (::stat(log_path_.c_str(), &now) == 0 && now.st_ino == mine.st_ino && now.st_dev == mine.st_dev)
    return false;  // still the open file: nothing more yet
  auto more = runlog::ListSegments(log_path_, last_segment_);
  bool found = false;
  for (auto& sg : more) {
    struct stat st;
    last_segment_ = sg.number;
    if (!found && ::stat(sg.path.c_str(), &st) == 0 && st.st_ino == mine.st_ino && st.st_dev == mine.st_dev) {
      found = true;  // this file, now closed
      continue;
    }
    pending_.push_back(sg.path);
  }
  if (!found && more.empty() && ::stat(log_path_.c_str(), &now) != 0) return false;
  pending_.push_back(log_path_);
  at_head_ = false;
  return OpenNextOrHead();
}

LogReader::Result LogReader::Next(Record* rec) {
  for (;;) {
    Result r = NextInFile(rec);
    if (r != Result::kEnd) return r;
    if (at_head_ && chain_) {
      // The rename comes after the rotated file's last write: once it is seen, what
      // this file holds is complete, so read it to its end before leaving it.
      struct stat mine, now;
      if (::fstat(::fileno(file_), &mine) != 0) return r;
      if (::stat(log_path_.c_str(), &now) == 0 && now.st_ino == mine.st_ino && now.st_dev == mine.st_dev)
        return r;
      Result again = NextInFile(rec);
      if (again != Result::kEnd) return again;
    }
    if (!Advance()) return Result::kEnd;
  }
}

LogReader::Result LogReader::NextInFile(Record* rec) {
  if (block_size_ > 0) {
    Result r = NextInBlock(rec);
    if (r != Result::kEnd) return r;
    offset_ = block_end_;  // every record of the block is out: the next read is past it
  }
  uint8_t h[runlog::kRecordHeaderBytes];
  uint32_t len = 0, want_crc = 0;
  // Thinning notes are collected, not handed out: read on to the next record (a loop,
  // not a recursion: a file of notes must not exhaust the stack).
  for (;;) {
    size_t got = std::fread(h, 1, sizeof h, file_);
    if (got == 0 && std::feof(file_)) {
      std::clearerr(file_);  // allow a later retry when the file grows
      return Result::kEnd;
    }
    if (got != sizeof h) return Fail(Result::kTruncated, "torn record header");
    len = Load32(h);
    want_crc = Load32(h + 4);
    if ((len & ~runlog::kBlockFlag) != (runlog::kNoteFlag | runlog::kThinNoteBytes)) break;
    {
      uint8_t note[runlog::kThinNoteBytes];
      if (std::fread(note, 1, sizeof note, file_) != sizeof note)
        return Fail(Result::kTruncated, "torn thinning note");
      uint32_t crc = crc32c::Extend(0, h, 4);
      crc = crc32c::Extend(crc, h + 8, 8);
      crc = crc32c::Extend(crc, note, sizeof note);
      if (crc != want_crc) return Fail(Result::kCorrupt, "checksum mismatch in a thinning note");
      ThinNote t;
      std::memcpy(&t.first_step, note, 8);
      std::memcpy(&t.last_step, note + 8, 8);
      std::memcpy(&t.every, note + 16, 4);
      std::memcpy(&t.full_steps, note + 24, 8);
      std::memcpy(&t.dropped_messages, note + 32, 8);
      // A segment holds one note: many are a damaged or hostile file, kept bounded.
      if (thinned_.size() < 65536) thinned_.push_back(t);
      offset_ += sizeof h + sizeof note;
    }
  }
  const bool block = (len & runlog::kBlockFlag) != 0 && major_ != runlog::kFormatMajorPlain;
  if (block) len &= ~runlog::kBlockFlag;
  if (len == 0 || len > runlog::kMaxRecordBytes)
    return Fail(Result::kCorrupt, "absurd record length " + std::to_string(len));
  if (buf_.size() < len) {
    // Grow only for a record the file really holds: a flipped bit in a length field
    // must not cost up to kMaxRecordBytes of memory for a small torn file (found by
    // fuzz_runlog). Asked only when the buffer must grow, so not once per record.
    struct stat st;
    if (::fstat(::fileno(file_), &st) == 0 &&
        offset_ + sizeof h + len > static_cast<uint64_t>(st.st_size))
      return Fail(Result::kTruncated, "torn record (file ends inside it)");
    buf_.resize(len);
  }
  if (std::fread(buf_.data(), 1, len, file_) != len)
    return Fail(Result::kTruncated, "torn record (file ends inside it)");
  uint32_t crc = crc32c::Extend(0, h, 4);
  crc = crc32c::Extend(crc, h + 8, 8);
  crc = crc32c::Extend(crc, buf_.data(), len);
  if (crc != want_crc) return Fail(Result::kCorrupt, "checksum mismatch");
  if (block) return ReadBlock(len) == Result::kRecord ? NextInFile(rec) : Result::kCorrupt;
  rec->data = buf_.data();
  rec->size = len;
  std::memcpy(&rec->recv_unix_ns, h + 8, 8);
  rec->offset = offset_;
  offset_ += sizeof h + len;
  ++records_;
  return Result::kRecord;
}

// buf_ holds a block's checked zstd frame of `len` bytes: decompressed into block_,
// whose records Next() then hands out. kCorrupt (via Fail) when it does not decompress.
LogReader::Result LogReader::ReadBlock(uint32_t len) {
  const unsigned long long content = ZSTD_getFrameContentSize(buf_.data(), len);
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN ||
      content == 0 || content > runlog::kMaxBlockContentBytes)
    return Fail(Result::kCorrupt, "compressed block of a bad size");
  if (block_.size() < content) block_.resize(content);
  const size_t n = ZSTD_decompress(block_.data(), content, buf_.data(), len);
  if (ZSTD_isError(n) || n != content)
    return Fail(Result::kCorrupt, std::string("compressed block that does not decompress (") +
                                      (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short") + ")");
  // All or nothing: every record inside is checked before the first is handed out, so a
  // bad one cuts the whole block (what a writer recovering the file cuts too). The
  // block's checksum held, so a bad record here is a writer's or decompressor's bug.
  for (size_t pos = 0; pos < n;) {
    const uint8_t* r = block_.data() + pos;
    const uint32_t rlen = n - pos >= runlog::kRecordHeaderBytes ? Load32(r) : 0;
    if (rlen == 0 || rlen > runlog::kMaxRecordBytes || rlen > n - pos - runlog::kRecordHeaderBytes)
      return Fail(Result::kCorrupt, "bad record inside a compressed block");
    uint32_t crc = crc32c::Extend(0, r, 4);
    crc = crc32c::Extend(crc, r + 8, 8);
    crc = crc32c::Extend(crc, r + runlog::kRecordHeaderBytes, rlen);
    if (crc != Load32(r + 4)) return Fail(Result::kCorrupt, "checksum mismatch inside a compressed block");
    pos += runlog::kRecordHeaderBytes + rlen;
  }
  block_size_ = n;
  block_pos_ = 0;
  block_end_ = offset_ + runlog::kRecordHeaderBytes + len;
  ++blocks_;
  return Result::kRecord;
}

LogReader::Result LogReader::NextInBlock(Record* rec) {
  if (block_pos_ >= block_size_) {
    block_size_ = block_pos_ = 0;
    return Result::kEnd;
  }
  const uint8_t* h = block_.data() + block_pos_;  // checked whole by ReadBlock
  const uint32_t len = Load32(h);
  if (buf_.size() < len) buf_.resize(len);
  std::memcpy(buf_.data(), h + runlog::kRecordHeaderBytes, len);
  rec->data = buf_.data();
  rec->size = len;
  std::memcpy(&rec->recv_unix_ns, h + 8, 8);
  rec->offset = offset_;
  block_pos_ += runlog::kRecordHeaderBytes + len;
  ++records_;
  return Result::kRecord;
}

std::string LogReader::DescribeThinning(const std::vector<ThinNote>& notes) {
  // Contiguous ranges with the same rule are said once: a long run's log is many
  // segments, each with its note.
  std::vector<ThinNote> merged;
  for (const ThinNote& t : notes) {
    if (!merged.empty() && merged.back().every == t.every && t.first_step <= merged.back().last_step + 1 &&
        t.last_step + 1 >= merged.back().first_step) {
      ThinNote& m = merged.back();
      m.first_step = std::min(m.first_step, t.first_step);
      m.last_step = std::max(m.last_step, t.last_step);
      m.full_steps += t.full_steps;
      m.dropped_messages += t.dropped_messages;
      continue;
    }
    merged.push_back(t);
  }
  std::string out;
  for (const ThinNote& m : merged) {
    if (!out.empty()) out += "; ";
    out += "steps " + std::to_string(m.first_step) + "-" + std::to_string(m.last_step) +
           " thinned by retention: every " + std::to_string(m.every) +
           "th step and incident neighbourhoods in full (" + std::to_string(m.full_steps) +
           " steps), the others keep their scalars only (" + std::to_string(m.dropped_messages) +
           " statistics messages emptied)";
  }
  return out;
}

StatusOr<const wire::Envelope*> LogReader::Envelope(const Record& rec, size_t max_bytes) {
  EnvelopeCheck c = CheckEnvelope(rec.data, rec.size, max_bytes);
  if (c.reject != Reject::kNone)
    return Status::Corruption("record at byte " + std::to_string(rec.offset) + " holds " +
                              DescribeReject(c, rec.size, max_bytes));
  return c.env;
}

}  // namespace lockstep::collector
