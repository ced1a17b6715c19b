// Helpers shared by the fuzz targets (docs/fuzzing.md): an aligned copy of the input,
// an in-memory file with a path, and a splitter of one input into several frames.
// Header-only; each fuzzer is single-threaded.
#ifndef LOCKSTEP_TESTS_FUZZ_FUZZ_COMMON_H_
#define LOCKSTEP_TESTS_FUZZ_FUZZ_COMMON_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

namespace lockstep::fuzz {

// The code under test logs every torn tail and late record; at thousands of inputs a
// second that would be the fuzzer's whole output (and most of its time).
inline void Quiet() { spdlog::set_level(spdlog::level::off); }

// The collector hands flatbuffers an 8-byte-aligned copy (Collector::Impl::Handle);
// libFuzzer's buffer has no such promise. operator new's storage is aligned.
class AlignedBytes {
 public:
  AlignedBytes(const uint8_t* data, size_t size) : buf_(size) {
    if (size > 0) std::memcpy(buf_.data(), data, size);
  }
  const uint8_t* data() const { return buf_.data(); }
  size_t size() const { return buf_.size(); }

 private:
  std::vector<uint8_t> buf_;
};

// A file that lives in memory (memfd) but has a path, for code that opens, stats and
// truncates by path (LogReader, LogWriter::Recover). Nothing lands on disk, and nothing
// is left behind when a fuzzer is killed.
class MemFile {
 public:
  MemFile() {
    fd_ = ::memfd_create("lockstep-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();  // the harness itself is broken: no point fuzzing
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  // Replaces the contents with `data`.
  void Set(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, data, size, 0) != static_cast<ssize_t>(size)) {
      std::perror("memfd write");
      std::abort();
    }
  }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Splits an input into frames: each frame is a little-endian u32 length and that many
// bytes; a length past the end takes what is left. Lets one input be a sequence of
// messages (a session) while plain mutations of the bytes still make sense.
inline std::vector<std::vector<uint8_t>> SplitFrames(const uint8_t* data, size_t size,
                                                     size_t max_frames) {
  std::vector<std::vector<uint8_t>> frames;
  size_t pos = 0;
  while (pos + 4 <= size && frames.size() < max_frames) {
    uint32_t len;
    std::memcpy(&len, data + pos, 4);
    pos += 4;
    size_t n = std::min<size_t>(len, size - pos);
    frames.emplace_back(data + pos, data + pos + n);
    pos += n;
  }
  return frames;
}

// Appends one frame in SplitFrames' format (the seed generator writes sessions so).
inline void AppendFrame(std::vector<uint8_t>* out, const uint8_t* data, size_t size) {
  uint32_t len = static_cast<uint32_t>(size);
  const auto* p = reinterpret_cast<const uint8_t*>(&len);
  out->insert(out->end(), p, p + 4);
  out->insert(out->end(), data, data + size);
}

// A harness invariant was broken: print why and abort, so libFuzzer saves the input.
[[noreturn]] inline void Fail(const std::string& why) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", why.c_str());
  std::abort();
}

}  // namespace lockstep::fuzz

#endif  // LOCKSTEP_TESTS_FUZZ_FUZZ_COMMON_H_
