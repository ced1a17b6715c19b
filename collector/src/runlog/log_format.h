// On-disk layout of a run log (`<run>.lslog`); docs/runlog.md is the prose version.
//
//   file   := header (record | block)*
//   header := magic "LKSTPLOG" (8) | u16 format_major | u16 format_minor | u32 crc32c(first 12 bytes)
//   record := u32 length | u32 crc32c(length | recv_unix_ns | payload) | i64 recv_unix_ns | payload
//   block  := u32 (length | kBlockFlag) | u32 crc32c(that | recv_unix_ns | zstd) | i64 recv_unix_ns | zstd
//
// All integers little-endian. `payload` is one wire::Envelope exactly as received.
// `zstd` is one zstd frame whose content is a run of records (as above, each with its
// own checksum): what the writer had buffered at one flush. `recv_unix_ns` of a block is
// its first record's. Format 2 files may hold blocks and records; format 1 files (before
// compression, and what `--log-compression none` still writes) hold records only, and
// both are read. Records are not padded: readers copy the payload into an aligned
// buffer before handing it to flatbuffers.
#ifndef LOCKSTEP_COLLECTOR_RUNLOG_LOG_FORMAT_H_
#define LOCKSTEP_COLLECTOR_RUNLOG_LOG_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lockstep::collector::runlog {

inline constexpr char kMagic[8] = {'L', 'K', 'S', 'T', 'P', 'L', 'O', 'G'};
inline constexpr uint16_t kFormatMajor = 2;       // what a compressing writer creates
inline constexpr uint16_t kFormatMajorPlain = 1;  // records only; also read
inline constexpr uint16_t kFormatMinor = 0;
// Set in a block's length field (lengths are below 2^28: kMaxRecordBytes).
inline constexpr uint32_t kBlockFlag = 0x80000000u;
// A block decompresses to at most this: one flush of the writer's buffer, or one record
// larger than the buffer with its header.
inline constexpr uint64_t kMaxBlockContentBytes = (256ull << 20) + 16;
inline constexpr size_t kFileHeaderBytes = 16;
inline constexpr size_t kRecordHeaderBytes = 16;
// A record longer than this is "absurd": its length field is taken as corruption.
// Well above the wire cap (kMaxMessageBytes = 16 MiB) so --max-message-bytes can grow.
inline constexpr uint32_t kMaxRecordBytes = 256u << 20;
inline constexpr std::string_view kLogSuffix = ".lslog";

// Segments (docs/runlog.md "Segments and retention"): a collector started with a segment
// size closes the run's log when it outgrows it by renaming it to
// "<run>.lslog.<NNNNNN>" (six or more digits, numbered from 1) and starts a new
// "<run>.lslog". A run's log is its closed segments in number order, then the open one;
// readers read them as one log. A log without segments is one file, as before.
inline constexpr int kSegmentDigits = 6;
// A thinning note (a thinned segment's first entry, after the header): the length field
// holds kNoteFlag | the note's bytes; its checksum covers the length field, recv_unix_ns
// (0) and the note. The note's bytes: u64 first_step | u64 last_step | u32 every |
// u32 reserved (0) | u64 full_steps | u64 dropped_messages (kThinNoteBytes). Readers do
// not hand it out as a record; they collect it (LogReader::thinned()).
inline constexpr uint32_t kNoteFlag = 0x40000000u;
inline constexpr uint32_t kThinNoteBytes = 40;
inline constexpr std::string_view kKeepSuffix = ".keep";  // incident neighbourhoods

// "<log_path>.<NNNNNN>": the closed segment number `n` of the log at `log_path`.
inline std::string SegmentPathFor(const std::string& log_path, uint64_t n) {
  std::string digits = std::to_string(n);
  if (digits.size() < static_cast<size_t>(kSegmentDigits))
    digits.insert(0, static_cast<size_t>(kSegmentDigits) - digits.size(), '0');
  return log_path + "." + digits;
}

// "<data_dir>/<run_id>.lslog". The caller has checked IsValidRunId(run_id).
inline std::string LogPathFor(const std::string& data_dir, std::string_view run_id) {
  std::string p = data_dir;
  if (!p.empty() && p.back() != '/') p.push_back('/');
  p.append(run_id);
  p.append(kLogSuffix);
  return p;
}

}  // namespace lockstep::collector::runlog

#endif  // LOCKSTEP_COLLECTOR_RUNLOG_LOG_FORMAT_H_
