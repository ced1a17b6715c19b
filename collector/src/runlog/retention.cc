#include "runlog/retention.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string_view>

#include "lockstep/common/thread_name.h"
#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_format.h"
#include "runlog/log_reader.h"
#include "runlog/log_writer.h"
#include "runlog/segments.h"

namespace lockstep::collector {
namespace {

namespace fs = std::filesystem;
constexpr std::string_view kThinSuffix = ".thin";
constexpr std::string_view kKeepFile = "retention.keep";

// The step a message is about, when it has one.
bool StepOf(const wire::Envelope& e, uint64_t* step) {
  switch (e.body_type()) {
    case wire::Body::StepStats:
      *step = e.body_as_StepStats()->step();
      return true;
    case wire::Body::StepScalars:
      *step = e.body_as_StepScalars()->step();
      return true;
    case wire::Body::StepEnd:
      *step = e.body_as_StepEnd()->step();
      return true;
    default:
      return false;
  }
}

// The message of a thinned step's statistics, hollowed: the same envelope (run, rank,
// seq, session, times) and step, no statistics. Kept in place of the message so that the
// sequence numbers stay whole (the registry and `inspect --summary` count no gap) and a
// reader still sees which messages the step had. Aliases *fbb until its next use.
std::pair<const uint8_t*, uint32_t> Hollow(const wire::Envelope& e, flatbuffers::FlatBufferBuilder* fbb) {
  fbb->Clear();
  const auto* ss = e.body_as_StepStats();
  auto body = wire::CreateStepStats(*fbb, ss->step(), 0, ss->sketch_k(), 0, ss->hist_bins(), 0);
  auto run = fbb->CreateString(e.run_id() ? e.run_id()->string_view() : std::string_view());
  wire::EnvelopeBuilder b(*fbb);
  b.add_schema_major(e.schema_major());
  b.add_schema_minor(e.schema_minor());
  b.add_run_id(run);
  b.add_rank(e.rank());
  b.add_seq(e.seq());
  b.add_sent_unix_ns(e.sent_unix_ns());
  b.add_session(e.session());
  b.add_body_type(wire::Body::StepStats);
  b.add_body(body.Union());
  fbb->Finish(b.Finish(), wire::EnvelopeIdentifier());
  return {fbb->GetBufferPointer(), static_cast<uint32_t>(fbb->GetSize())};
}

Status SyncDir(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return Status::IOError("cannot open the data dir '" + dir + "': " + std::strerror(errno));
  const int rc = ::fsync(dfd);
  const int e = errno;
  ::close(dfd);
  if (rc != 0)
    return Status::IOError("cannot fsync the data dir '" + dir + "': " + std::strerror(e));
  return Status::OK();
}

// A test hook: LOCKSTEP_TEST_RETENTION_PAUSE_MS sleeps this long with a segment's
// ".thin" file half written, so a test can kill the collector in the middle of a
// compaction (tests/scenarios/test_retention.py). Unset: 0.
int64_t TestPauseMs() {
  const char* v = std::getenv("LOCKSTEP_TEST_RETENTION_PAUSE_MS");
  return v ? std::atoll(v) : 0;
}

// One line of retention.keep: "FIRST LAST EXPERIMENT" (the experiment may hold spaces).
bool ParseKeepLine(const std::string& line, uint64_t* first, uint64_t* last,
                   std::string_view* experiment) {
  const auto s1 = line.find(' ');
  const auto s2 = s1 == std::string::npos ? s1 : line.find(' ', s1 + 1);
  if (s2 == std::string::npos) return false;
  *first = std::strtoull(line.c_str(), nullptr, 10);
  *last = std::strtoull(line.c_str() + s1 + 1, nullptr, 10);
  *experiment = std::string_view(line).substr(s2 + 1);
  return *first <= *last;
}

// Adds [first, last] to sorted, disjoint, non-adjacent `ranges`, merging what it touches.
void MergeRange(std::vector<std::pair<uint64_t, uint64_t>>* ranges, uint64_t first,
                uint64_t last) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  out.reserve(ranges->size() + 1);
  bool placed = false;
  for (const auto& [a, b] : *ranges) {
    if (b != UINT64_MAX && b + 1 < first) {
      out.emplace_back(a, b);  // wholly before
    } else if (last != UINT64_MAX && last + 1 < a) {
      if (!placed) out.emplace_back(first, last);
      placed = true;
      out.emplace_back(a, b);  // wholly after
    } else {
      first = std::min(first, a);  // touches: absorbed
      last = std::max(last, b);
    }
  }
  if (!placed) out.emplace_back(first, last);
  *ranges = std::move(out);
}

}  // namespace

Retention::Retention(RetentionOptions options) : opt_(std::move(options)) {
  if (opt_.thin_every == 0) opt_.thin_every = 1;
  // What a collector before this one noted: not appended again when the restart's
  // replay raises the same alerts, and counted in IncidentSteps().
  std::ifstream in(opt_.data_dir + "/" + std::string(kKeepFile));
  std::string line;
  MutexLock l(&mu_);
  while (std::getline(in, line)) {
    uint64_t first = 0, last = 0;
    std::string_view experiment;
    if (ParseKeepLine(line, &first, &last, &experiment))
      MergeRange(&noted_[std::string(experiment)], first, last);
  }
}

Retention::~Retention() { Shutdown(); }

void Retention::KeepSteps(const std::string& experiment, uint64_t first, uint64_t last) {
  if (last < first || experiment.find('\n') != std::string::npos) return;
  MutexLock l(&mu_);
  auto& ranges = noted_[experiment];
  for (auto& [a, b] : ranges) {
    if (a <= first && last <= b) return;  // already kept
  }
  // An incident alerting step after step adds a line per new step; the file is read
  // only at compactions, and its lines are a few bytes each.
  const std::string path = opt_.data_dir + "/" + std::string(kKeepFile);
  const std::string line =
      std::to_string(first) + " " + std::to_string(last) + " " + experiment + "\n";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;  // not noted: an alert at a later step of the incident tries again
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (ok) MergeRange(&ranges, first, last);
}

std::vector<std::pair<uint64_t, uint64_t>> Retention::KeepRanges(const std::string& experiment) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  std::ifstream in(opt_.data_dir + "/" + std::string(kKeepFile));
  std::string line;
  while (std::getline(in, line)) {
    uint64_t first = 0, last = 0;
    std::string_view e;
    if (ParseKeepLine(line, &first, &last, &e) && e == experiment) out.emplace_back(first, last);
  }
  return out;
}

StatusOr<Retention::SegmentInfo> Retention::Inspect(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return Status::NotFound("segment '" + path + "': " + std::strerror(errno));
  const int64_t mtime =
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  auto it = info_.find(path);
  if (it != info_.end() && it->second.size == static_cast<uint64_t>(st.st_size) &&
      it->second.mtime_ns == mtime)
    return it->second;
  auto r = LogReader::OpenFile(path);
  if (!r.ok()) return r.status();
  SegmentInfo si;
  si.size = static_cast<uint64_t>(st.st_size);
  si.mtime_ns = mtime;
  LogReader::Record rec;
  while ((*r)->Next(&rec) == LogReader::Result::kRecord) {
    auto env = LogReader::Envelope(rec);
    uint64_t step = 0;
    if (env.ok() && (*env)->body_type() == wire::Body::Hello) {
      const auto* h = (*env)->body_as_Hello();
      if (h->role() == wire::Role::Baseline) si.baseline = true;
      if (si.experiment.empty() && h->experiment()) si.experiment = h->experiment()->str();
    }
    if (!env.ok() || !StepOf(**env, &step)) continue;
    si.first_step = si.has_steps ? std::min(si.first_step, step) : step;
    si.max_step = si.has_steps ? std::max(si.max_step, step) : step;
    si.has_steps = true;
  }
  si.thinned = !(*r)->thinned().empty();
  info_[path] = si;
  return si;
}

Status Retention::Thin(const std::string& experiment, const std::string& path, uint64_t* saved) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto keep = KeepRanges(experiment);
  auto in_keep = [&](uint64_t s) {
    for (const auto& [a, b] : keep)
      if (a <= s && s <= b) return true;
    return false;
  };
  auto reader = LogReader::OpenFile(path);
  if (!reader.ok()) return reader.status();
  const std::string tmp = path + std::string(kThinSuffix);
  ::unlink(tmp.c_str());
  auto w = LogWriter::Open(tmp, /*recover=*/false, 1 << 20,
                           (*reader)->format_major() == runlog::kFormatMajor);
  if (!w.ok()) return w.status();
  LogWriter& out = **w;
  LogReader::Record rec;
  LogReader::Result res;
  uint64_t first = UINT64_MAX, last = 0, dropped = 0, n = 0;
  std::set<uint64_t> full;
  flatbuffers::FlatBufferBuilder fbb(512);
  const int64_t pause_ms = TestPauseMs();
  Status s;
  while ((res = (*reader)->Next(&rec)) == LogReader::Result::kRecord) {
    auto env = LogReader::Envelope(rec);
    uint64_t step = 0;
    if (env.ok() && StepOf(**env, &step)) {
      first = std::min(first, step);
      last = std::max(last, step);
      if ((*env)->body_type() == wire::Body::StepStats) {
        if (step % opt_.thin_every != 0 && !in_keep(step)) {
          ++dropped;
          const auto hollow = Hollow(**env, &fbb);
          s = out.Append(hollow.first, hollow.second, rec.recv_unix_ns);
          if (!s.ok()) break;
          continue;
        }
        full.insert(step);
      }
    }
    // A record that does not verify is kept as it is: retention drops only what it
    // understands.
    s = out.Append(rec.data, rec.size, rec.recv_unix_ns);
    if (!s.ok()) break;
    if (pause_ms > 0 && ++n == 10) {
      (void)out.Flush();
      spdlog::info("retention: test pause of {} ms inside {}", pause_ms, tmp);
      std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    }
  }
  if (s.ok() && res != LogReader::Result::kEnd)
    s = Status::Corruption((*reader)->problem() + "; the segment is left as it is");
  if (s.ok() && dropped == 0) {
    // Every step of it is kept in full (an incident's neighbourhood): not rewritten.
    // Remembered for this process; a restarted one reads it once more.
    w->reset();
    ::unlink(tmp.c_str());
    info_[path].thinned = true;
    *saved = 0;
    return Status::OK();
  }
  if (s.ok()) {
    uint8_t note[runlog::kThinNoteBytes] = {};
    if (first == UINT64_MAX) first = 0;
    const uint32_t every = static_cast<uint32_t>(std::min<uint64_t>(opt_.thin_every, UINT32_MAX));
    const uint64_t full_steps = full.size();
    std::memcpy(note, &first, 8);
    std::memcpy(note + 8, &last, 8);
    std::memcpy(note + 16, &every, 4);
    std::memcpy(note + 24, &full_steps, 8);
    std::memcpy(note + 32, &dropped, 8);
    s = out.AppendNote(note, sizeof note);
  }
  if (s.ok()) s = out.Sync();
  const uint64_t after = out.size();
  w->reset();  // closed before the rename
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    s = Status::IOError("cannot rename '" + tmp + "' over the segment: " + std::strerror(errno));
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  s = SyncDir(opt_.data_dir);
  const uint64_t before = info_[path].size;
  info_.erase(path);
  *saved = before > after ? before - after : 0;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    MutexLock l(&mu_);
    ++counters_.segments_thinned;
    counters_.bytes_before += before;
    counters_.bytes_after += after;
    counters_.bytes_reclaimed += *saved;
    counters_.messages_dropped += dropped;
    counters_.seconds += secs;
  }
  spdlog::info(
      "retention: thinned {} (steps {}-{}): {} -> {} bytes, {} tensor statistics messages emptied",
      path, first, last, before, after, dropped);
  return s;
}

bool Retention::PairTop(const std::string& experiment, const std::map<std::string, uint64_t>& newest,
                        uint64_t* top, uint64_t* stalled) {
  if (!opt_.pairs) return false;
  const std::vector<PairProgress> pairs = opt_.pairs(experiment);
  if (pairs.empty()) return false;
  // Past this many steps of its runs without a step compared, a pair has stopped: a
  // window and its margin again, so a pair that only paused (a job restarting from its
  // checkpoint, a slow read-back) is not let go.
  const uint64_t bound = 2 * opt_.retain_steps;
  bool any_live = false;
  uint64_t least = 0, lead_all = 0;
  for (const PairProgress& p : pairs) {
    uint64_t lead = 0;
    for (const std::string* run : {&p.baseline, &p.candidate}) {
      auto it = newest.find(*run);
      if (it != newest.end()) lead = std::max(lead, it->second);
    }
    lead_all = std::max(lead_all, lead);
    auto [it, fresh] = watch_.try_emplace({experiment, p.baseline, p.candidate});
    PairWatch& w = it->second;
    if (fresh || w.compared != p.compared) {
      if (w.stalled)
        spdlog::info("retention: the pair ({}, {}) of experiment '{}' compares again (step {}); it "
                     "holds its runs' window again",
                     p.baseline, p.candidate, experiment, p.compared);
      w = PairWatch{p.compared, lead, false};
    } else if (!w.stalled && lead > w.lead && lead - w.lead > bound) {
      w.stalled = true;
      spdlog::info("retention: the pair ({}, {}) of experiment '{}' compared nothing past step {} "
                   "while its runs wrote {} more steps; it no longer holds their window "
                   "(docs/runlog.md \"Segments and retention\")",
                   p.baseline, p.candidate, experiment, p.compared, lead - w.lead);
    }
    if (w.stalled) {
      ++*stalled;
      continue;
    }
    least = any_live ? std::min(least, p.compared) : p.compared;
    any_live = true;
  }
  // Every pair stopped: the newest step of their runs, so that the one still writing is
  // bounded and the runs of each pair are thinned alike.
  *top = any_live ? least : lead_all;
  return true;
}

Status Retention::CompactOnce() {
  const auto t0 = std::chrono::steady_clock::now();
  Status first_error;
  std::error_code ec;
  // Leftovers of a pass that was killed: the segments beside them are whole.
  for (fs::directory_iterator it(opt_.data_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > kThinSuffix.size() &&
        name.compare(name.size() - kThinSuffix.size(), kThinSuffix.size(), kThinSuffix) == 0 &&
        name.find(runlog::kLogSuffix) != std::string::npos) {
      std::error_code rm;
      fs::remove(it->path(), rm);
    }
  }
  struct Candidate {
    std::string experiment, path;
    int64_t mtime_ns;
    bool in_window;
  };
  std::vector<Candidate> todo;
  uint64_t total = 0;
  for (fs::directory_iterator it(opt_.data_dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code sz;
    if (it->path().filename().string().find(runlog::kLogSuffix) == std::string::npos) continue;
    const uint64_t b = it->file_size(sz);
    if (!sz) total += b;
  }
  struct RunView {
    std::string experiment;
    std::vector<std::pair<std::string, SegmentInfo>> infos;
    uint64_t newest = 0;
    bool baseline = false, any_steps = false;
  };
  std::map<std::string, RunView> runs;
  std::map<std::string, uint64_t> newest;  // of each run with steps in closed segments
  for (const std::string& run : runlog::ListRunLogs(opt_.data_dir)) {
    RunView& v = runs[run];
    for (const auto& sg : runlog::ListSegments(runlog::LogPathFor(opt_.data_dir, run))) {
      auto si = Inspect(sg.path);
      if (!si.ok()) continue;
      if (si->has_steps) v.newest = std::max(v.newest, si->max_step);
      v.any_steps |= si->has_steps;
      v.baseline |= si->baseline;
      if (v.experiment.empty()) v.experiment = si->experiment;
      v.infos.emplace_back(sg.path, *si);
    }
    if (v.any_steps) newest[run] = v.newest;
  }
  // Each experiment's top from its pairs, once a pass: (has pairs, top).
  std::map<std::string, std::pair<bool, uint64_t>> pair_tops;
  uint64_t stalled = 0;
  for (const auto& [run, v] : runs) {
    auto [it, fresh] = pair_tops.try_emplace(v.experiment);
    if (fresh) it->second.first = PairTop(v.experiment, newest, &it->second.second, &stalled);
    uint64_t top = v.newest;
    bool has_top = v.any_steps;
    if (it->second.first) {
      // Its pairs' top, whether or not this run is ahead of it or behind: the runs of an
      // experiment are thinned alike.
      top = it->second.second;
      has_top = true;
    } else if (v.baseline) {
      has_top = false;  // its candidate may still come
    }
    for (const auto& [path, si] : v.infos) {
      if (si.thinned) continue;
      const bool out_of_window = has_top && si.has_steps && top >= opt_.retain_steps &&
                                 si.max_step <= top - opt_.retain_steps;
      todo.push_back({v.experiment, path, si.mtime_ns, !out_of_window});
    }
  }
  // The window's rule first, then the disk limit: oldest first.
  std::sort(todo.begin(), todo.end(),
            [](const Candidate& a, const Candidate& b) { return a.mtime_ns < b.mtime_ns; });
  auto thin = [&](const Candidate& c) {
    uint64_t saved = 0;
    Status s = Thin(c.experiment, c.path, &saved);
    if (!s.ok()) {
      {
        MutexLock l(&mu_);
        ++counters_.failures;
      }
      spdlog::warn("retention: {}", s.message());
      if (opt_.on_alert)
        opt_.on_alert("compaction_failed", "cannot thin the run log segment " + c.path + ": " +
                                               s.message() +
                                               "; it is kept whole and retried later");
      if (first_error.ok()) first_error = s;
      return false;
    }
    total = total > saved ? total - saved : 0;
    return true;
  };
  // A failure (a full disk) ends the pass: the next one tries again, one alert a pass.
  bool failed = false;
  for (const auto& c : todo) {
    if (!c.in_window && !(failed = !thin(c))) continue;
    if (failed) break;
  }
  if (!failed && opt_.max_disk_bytes > 0 && total > opt_.max_disk_bytes) {
    for (const auto& c : todo) {
      if (total <= opt_.max_disk_bytes) break;
      if (c.in_window && !thin(c)) {
        failed = true;
        break;
      }
    }
    if (!failed && total > opt_.max_disk_bytes && !over_disk_alerted_) {
      over_disk_alerted_ = true;
      if (opt_.on_alert)
        opt_.on_alert("max_disk",
                      "the run logs in " + opt_.data_dir + " use " + std::to_string(total) +
                          " bytes, more than --max-disk " + std::to_string(opt_.max_disk_bytes) +
                          ", and every closed segment is thinned already; recording goes on");
    }
  }
  if (opt_.max_disk_bytes == 0 || total <= opt_.max_disk_bytes) over_disk_alerted_ = false;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MutexLock l(&mu_);
  ++counters_.passes;
  counters_.pass_seconds += secs;
  counters_.log_bytes = total;
  counters_.over_max_disk = opt_.max_disk_bytes > 0 && total > opt_.max_disk_bytes;
  counters_.stalled_pairs = stalled;
  return first_error;
}

void Retention::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Retention::Loop() {
  SetCurrentThreadName("ls-retention");
  for (;;) {
    {
      MutexLock l(&mu_);
      cv_.wait_for(l.native(), std::chrono::milliseconds(opt_.interval_ms), [this] {
        mu_.AssertHeld();
        return stop_;
      });
      if (stop_) return;
    }
    try {
      (void)CompactOnce();
    } catch (const std::exception& e) {
      spdlog::error("retention: {}", e.what());
    }
  }
}

void Retention::Shutdown() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

RetentionCounters Retention::counters() const {
  MutexLock l(&mu_);
  return counters_;
}

std::vector<std::pair<std::string, uint64_t>> Retention::IncidentSteps() const {
  MutexLock l(&mu_);
  std::vector<std::pair<std::string, uint64_t>> out;
  out.reserve(noted_.size());
  for (const auto& [experiment, ranges] : noted_) {
    uint64_t n = 0;
    for (const auto& [a, b] : ranges) n += b - a + 1;
    out.emplace_back(experiment, n);
  }
  return out;
}

}  // namespace lockstep::collector
