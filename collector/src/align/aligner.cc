#include "align/aligner.h"

#include <algorithm>
#include <set>

#include <spdlog/spdlog.h>

#include "lockstep/common/wire_names.h"
#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_format.h"
#include "runlog/log_reader.h"

namespace lockstep::collector {

using StepBuffer = std::map<uint64_t, StepPtr>;  // step -> closed step

struct Aligner::RunState {
  AlignedRun info;
  bool fixed = false;       // OverrideRun / AddBaselineLog: Hello does not change it
  bool ended = false;       // no more steps will come to pair (for a read-back run: its log is done)
  // Live ranks heard from, and those whose latest session said Goodbye: no more steps
  // will come from them. Per rank, not per run: when one rank says Goodbye, the other
  // ranks' last steps may still be on their way.
  std::set<uint32_t> ranks_seen, ranks_ended;
  std::unique_ptr<RunDecoder> decoder;
  std::map<uint32_t, StepBuffer> buffer;  // rank -> waiting steps
  std::vector<PairState*> pairs;
  std::string log_path;               // a recorded baseline's log ("" for a live run)
  std::unique_ptr<LogReader> source;  // a recorded baseline, or a live run read back
  bool source_done = false;
  // Read-back: `source` is this live run's own log and `back` decodes it; `decoder`
  // keeps decoding the live messages for OnRunStep only.
  bool readback = false;
  std::unique_ptr<RunDecoder> back;
  bool warned_readback = false;
  bool released = false;    // a step left `buffer` after its candidates passed it
  uint64_t evicted = 0;
  bool warned_evict = false;
  bool warned_unpaired = false;  // a candidate said to be without a baseline (once)
};

struct Aligner::PairState {
  AlignedPair info;
  RunState* b = nullptr;
  RunState* c = nullptr;
  std::map<uint32_t, int64_t> done;  // rank -> highest step matched or skipped
  // A late joiner's own copy of the baseline, read from the baseline's log.
  std::unique_ptr<LogReader> b_source;
  std::unique_ptr<RunDecoder> b_decoder;
  bool b_source_done = false;
  std::map<uint32_t, StepBuffer> b_buffer;
};

namespace {

// The decoder whose closed steps are paired: the log's for a read-back run.
RunDecoder& Paced(const auto* r) { return r->readback ? *r->back : *r->decoder; }

// No more steps of `rank` will come to pair: the run ended (Finish, its log is done)
// or, live, that rank said Goodbye, or it is a rank the run never had and every rank
// it has said Goodbye. A read-back run ends with its log only.
bool RankEnded(const auto* r, uint32_t rank) {
  if (r->ended) return true;
  if (r->readback) return false;
  if (r->ranks_seen.count(rank) != 0) return r->ranks_ended.count(rank) != 0;
  return !r->ranks_ended.empty() && r->ranks_ended.size() == r->ranks_seen.size();
}

RunRole FromWire(wire::Role r) {
  switch (r) {
    case wire::Role::Baseline: return RunRole::kBaseline;
    case wire::Role::Candidate: return RunRole::kCandidate;
    case wire::Role::Solo: return RunRole::kSolo;
    default: return RunRole::kUnknown;
  }
}

// RunRole's values are the wire's Role numbers: one spelling of each role (wire_names.h).
static_assert(static_cast<uint8_t>(RunRole::kBaseline) == static_cast<uint8_t>(wire::Role::Baseline) &&
              static_cast<uint8_t>(RunRole::kCandidate) == static_cast<uint8_t>(wire::Role::Candidate) &&
              static_cast<uint8_t>(RunRole::kSolo) == static_cast<uint8_t>(wire::Role::Solo));
const char* RoleName(RunRole r) { return wire::RoleName(static_cast<uint8_t>(r)); }

}  // namespace

Aligner::Aligner(AlignerOptions options, NameTable* names, AlignedSink* sink)
    : opt_(std::move(options)), names_(names), sink_(sink) {}

Aligner::~Aligner() = default;

Aligner::RunState* Aligner::GetRun(const std::string& run_id) {
  auto it = runs_.find(run_id);
  if (it != runs_.end()) return it->second.get();
  auto r = std::make_unique<RunState>();
  RunState* rp = r.get();
  rp->info.id = run_id;
  rp->decoder = std::make_unique<RunDecoder>(
      run_id, &opt_.canon, names_, opt_.idle_close_ns,
      [this, rp](uint32_t rank, StepPtr s) { OnClosed(rp, rank, std::move(s)); });
  rp->decoder->set_on_rewind([this, rp](const Rewind& w) { sink_->OnRunRewind(rp->info, w); });
  rp->info.fingerprint = &rp->decoder->fingerprint();
  rp->info.world_size = &rp->decoder->world_size();
  runs_.emplace(run_id, std::move(r));
  return rp;
}

void Aligner::OverrideRun(const std::string& run, const std::string& experiment, RunRole role) {
  RunState* r = GetRun(run);
  r->fixed = false;
  SetRole(r, experiment, role);
  r->fixed = true;
}

void Aligner::MakePair(RunState* b, RunState* c) {
  auto p = std::make_unique<PairState>();
  PairState* pp = p.get();
  pp->b = b;
  pp->c = c;
  pp->info.index = pairs_.size();
  pp->info.experiment = c->info.experiment;
  pp->info.baseline = &b->info;
  pp->info.candidate = &c->info;
  pp->info.evicted = c->evicted;  // what the candidate lost while it waited for a baseline
  spdlog::info("experiment {}: comparing candidate {} against baseline {}", c->info.experiment, c->info.id,
               b->info.id);
  if (b->released && !OpenBaselineLog(pp)) {
    ++counters_.late_joins_uncompared;
    spdlog::warn("experiment {}: candidate {} joined after other candidates had passed baseline {}'s first steps, "
                 "and the baseline's log cannot be read back ({}): its steps the baseline no longer holds are not "
                 "compared (run the collector with --data-dir, or compare the logs with `lockstep compare`)",
                 c->info.experiment, c->info.id, b->info.id,
                 opt_.data_dir.empty() && b->log_path.empty() ? "no data dir" : "no log");
  }
  b->pairs.push_back(pp);
  c->pairs.push_back(pp);
  pairs_.push_back(std::move(p));
  sink_->OnPairStart(pp->info);
  dirty_ = true;
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

void Aligner::SetRole(RunState* r, const std::string& experiment, RunRole role) {
  if (r->fixed) return;
  AlignedRun& i = r->info;
  if (i.role == role && i.experiment == experiment) return;
  if (i.role != RunRole::kUnknown) {
    spdlog::warn("run {} announced experiment '{}' role {} after '{}' role {}; keeping the first", i.id, experiment,
                 RoleName(role), i.experiment, RoleName(i.role));
    return;
  }
  i.experiment = experiment;
  i.role = role;
  if (role == RunRole::kBaseline) {
    auto it = baseline_of_.find(experiment);
    if (it != baseline_of_.end() && it->second != i.id) {
      spdlog::warn("experiment {} already has baseline {}; run {} (also a baseline) is not paired", experiment,
                   it->second, i.id);
      DropBuffered(r);
      return;
    }
    baseline_of_[experiment] = i.id;
    std::string waiting;  // unpaired candidates of other experiments (a typo on either side)
    bool paired = false;
    for (auto& [id, other] : runs_) {
      if (other->info.role != RunRole::kCandidate || !other->pairs.empty()) continue;
      if (other->info.experiment == experiment) {
        MakePair(r, other.get());
        paired = true;
      } else {
        waiting += (waiting.empty() ? "" : ", ") + other->info.id + " ('" + other->info.experiment + "')";
      }
    }
    if (!paired && !waiting.empty()) {
      spdlog::warn("baseline {} of experiment '{}' has no candidate; candidates still waiting for a baseline: {} — "
                   "check experiment= of both runs",
                   i.id, experiment, waiting);
    }
  } else if (role == RunRole::kCandidate) {
    auto it = baseline_of_.find(experiment);
    if (it != baseline_of_.end()) {
      MakePair(runs_.at(it->second).get(), r);
    } else if (baseline_of_.empty()) {
      // Waiting for its baseline is normal at start, even after the candidate's end (a
      // baseline run after it); one that never gets one is warned about at Finish.
      spdlog::info("candidate {} of experiment '{}' waits for its baseline", i.id, experiment);
    } else {
      WarnUnpaired(r, "no baseline of that experiment yet");  // another experiment's: a typo shows at once
    }
  } else {
    DropBuffered(r);
  }
}

void Aligner::WarnUnpaired(RunState* r, const char* why) {
  if (r->warned_unpaired) return;
  r->warned_unpaired = true;
  // A typo in the experiment name waits forever: name the experiments that do have a
  // baseline, so it shows.
  std::string known;
  for (const auto& [exp, run] : baseline_of_) known += (known.empty() ? "'" : ", '") + exp + "' (" + run + ")";
  spdlog::warn("candidate {} of experiment '{}' is not paired: {}{}", r->info.id, r->info.experiment, why,
               known.empty() ? std::string(" (none of any experiment)")
                             : "; experiments with a baseline: " + known + " — check experiment= of both runs");
}

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

void Aligner::OnMessage(const wire::Envelope& env, int64_t recv_ns) {
  ++counters_.messages;
  std::string run_id = env.run_id() ? env.run_id()->str() : std::string();
  if (!rename_.empty()) {
    if (auto it = rename_.find(run_id); it != rename_.end()) run_id = it->second;
  }
  RunState* r = GetRun(run_id);
  if (r->source && !r->readback) return;  // a recorded baseline that is also live: the log wins
  if (env.body_type() == wire::Body::Hello) {
    const auto* h = env.body_as_Hello();
    SetRole(r, h->experiment() ? h->experiment()->str() : std::string(), FromWire(h->role()));
    r->ranks_ended.erase(env.rank());  // a new session of the rank
  }
  r->ranks_seen.insert(env.rank());
  const bool goodbye = env.body_type() == wire::Body::Goodbye;
  sink_->OnRunActivity(r->info, recv_ns, goodbye);
  r->decoder->Consume(env, recv_ns);
  if (goodbye) {
    r->ranks_ended.insert(env.rank());
    dirty_ = true;  // its partner's steps past its end are settled now
  }
  if (r->readback && !r->source_done) dirty_ = true;  // its log has grown (or soon will)
  for (PairState* p : r->pairs) {
    if (p->b == r && p->b_source && !p->b_source_done) dirty_ = true;  // a late joiner's baseline log grew
  }
  Drain();
}

void Aligner::Tick(int64_t now_ns) {
  for (auto& [id, r] : runs_) {
    if (r->source && !r->readback) continue;
    r->decoder->Tick(now_ns);
    sink_->OnRunTick(r->info, now_ns);
    // The collector flushes a log when its socket runs dry: retry what was not written yet.
    if (r->readback && !r->source_done) dirty_ = true;
  }
  for (auto& p : pairs_) {
    if (p->b_source && !p->b_source_done) dirty_ = true;
  }
  Drain();
}

void Aligner::Resume(int64_t now_ns) {
  for (auto& [id, r] : runs_) {
    r->decoder->Touch(now_ns);
    sink_->OnRunResume(r->info, now_ns);
  }
}

void Aligner::Finish() {
  for (auto& [id, r] : runs_) {
    if (r->info.role == RunRole::kCandidate && r->pairs.empty()) {
      WarnUnpaired(r.get(), "no baseline of that experiment came, and it was not compared");
    }
    if (r->source && !r->readback) continue;
    r->decoder->CloseAll();
    if (!r->readback) r->ended = true;
  }
  // The collector has flushed its logs before Finish: the end of a read-back log is now
  // the end of its run.
  finishing_ = true;
  dirty_ = true;  // read-back runs may have more in their logs now
  Drain();
  // Read logs to their end (step by step, bounded) so the report counts extra steps.
  for (auto& [id, r] : runs_) {
    if (r->source && r->info.role == RunRole::kBaseline && !r->pairs.empty()) DrainSourceToEnd(r.get());
  }
  for (auto& p : pairs_) {
    if (p->b_source) DrainPairBaselineToEnd(p.get());
  }
  Drain();
  for (auto& p : pairs_) {
    for (auto& [rank, buf] : p->b_source ? p->b_buffer : p->b->buffer) {
      const int64_t done = p->done.count(rank) ? p->done[rank] : -1;
      for (auto& [s, sd] : buf) {
        if (static_cast<int64_t>(s) > done) ++p->info.only_baseline;
      }
    }
    sink_->OnPairEnd(p->info);
  }
}

void Aligner::OnClosed(RunState* r, uint32_t rank, StepPtr step) {
  ++counters_.steps_closed;
  sink_->OnRunStep(r->info, *step);
  if (r->readback) return;  // paired from its log (OnReadBack), not from the live copy
  const RunRole role = r->info.role;
  if (role == RunRole::kBaseline || role == RunRole::kCandidate || role == RunRole::kUnknown) {
    if (role == RunRole::kBaseline && baseline_of_[r->info.experiment] != r->info.id) return;
    Buffer(r, rank, std::move(step));
  }
}

void Aligner::Unbuffer(StepBuffer* buf, StepBuffer::iterator it) {
  counters_.buffered_bytes -= it->second->ApproxBytes();
  --counters_.buffered_steps;
  buf->erase(it);
}

void Aligner::Buffer(RunState* r, uint32_t rank, StepPtr step) {
  auto& buf = r->buffer[rank];
  counters_.buffered_bytes += step->ApproxBytes();
  ++counters_.buffered_steps;
  buf[step->step] = std::move(step);
  counters_.peak_buffered_bytes = std::max(counters_.peak_buffered_bytes, counters_.buffered_bytes);
  dirty_ = true;
  // A run read from a log is read on demand and needs no bound; a live run far ahead of
  // its partner is read back from its own log from now on, or, without one, loses its
  // oldest waiting steps.
  if (buf.size() > opt_.max_buffered_steps && !r->source) StartReadBack(r);
  while (buf.size() > opt_.max_buffered_steps && !r->source) {
    auto oldest = buf.begin();
    ++counters_.steps_evicted;
    ++r->evicted;
    for (PairState* p : r->pairs) ++p->info.evicted;
    if (!r->warned_evict) {
      r->warned_evict = true;
      spdlog::warn(
          "run {} rank {} is more than {} steps ahead of its partner (or has none yet): step {} and later "
          "overflowing steps are not compared (raise --max-buffered-steps to keep more)",
          r->info.id, rank, opt_.max_buffered_steps, oldest->first);
    }
    Unbuffer(&buf, oldest);
  }
  counters_.peak_buffered_steps = std::max(counters_.peak_buffered_steps, counters_.buffered_steps);
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

void Aligner::DropBuffered(RunState* r) {
  for (auto& [rank, buf] : r->buffer) {
    while (!buf.empty()) Unbuffer(&buf, buf.begin());  // the rank stays known: Match walks it
  }
}

// The highest step every pair reading `r`'s shared copy has passed on `rank` (-1 when
// one has not started, or `r` has no such pair).
int64_t Aligner::MinDone(const RunState* r, uint32_t rank) const {
  int64_t min_done = INT64_MAX;
  bool any = false;
  for (const PairState* p : r->pairs) {
    if (p->b == r && p->b_source) continue;  // a late joiner reads its own copy
    any = true;
    auto it = p->done.find(rank);
    min_done = std::min(min_done, it == p->done.end() ? int64_t{-1} : it->second);
  }
  return any ? min_done : -1;
}

// A step decoded from a read-back log. Its OnRunStep ran on the live copy; the steps
// every partner has passed were matched (or skipped) before the switch.
void Aligner::OnReadBack(RunState* r, uint32_t rank, StepPtr step) {
  if (static_cast<int64_t>(step->step) <= MinDone(r, rank)) return;
  Buffer(r, rank, std::move(step));
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

void Aligner::Drain() {
  while (dirty_) {
    dirty_ = false;
    for (auto& p : pairs_) Match(p.get());
  }
}

// Reads `r`'s log until `rank` has closed `step`. Returns whether anything closed (or
// the log ended). A read-back log that is still being written stops at what is there
// and is retried later (Tick, the next message); its end is the run's only at Finish.
bool Aligner::Pull(RunState* r, uint32_t rank, uint64_t step) {
  if (!r->source || r->source_done) return false;
  RunDecoder& d = Paced(r);
  const int64_t before = d.LastClosed(rank);
  const uint64_t closed_before = d.counters().steps_closed;
  LogReader::Record rec;
  while (d.LastClosed(rank) < static_cast<int64_t>(std::min<uint64_t>(step, INT64_MAX))) {
    auto res = r->source->Next(&rec);
    if (res != LogReader::Result::kRecord) {
      if (r->readback && !finishing_ && res != LogReader::Result::kCorrupt) break;  // not written yet
      if (res != LogReader::Result::kEnd) {
        spdlog::warn("{} log: {}", r->readback ? "run" : "baseline", r->source->problem());
      }
      r->source_done = true;
      r->ended = true;
      d.CloseAll();
      spdlog::info("{} {} ends at step {} (rank {})", r->readback ? "run" : "baseline", r->info.id,
                   d.LastClosed(rank), rank);
      return true;
    }
    auto env = LogReader::Envelope(rec);
    if (!env.ok()) continue;
    d.Consume(**env, rec.recv_unix_ns);
  }
  return d.LastClosed(rank) > before || d.counters().steps_closed > closed_before;
}

// Pull for a late joiner's own copy of the baseline. The log of a live baseline is
// still being written: its end is the baseline's only at Finish.
bool Aligner::PullPairBaseline(PairState* p, uint32_t rank, uint64_t step) {
  if (p->b_source_done) return false;
  RunDecoder& d = *p->b_decoder;
  const bool complete = finishing_ || (p->b->source && !p->b->readback);  // a recorded log
  const int64_t before = d.LastClosed(rank);
  const uint64_t closed_before = d.counters().steps_closed;
  LogReader::Record rec;
  while (d.LastClosed(rank) < static_cast<int64_t>(std::min<uint64_t>(step, INT64_MAX))) {
    auto res = p->b_source->Next(&rec);
    if (res != LogReader::Result::kRecord) {
      if (!complete && res != LogReader::Result::kCorrupt) break;  // not written yet
      if (res != LogReader::Result::kEnd) spdlog::warn("baseline log: {}", p->b_source->problem());
      p->b_source_done = true;
      d.CloseAll();
      return true;
    }
    auto env = LogReader::Envelope(rec);
    if (!env.ok()) continue;
    d.Consume(**env, rec.recv_unix_ns);
  }
  return d.LastClosed(rank) > before || d.counters().steps_closed > closed_before;
}

void Aligner::Match(PairState* p) {
  RunState* b = p->b;
  RunState* c = p->c;
  const bool own = p->b_source != nullptr;  // a late joiner: the baseline from its log
  // The highest step the baseline has closed on `rank`, in the copy this pair reads.
  auto b_last = [&](uint32_t rank) { return own ? p->b_decoder->LastClosed(rank) : Paced(b).LastClosed(rank); };
  for (auto& [rank, cbuf] : c->buffer) {
    while (true) {
      if (cbuf.empty()) {
        // A read-back candidate: its next step from its log, once the baseline can
        // answer it (a baseline read from a log always can: it is read on demand).
        if (!c->readback || c->source_done) break;
        const int64_t next = Paced(c).LastClosed(rank) + 1;
        const bool b_ready = (b->source && !own) || RankEnded(b, rank) || Paced(b).LastClosed(rank) >= next ||
                             (own && b_last(rank) >= next);
        if (!b_ready) break;
        const bool progressed = Pull(c, rank, static_cast<uint64_t>(next));
        if (cbuf.empty()) {
          if (progressed) continue;  // a step matched before the switch: skipped
          break;
        }
      }
      const uint64_t s = cbuf.begin()->first;
      auto& bbuf = own ? p->b_buffer[rank] : b->buffer[rank];
      auto it = bbuf.find(s);
      if (it == bbuf.end() && b_last(rank) < static_cast<int64_t>(s)) {
        if (own) {
          PullPairBaseline(p, rank, s);
        } else if (b->source && !b->source_done) {
          Pull(b, rank, s);
        }
        it = bbuf.find(s);
      }
      int64_t& done = p->done.try_emplace(rank, -1).first->second;
      if (it == bbuf.end()) {
        bool baseline_past = b_last(rank) >= static_cast<int64_t>(s);
        if (own) {
          // Its own copy is past s, or the live baseline ended on this rank before s.
          baseline_past = baseline_past || p->b_source_done ||
                          (RankEnded(b, rank) && Paced(b).LastClosed(rank) < static_cast<int64_t>(s));
        } else {
          baseline_past = baseline_past || RankEnded(b, rank);
        }
        if (!baseline_past) break;  // the baseline has not reached s yet
        ++p->info.only_candidate;
      } else {
        // Baseline steps this pair skipped over (the candidate never had them).
        for (auto bi = bbuf.begin(); bi != it; ++bi) {
          if (static_cast<int64_t>(bi->first) > done) ++p->info.only_baseline;
        }
        auto& ranks = p->info.ranks;
        if (auto ri = std::lower_bound(ranks.begin(), ranks.end(), rank); ri == ranks.end() || *ri != rank) {
          ranks.insert(ri, rank);
        }
        ++p->info.steps_matched;
        ++counters_.steps_matched;
        sink_->OnPairStep(p->info, rank, *it->second, *cbuf.begin()->second);
      }
      done = static_cast<int64_t>(s);
      Unbuffer(&cbuf, cbuf.begin());
      if (own) {
        while (!bbuf.empty() && static_cast<int64_t>(bbuf.begin()->first) <= done) Unbuffer(&bbuf, bbuf.begin());
      }
      Release(b, rank);
    }
  }
}

// Drops the baseline steps every pair reading the shared copy has passed.
void Aligner::Release(RunState* b, uint32_t rank) {
  if (b->pairs.empty()) return;
  int64_t min_done = INT64_MAX;  // only late joiners: none needs the shared copy
  for (PairState* p : b->pairs) {
    if (p->b != b || p->b_source) continue;
    auto it = p->done.find(rank);
    min_done = std::min(min_done, it == p->done.end() ? -1 : it->second);
  }
  auto& bbuf = b->buffer[rank];
  while (!bbuf.empty() && static_cast<int64_t>(bbuf.begin()->first) <= min_done) {
    Unbuffer(&bbuf, bbuf.begin());
    b->released = true;
  }
}

std::vector<const AlignedPair*> Aligner::pairs() const {
  std::vector<const AlignedPair*> out;
  out.reserve(pairs_.size());
  for (const auto& p : pairs_) out.push_back(&p->info);
  return out;
}

AlignerCounters Aligner::counters() const {
  AlignerCounters c = counters_;
  c.late_records = c.unknown_ids = 0;
  c.closed_at_step_end = c.records_missing = c.restarts = c.rewound_records = 0;
  for (const auto& [id, r] : runs_) {
    const DecoderCounters& d = r->decoder->counters();
    c.late_records += d.late_records;
    c.unknown_ids += d.unknown_ids;
    c.closed_at_step_end += d.closed_at_step_end;
    c.records_missing += d.records_missing;
    c.restarts += d.restarts;
    c.rewound_records += d.rewound_records;
  }
  return c;
}

}  // namespace lockstep::collector
