// Aligner (aligner.h): the log-file side. A recorded baseline read on demand, a live
// run far ahead read back from its own log, a late joiner's own copy of the baseline.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <spdlog/spdlog.h>

#include "align/aligner.h"
#include "align/aligner_state.h"
#include "lockstep/common/wire.h"
#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_format.h"
#include "runlog/log_reader.h"

namespace lockstep::collector {

namespace {

// What ReadUntil did: whether `rank` closed a step, and, when the log is over, how it
// ended (kEnd, or the problem the reader names).
struct LogRead {
  bool closed = false;
  std::optional<LogReader::Result> end;
};

// Feeds `source`'s messages to `d` until `rank` has closed `step`. At the end of what is
// written it stops, to be retried, unless the log is `complete` (or the record there is
// corrupt): then the log is over.
LogRead ReadUntil(LogReader& source, RunDecoder& d, uint32_t rank, uint64_t step, bool complete) {
  const int64_t before = d.LastClosed(rank);
  const uint64_t closed_before = d.counters().steps_closed;
  LogReader::Record rec;
  while (d.LastClosed(rank) < static_cast<int64_t>(std::min<uint64_t>(step, INT64_MAX))) {
    auto res = source.Next(&rec);
    if (res != LogReader::Result::kRecord) {
      if (!complete && res != LogReader::Result::kCorrupt) break;  // not written yet
      return LogRead{true, res};
    }
    auto env = LogReader::Envelope(rec);
    if (!env.ok()) continue;
    d.Consume(**env, rec.recv_unix_ns);
  }
  return LogRead{d.LastClosed(rank) > before || d.counters().steps_closed > closed_before, std::nullopt};
}

}  // namespace

StatusOr<std::string> Aligner::AddBaselineLog(const std::string& path, const std::string& experiment,
                                              bool run_rules, const std::string& as_run) {
  auto reader = LogReader::Open(path);
  if (!reader.ok()) {
    return Status::InvalidArgument("cannot open the baseline log '" + path + "': " + reader.status().message());
  }
  // The first record is the Hello that names the run and its experiment.
  LogReader::Record rec;
  std::string run_id, exp = experiment;
  while (true) {
    auto res = (*reader)->Next(&rec);
    if (res != LogReader::Result::kRecord) {
      return Status::InvalidArgument("the baseline log '" + path + "' holds no Hello message; is it a run log?");
    }
    auto env = LogReader::Envelope(rec);
    if (!env.ok()) continue;
    const wire::Envelope* e = *env;
    if (e->body_type() != wire::Body::Hello) continue;
    run_id = as_run.empty() ? e->run_id()->str() : as_run;
    if (exp.empty() && e->body_as_Hello()->experiment()) exp = e->body_as_Hello()->experiment()->str();
    break;
  }
  auto reopened = LogReader::Open(path);  // start again from the first record
  if (!reopened.ok()) return reopened.status();
  if (runs_.count(run_id) && runs_.at(run_id)->info.role != RunRole::kUnknown) {
    return Status::InvalidArgument("the baseline log '" + path + "' holds run " + run_id +
                                   ", which is already known here; compare two different runs");
  }
  RunState* r = GetRun(run_id);
  r->info.run_rules = run_rules;
  r->source = std::move(*reopened);
  r->log_path = path;
  OverrideRun(run_id, exp, RunRole::kBaseline);
  spdlog::info("baseline of experiment {}: recorded run {} from {}", exp, run_id, path);
  return run_id;
}

// A late joiner: the steps other candidates passed are gone from the shared copy, so
// this pair reads the baseline from its log, from the first step.
bool Aligner::OpenBaselineLog(PairState* p) {
  RunState* b = p->b;
  std::string path = b->log_path;
  if (path.empty()) {
    if (opt_.data_dir.empty() || !IsValidRunId(b->info.id)) return false;
    path = runlog::LogPathFor(opt_.data_dir, b->info.id);
  }
  auto reader = LogReader::Open(path);
  if (!reader.ok()) return false;
  p->b_source = std::move(*reader);
  p->b_decoder = std::make_unique<RunDecoder>(
      b->info.id, &opt_.canon, names_, opt_.idle_close_ns, [this, p](uint32_t rank, StepPtr s) {
        const auto it = p->done.find(rank);
        if (it != p->done.end() && static_cast<int64_t>(s->step) <= it->second) return;
        counters_.buffered_bytes += s->ApproxBytes();
        ++counters_.buffered_steps;
        counters_.peak_buffered_bytes = std::max(counters_.peak_buffered_bytes, counters_.buffered_bytes);
        counters_.peak_buffered_steps = std::max(counters_.peak_buffered_steps, counters_.buffered_steps);
        p->b_buffer[rank][s->step] = std::move(s);
      });
  p->info.reads_baseline_log = true;
  ++counters_.late_joins_read_back;
  spdlog::info("experiment {}: candidate {} joined after baseline {}'s first steps were released; it is compared "
               "from the baseline's log {}",
               p->info.experiment, p->c->info.id, b->info.id, path);
  return true;
}

bool Aligner::StartReadBack(RunState* r) {
  if (opt_.data_dir.empty() || !IsValidRunId(r->info.id)) return false;
  const std::string path = runlog::LogPathFor(opt_.data_dir, r->info.id);
  auto reader = LogReader::Open(path);
  if (!reader.ok()) {
    if (!r->warned_readback) {
      r->warned_readback = true;
      spdlog::warn("run {} is far ahead of its partner but its log cannot be read back ({}); its oldest "
                   "waiting steps are dropped instead",
                   r->info.id, reader.status().message());
    }
    return false;
  }
  r->source = std::move(*reader);
  r->readback = true;
  r->ended = false;  // now: when its log is done
  r->back = std::make_unique<RunDecoder>(
      r->info.id, &opt_.canon, names_, opt_.idle_close_ns,
      [this, r](uint32_t rank, StepPtr s) { OnReadBack(r, rank, std::move(s)); });
  DropBuffered(r);
  ++counters_.runs_read_back;
  spdlog::info("run {} is more than {} steps ahead of its partner: its steps are read back from {} at the "
               "partner's pace",
               r->info.id, opt_.max_buffered_steps, path);
  dirty_ = true;
  return true;
}

void Aligner::DrainSourceToEnd(RunState* r) {
  while (!r->source_done) {
    bool progressed = false;
    for (auto& [rank, buf] : r->buffer) {
      progressed |= Pull(r, rank, static_cast<uint64_t>(Paced(r).LastClosed(rank) + 1));
      // Steps no partner will ask for: counted once per pair, then released.
      for (PairState* p : r->pairs) {
        if (p->b != r || p->b_source) continue;
        int64_t& done = p->done.try_emplace(rank, -1).first->second;
        for (auto& [s, sd] : buf) {
          if (static_cast<int64_t>(s) > done) {
            ++p->info.only_baseline;
            done = static_cast<int64_t>(s);
          }
        }
      }
      Release(r, rank);
    }
    if (!progressed) break;
  }
  Paced(r).CloseAll();
}

void Aligner::DrainPairBaselineToEnd(PairState* p) {
  while (!p->b_source_done) {
    bool progressed = false;
    for (auto& [rank, buf] : p->b_buffer) {
      progressed |= PullPairBaseline(p, rank, static_cast<uint64_t>(p->b_decoder->LastClosed(rank) + 1));
      int64_t& done = p->done.try_emplace(rank, -1).first->second;
      while (!buf.empty()) {
        if (static_cast<int64_t>(buf.begin()->first) > done) {
          ++p->info.only_baseline;
          done = static_cast<int64_t>(buf.begin()->first);
        }
        Unbuffer(&buf, buf.begin());
      }
    }
    if (!progressed) break;
  }
  p->b_decoder->CloseAll();
}

// Reads `r`'s log until `rank` has closed `step`. Returns whether anything closed (or
// the log ended). A read-back log that is still being written stops at what is there
// and is retried later (Tick, the next message); its end is the run's only at Finish.
bool Aligner::Pull(RunState* r, uint32_t rank, uint64_t step) {
  if (!r->source || r->source_done) return false;
  RunDecoder& d = Paced(r);
  const LogRead read = ReadUntil(*r->source, d, rank, step, !r->readback || finishing_);
  if (!read.end) return read.closed;
  if (*read.end != LogReader::Result::kEnd) {
    spdlog::warn("{} log: {}", r->readback ? "run" : "baseline", r->source->problem());
  }
  r->source_done = true;
  r->ended = true;
  d.CloseAll();
  spdlog::info("{} {} ends at step {} (rank {})", r->readback ? "run" : "baseline", r->info.id,
               d.LastClosed(rank), rank);
  return true;
}

// Pull for a late joiner's own copy of the baseline. The log of a live baseline is
// still being written: its end is the baseline's only at Finish.
bool Aligner::PullPairBaseline(PairState* p, uint32_t rank, uint64_t step) {
  if (p->b_source_done) return false;
  RunDecoder& d = *p->b_decoder;
  const bool complete = finishing_ || (p->b->source && !p->b->readback);  // a recorded log
  const LogRead read = ReadUntil(*p->b_source, d, rank, step, complete);
  if (!read.end) return read.closed;
  if (*read.end != LogReader::Result::kEnd) spdlog::warn("baseline log: {}", p->b_source->problem());
  p->b_source_done = true;
  d.CloseAll();
  return true;
}

}  // namespace lockstep::collector
