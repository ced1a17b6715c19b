#include "runlog/log_replay.h"

#include <filesystem>
#include <memory>
#include <queue>
#include <vector>

#include <spdlog/spdlog.h>

#include "lockstep/common/envelope_check.h"
#include "runlog/log_format.h"
#include "runlog/log_reader.h"

namespace lockstep::collector {

StatusOr<ReplayStats> ReplayLogs(const std::string& data_dir, MessageSink* sink,
                                 const std::function<void(int64_t)>& tick, int64_t tick_ns) {
  namespace fs = std::filesystem;
  ReplayStats st;
  struct Source {
    std::unique_ptr<LogReader> reader;
    LogReader::Record rec;
  };
  std::vector<Source> sources;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(data_dir, ec)) {
    const fs::path& p = entry.path();
    std::error_code type_ec;  // not the listing's: an entry that cannot be stat-ed is skipped
    if (p.extension() != runlog::kLogSuffix || !entry.is_regular_file(type_ec)) continue;
    if (!IsValidRunId(p.stem().string())) continue;
    auto r = LogReader::Open(p.string());
    if (!r.ok()) {
      ++st.skipped;  // Rebuild() already said why
      continue;
    }
    sources.push_back(Source{std::move(*r), {}});
    ++st.runs;
  }
  if (ec) return Status::IOError("cannot list the data dir '" + data_dir + "': " + ec.message());

  // A min-heap of the sources by their current record's receive time; each source's
  // record stays valid until its own next Next().
  auto later = [&](size_t a, size_t b) {
    return sources[a].rec.recv_unix_ns > sources[b].rec.recv_unix_ns;
  };
  std::priority_queue<size_t, std::vector<size_t>, decltype(later)> heap(later);
  auto advance = [&](size_t i) {
    if (sources[i].reader->Next(&sources[i].rec) == LogReader::Result::kRecord) heap.push(i);
  };
  for (size_t i = 0; i < sources.size(); ++i) advance(i);
  int64_t last_tick = 0;
  while (!heap.empty()) {
    size_t i = heap.top();
    heap.pop();
    const LogReader::Record& rec = sources[i].rec;
    if (tick && rec.recv_unix_ns - last_tick >= tick_ns) {
      if (last_tick != 0) tick(rec.recv_unix_ns);
      last_tick = rec.recv_unix_ns;
    }
    auto env = LogReader::Envelope(rec);
    if (env.ok()) {
      sink->OnMessage(**env, rec.recv_unix_ns);
      ++st.messages;
      st.last_recv_unix_ns = std::max(st.last_recv_unix_ns, rec.recv_unix_ns);
    } else {
      ++st.skipped;
    }
    advance(i);
  }
  return st;
}

}  // namespace lockstep::collector
