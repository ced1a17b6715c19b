#include "detect/analyzer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include <spdlog/spdlog.h>

#include "align/pair_metrics.h"
#include "detect/pair_rules.h"
#include "detect/run_rules.h"
#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_format.h"
#include "runlog/log_reader.h"

namespace lockstep::collector {

struct Analyzer::RunState {
  std::string id;
  std::string experiment;
  RunRole role = RunRole::kUnknown;
  bool fixed = false;          // OverrideRun / AddBaselineLog: Hello does not change it
  bool run_rules = true;
  bool ended = false;       // no more steps will come to pair (for a read-back run: its log is done)
  bool live_ended = false;  // Goodbye seen live (or Finish)
  // Live ranks heard from, and those whose latest session said Goodbye: no more steps
  // will come from them. Per rank, not per run: when one rank says Goodbye, the other
  // ranks' last steps may still be on their way.
  std::set<uint32_t> ranks_seen, ranks_ended;
  DT precision = DT::kUnknown;  // lowest float dtype seen
  std::unique_ptr<RunDecoder> decoder;
  RunCtx ctx;
  std::vector<std::unique_ptr<RunDetector>> detectors;
  std::map<uint32_t, std::map<uint64_t, StepPtr>> buffer;  // rank -> step -> closed step
  std::vector<PairState*> pairs;
  std::unique_ptr<LogReader> source;  // a recorded baseline, or a live run read back
  bool source_done = false;
  // Read-back: `source` is this live run's own log and `back` decodes it; `decoder`
  // keeps decoding the live messages for the per-run rules only.
  bool readback = false;
  std::unique_ptr<RunDecoder> back;
  bool warned_readback = false;
  uint64_t evicted = 0;
  bool warned_evict = false;
};

struct Analyzer::PairState {
  RunState* b = nullptr;
  RunState* c = nullptr;
  PairCtx ctx;
  std::vector<std::unique_ptr<PairDetector>> detectors;
  std::map<uint32_t, int64_t> done;  // rank -> highest step compared or skipped
  std::unordered_map<uint64_t, TensorTrack> tracks;
  struct Unmatched {
    bool in_baseline = false;
    uint64_t first_step = 0, steps = 0;
  };
  std::unordered_map<uint64_t, Unmatched> unmatched;
  std::vector<MatchedTensor> matched;  // reused per step
  uint64_t steps_compared = 0, only_b = 0, only_c = 0, evicted = 0;
  bool diverged = false;
  alerting::Alert first_divergence;
  PairFacts facts;  // setup differences and scalar findings: first_divergence's cause
  double loss_b = std::nan(""), loss_c = std::nan("");
  bool loss_b_given = false, loss_c_given = false;
};

namespace {

int64_t SystemNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

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

}  // namespace

Analyzer::Analyzer(AnalyzerOptions options, AlertFn alerts, ClockFn clock)
    : opt_(std::move(options)),
      clock_(clock ? std::move(clock) : ClockFn(SystemNowNs)),
      emitter_(std::move(alerts), clock_) {}

Analyzer::~Analyzer() = default;

Analyzer::RunState* Analyzer::GetRun(const std::string& run_id) {
  auto it = runs_.find(run_id);
  if (it != runs_.end()) return it->second.get();
  auto r = std::make_unique<RunState>();
  RunState* rp = r.get();
  rp->id = run_id;
  rp->ctx.run = run_id;
  rp->ctx.names = &names_;
  rp->ctx.cfg = &opt_.rules;
  rp->ctx.out = &emitter_;
  rp->detectors = MakeRunDetectors(&rp->ctx);
  rp->decoder = std::make_unique<RunDecoder>(
      run_id, &opt_.canon, &names_, opt_.idle_close_ns,
      [this, rp](uint32_t rank, StepPtr s) { OnClosed(rp, rank, std::move(s)); });
  rp->decoder->set_on_rewind([rp](const Rewind& w) {
    if (rp->run_rules) EmitRestart(rp->ctx, w);
  });
  runs_.emplace(run_id, std::move(r));
  return rp;
}

void Analyzer::OverrideRun(const std::string& run, const std::string& experiment, RunRole role) {
  RunState* r = GetRun(run);
  r->fixed = false;
  SetRole(r, experiment, role);
  r->fixed = true;
}

namespace {
const char* RoleName(RunRole r) {
  switch (r) {
    case RunRole::kBaseline: return "baseline";
    case RunRole::kCandidate: return "candidate";
    case RunRole::kSolo: return "solo";
    default: return "unknown";
  }
}
}  // namespace

void Analyzer::SetRole(RunState* r, const std::string& experiment, RunRole role) {
  if (r->fixed) return;
  if (r->role == role && r->experiment == experiment) return;
  if (r->role != RunRole::kUnknown) {
    if (r->role != role || r->experiment != experiment) {
      spdlog::warn("run {} announced experiment '{}' role {} after '{}' role {}; keeping the first", r->id,
                   experiment, RoleName(role), r->experiment, RoleName(r->role));
    }
    return;
  }
  r->experiment = experiment;
  r->ctx.experiment = experiment;
  r->role = role;
  auto make_pair = [this](RunState* b, RunState* c) {
    auto p = std::make_unique<PairState>();
    p->b = b;
    p->c = c;
    p->ctx.experiment = c->experiment;
    p->ctx.baseline = b->id;
    p->ctx.candidate = c->id;
    p->ctx.names = &names_;
    p->ctx.cfg = &opt_.rules;
    p->ctx.out = &emitter_;
    p->ctx.facts = &p->facts;
    p->detectors = MakePairDetectors(&p->ctx);
    p->evicted = c->evicted;  // what the candidate lost while it waited for a baseline
    b->pairs.push_back(p.get());
    c->pairs.push_back(p.get());
    spdlog::info("experiment {}: comparing candidate {} against baseline {}", c->experiment, c->id, b->id);
    pairs_.push_back(std::move(p));
    dirty_ = true;
  };
  if (role == RunRole::kBaseline) {
    auto it = baseline_of_.find(experiment);
    if (it != baseline_of_.end() && it->second != r->id) {
      spdlog::warn("experiment {} already has baseline {}; run {} (also a baseline) is not paired", experiment,
                   it->second, r->id);
      r->buffer.clear();
      return;
    }
    baseline_of_[experiment] = r->id;
    std::string waiting;  // unpaired candidates of other experiments (a typo on either side)
    bool paired = false;
    for (auto& [id, other] : runs_) {
      if (other->role != RunRole::kCandidate || !other->pairs.empty()) continue;
      if (other->experiment == experiment) {
        make_pair(r, other.get());
        paired = true;
      } else {
        waiting += (waiting.empty() ? "" : ", ") + other->id + " ('" + other->experiment + "')";
      }
    }
    if (!paired && !waiting.empty()) {
      spdlog::warn("baseline {} of experiment '{}' has no candidate; candidates still waiting for a baseline: {} — "
                   "check experiment= of both runs",
                   r->id, experiment, waiting);
    }
  } else if (role == RunRole::kCandidate) {
    auto it = baseline_of_.find(experiment);
    if (it != baseline_of_.end()) {
      make_pair(runs_.at(it->second).get(), r);
    } else {
      // Waiting for its baseline is normal at start; a typo in the experiment name
      // waits forever. Name the experiments that do have a baseline, so it shows.
      std::string known;
      for (const auto& [exp, run] : baseline_of_) known += (known.empty() ? "'" : ", '") + exp + "' (" + run + ")";
      spdlog::warn("candidate {} of experiment '{}' is not paired: no baseline of that experiment yet{}", r->id,
                   experiment,
                   known.empty() ? std::string(" (none of any experiment)")
                                 : "; experiments with a baseline: " + known + " — check experiment= of both runs");
    }
  } else {
    r->buffer.clear();
  }
}

StatusOr<std::string> Analyzer::AddBaselineLog(const std::string& path, const std::string& experiment,
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
  if (runs_.count(run_id) && runs_.at(run_id)->role != RunRole::kUnknown) {
    return Status::InvalidArgument("the baseline log '" + path + "' holds run " + run_id +
                                   ", which is already known here; compare two different runs");
  }
  RunState* r = GetRun(run_id);
  r->run_rules = run_rules;
  r->source = std::move(*reopened);
  OverrideRun(run_id, exp, RunRole::kBaseline);
  spdlog::info("baseline of experiment {}: recorded run {} from {}", exp, run_id, path);
  return run_id;
}

void Analyzer::OnMessage(const wire::Envelope& env, int64_t recv_ns) {
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
  if (r->run_rules) {
    for (auto& d : r->detectors) d->OnActivity(recv_ns, goodbye);
  }
  r->decoder->Consume(env, recv_ns);
  if (goodbye) {
    r->live_ended = true;
    r->ranks_ended.insert(env.rank());
    dirty_ = true;  // its partner's steps past its end are settled now
  }
  if (r->readback && !r->source_done) dirty_ = true;  // its log has grown (or soon will)
  Drain();
}

void Analyzer::Tick(int64_t now_ns) {
  for (auto& [id, r] : runs_) {
    if (r->source && !r->readback) continue;
    r->decoder->Tick(now_ns);
    if (r->run_rules) {
      for (auto& d : r->detectors) d->OnTick(now_ns);
    }
    // The collector flushes a log when its socket runs dry: retry what was not written yet.
    if (r->readback && !r->source_done) dirty_ = true;
  }
  Drain();
}

void Analyzer::Resume(int64_t now_ns) {
  for (auto& [id, r] : runs_) {
    r->decoder->Touch(now_ns);
    for (auto& d : r->detectors) d->OnResume(now_ns);
  }
}

void Analyzer::Finish() {
  for (auto& [id, r] : runs_) {
    if (r->source && !r->readback) continue;
    r->decoder->CloseAll();
    r->live_ended = true;
    if (!r->readback) r->ended = true;
  }
  // The collector has flushed its logs before Finish: the end of a read-back log is now
  // the end of its run.
  finishing_ = true;
  dirty_ = true;  // read-back runs may have more in their logs now
  Drain();
  // Read logs to their end (step by step, bounded) so the report counts extra steps.
  for (auto& [id, r] : runs_) {
    if (r->source && r->role == RunRole::kBaseline && !r->pairs.empty()) DrainSourceToEnd(r.get());
  }
  Drain();
  for (auto& p : pairs_) {
    CheckSetup(p.get(), 0, 0);
    for (auto& [rank, buf] : p->b->buffer) {
      const int64_t done = p->done.count(rank) ? p->done[rank] : -1;
      for (auto& [s, sd] : buf) {
        if (static_cast<int64_t>(s) > done) ++p->only_b;
      }
    }
  }
}

void Analyzer::OnClosed(RunState* r, uint32_t rank, StepPtr step) {
  ++counters_.steps_closed;
  for (const StatRow& row : step->rows) r->precision = LowerPrecision(r->precision, row.dtype);
  if (r->run_rules) {
    for (auto& d : r->detectors) d->OnStep(*step);
  }
  if (r->readback) return;  // paired from its log (OnReadBack), not from the live copy
  if (r->role == RunRole::kBaseline || r->role == RunRole::kCandidate || r->role == RunRole::kUnknown) {
    if (r->role == RunRole::kBaseline && baseline_of_[r->experiment] != r->id) return;
    Buffer(r, rank, std::move(step));
  }
}

void Analyzer::Buffer(RunState* r, uint32_t rank, StepPtr step) {
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
    counters_.buffered_bytes -= oldest->second->ApproxBytes();
    --counters_.buffered_steps;
    ++counters_.steps_evicted;
    ++r->evicted;
    for (PairState* p : r->pairs) ++p->evicted;
    if (!r->warned_evict) {
      r->warned_evict = true;
      spdlog::warn(
          "run {} rank {} is more than {} steps ahead of its partner (or has none yet): step {} and later "
          "overflowing steps are not compared (raise --max-buffered-steps to keep more)",
          r->id, rank, opt_.max_buffered_steps, oldest->first);
    }
    buf.erase(oldest);
  }
  counters_.peak_buffered_steps = std::max(counters_.peak_buffered_steps, counters_.buffered_steps);
}

bool Analyzer::StartReadBack(RunState* r) {
  if (opt_.data_dir.empty() || !IsValidRunId(r->id)) return false;
  const std::string path = runlog::LogPathFor(opt_.data_dir, r->id);
  auto reader = LogReader::Open(path);
  if (!reader.ok()) {
    if (!r->warned_readback) {
      r->warned_readback = true;
      spdlog::warn("run {} is far ahead of its partner but its log cannot be read back ({}); its oldest "
                   "waiting steps are dropped instead",
                   r->id, reader.status().message());
    }
    return false;
  }
  r->source = std::move(*reader);
  r->readback = true;
  r->ended = false;  // now: when its log is done
  r->back = std::make_unique<RunDecoder>(
      r->id, &opt_.canon, &names_, opt_.idle_close_ns,
      [this, r](uint32_t rank, StepPtr s) { OnReadBack(r, rank, std::move(s)); });
  DropBuffered(r);
  ++counters_.runs_read_back;
  spdlog::info("run {} is more than {} steps ahead of its partner: its steps are read back from {} at the "
               "partner's pace",
               r->id, opt_.max_buffered_steps, path);
  dirty_ = true;
  return true;
}

void Analyzer::DropBuffered(RunState* r) {
  for (auto& [rank, buf] : r->buffer) {
    for (auto& [s, sd] : buf) {
      counters_.buffered_bytes -= sd->ApproxBytes();
      --counters_.buffered_steps;
    }
    buf.clear();  // the rank stays known: Match walks it
  }
}

int64_t Analyzer::MinDone(const RunState* r, uint32_t rank) const {
  if (r->pairs.empty()) return -1;
  int64_t min_done = INT64_MAX;
  for (const PairState* p : r->pairs) {
    auto it = p->done.find(rank);
    min_done = std::min(min_done, it == p->done.end() ? int64_t{-1} : it->second);
  }
  return min_done;
}

// A step decoded from a read-back log. Its per-run rules ran on the live copy; the
// steps every partner has passed were compared (or skipped) before the switch.
void Analyzer::OnReadBack(RunState* r, uint32_t rank, StepPtr step) {
  if (static_cast<int64_t>(step->step) <= MinDone(r, rank)) return;
  Buffer(r, rank, std::move(step));
}

void Analyzer::DrainSourceToEnd(RunState* r) {
  while (!r->source_done) {
    bool progressed = false;
    for (auto& [rank, buf] : r->buffer) {
      progressed |= Pull(r, rank, static_cast<uint64_t>(Paced(r).LastClosed(rank) + 1));
      // Steps no partner will ask for: counted once per pair, then released.
      for (PairState* p : r->pairs) {
        if (p->b != r) continue;
        int64_t& done = p->done.try_emplace(rank, -1).first->second;
        for (auto& [s, sd] : buf) {
          if (static_cast<int64_t>(s) > done) {
            ++p->only_b;
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

void Analyzer::Drain() {
  while (dirty_) {
    dirty_ = false;
    for (auto& p : pairs_) Match(p.get());
  }
}

// Reads `r`'s log until `rank` has closed `step`. Returns whether anything closed (or
// the log ended). A read-back log that is still being written stops at what is there
// and is retried later (Tick, the next message); its end is the run's only at Finish.
bool Analyzer::Pull(RunState* r, uint32_t rank, uint64_t step) {
  if (!r->source || r->source_done) return false;
  RunDecoder& d = Paced(r);
  const int64_t before = d.LastClosed(rank);
  const uint64_t closed_before = d.counters().steps_closed;
  LogReader::Record rec;
  while (d.LastClosed(rank) < static_cast<int64_t>(std::min<uint64_t>(step, INT64_MAX))) {
    auto res = r->source->Next(&rec);
    if (res != LogReader::Result::kRecord) {
      if (r->readback && !finishing_ && res != LogReader::Result::kCorrupt) break;  // not written yet
      if (res != LogReader::Result::kEnd) spdlog::warn("{} log: {}", r->readback ? "run" : "baseline", r->source->problem());
      r->source_done = true;
      r->ended = true;
      d.CloseAll();
      spdlog::info("{} {} ends at step {} (rank {})", r->readback ? "run" : "baseline", r->id, d.LastClosed(rank), rank);
      return true;
    }
    auto env = LogReader::Envelope(rec);
    if (!env.ok()) continue;
    d.Consume(**env, rec.recv_unix_ns);
  }
  return d.LastClosed(rank) > before || d.counters().steps_closed > closed_before;
}

void Analyzer::Match(PairState* p) {
  RunState* b = p->b;
  RunState* c = p->c;
  for (auto& [rank, cbuf] : c->buffer) {
    while (true) {
      if (cbuf.empty()) {
        // A read-back candidate: its next step from its log, once the baseline can
        // answer it (a baseline read from a log always can: it is read on demand).
        if (!c->readback || c->source_done) break;
        const int64_t next = Paced(c).LastClosed(rank) + 1;
        const bool b_ready = b->source || RankEnded(b, rank) || Paced(b).LastClosed(rank) >= next;
        if (!b_ready) break;
        const bool progressed = Pull(c, rank, static_cast<uint64_t>(next));
        if (cbuf.empty()) {
          if (progressed) continue;  // a step compared before the switch: skipped
          break;
        }
      }
      const uint64_t s = cbuf.begin()->first;
      auto& bbuf = b->buffer[rank];
      auto it = bbuf.find(s);
      if (it == bbuf.end() && b->source && !b->source_done && Paced(b).LastClosed(rank) < static_cast<int64_t>(s)) {
        Pull(b, rank, s);
        it = bbuf.find(s);
      }
      int64_t& done = p->done.try_emplace(rank, -1).first->second;
      if (it == bbuf.end()) {
        const bool baseline_past = Paced(b).LastClosed(rank) >= static_cast<int64_t>(s) || RankEnded(b, rank);
        if (!baseline_past) break;  // the baseline has not reached s yet
        ++p->only_c;
      } else {
        // Baseline steps this pair skipped over (the candidate never had them).
        for (auto bi = bbuf.begin(); bi != it; ++bi) {
          if (static_cast<int64_t>(bi->first) > done) ++p->only_b;
        }
        Compare(p, rank, *it->second, *cbuf.begin()->second);
      }
      done = static_cast<int64_t>(s);
      counters_.buffered_bytes -= cbuf.begin()->second->ApproxBytes();
      --counters_.buffered_steps;
      cbuf.erase(cbuf.begin());
      Release(b, rank);
    }
  }
}

void Analyzer::Release(RunState* b, uint32_t rank) {
  int64_t min_done = INT64_MAX;
  for (PairState* p : b->pairs) {
    auto it = p->done.find(rank);
    min_done = std::min(min_done, it == p->done.end() ? -1 : it->second);
  }
  if (b->pairs.empty()) return;
  auto& bbuf = b->buffer[rank];
  while (!bbuf.empty() && static_cast<int64_t>(bbuf.begin()->first) <= min_done) {
    counters_.buffered_bytes -= bbuf.begin()->second->ApproxBytes();
    --counters_.buffered_steps;
    bbuf.erase(bbuf.begin());
  }
}

void Analyzer::NoteUnmatched(PairState* p, uint64_t key, bool in_baseline, uint64_t step) {
  auto [it, inserted] = p->unmatched.try_emplace(key);
  ++it->second.steps;
  if (!inserted) return;
  it->second.in_baseline = in_baseline;
  it->second.first_step = step;
  ++counters_.unmatched_tensors;
  spdlog::info("experiment {}: tensor {} ({}) exists only in the {} run {} (first at step {}); it is listed, not compared",
               p->ctx.experiment, names_.Name(KeyNameId(key)), KindName(KeyKind(key)),
               in_baseline ? "baseline" : "candidate", in_baseline ? p->b->id : p->c->id, step);
}

void Analyzer::CheckSetup(PairState* p, uint64_t step, uint32_t rank) {
  if (p->facts.setup_known) return;
  const Fingerprint& fb = p->b->decoder->fingerprint();
  const Fingerprint& fc = p->c->decoder->fingerprint();
  if (fb.empty() || fc.empty()) return;  // an agent without fingerprints: nothing to say
  p->facts.setup_known = true;
  p->facts.setup = DiffFingerprints(fb, fc);
  if (p->facts.setup.empty()) return;
  bool warn = false;
  for (const SetupDiff& d : p->facts.setup) warn = warn || d.severity != alerting::Severity::kInfo;
  auto a = p->ctx.Make("setup", warn ? alerting::Severity::kWarning : alerting::Severity::kInfo, step, rank);
  a.metric = "setup_differences";
  a.error = static_cast<double>(p->facts.setup.size());
  a.message = "runs " + p->b->id + " and " + p->c->id + " are set up differently: " + DescribeSetup(p->facts.setup);
  emitter_.Emit(std::move(a));
}

void Analyzer::Compare(PairState* p, uint32_t rank, const StepData& bs, const StepData& cs) {
  CheckSetup(p, cs.step, rank);
  if (p->facts.first_step < 0) p->facts.first_step = static_cast<int64_t>(cs.step);
  const RulesConfig& cfg = opt_.rules;
  const DT pair_precision = LowerPrecision(p->b->precision, p->c->precision);
  auto& matched = p->matched;
  matched.clear();
  const auto& br = bs.rows;
  const auto& cr = cs.rows;
  size_t i = 0, j = 0;
  while (i < br.size() || j < cr.size()) {
    if (j == cr.size() || (i < br.size() && br[i].key < cr[j].key)) {
      NoteUnmatched(p, br[i].key, true, bs.step);
      ++i;
    } else if (i == br.size() || cr[j].key < br[i].key) {
      NoteUnmatched(p, cr[j].key, false, cs.step);
      ++j;
    } else if (br[i].repeat || cr[j].repeat) {
      // The same tensor as the row before it, under another name (a container whose
      // output is its child's): compared once, as its producer, which shows the alias.
      ++i;
      ++j;
    } else {
      const StatRow& b = br[i];
      const StatRow& c = cr[j];
      const DT prec = LowerPrecision(pair_precision, LowerPrecision(b.dtype, c.dtype));
      MatchedTensor m;
      m.b = &b;
      m.c = &c;
      m.eval = EvaluatePair(bs, b, cs, c, cfg.TensorTolerance(prec == DT::kUnknown ? DT::kF32 : prec));
      auto [tit, inserted] = p->tracks.try_emplace(b.key);
      m.track = &tit->second;
      if (inserted) {
        m.track->key = b.key;
        m.track->dtype_b = b.dtype;
        m.track->dtype_c = c.dtype;
      }
      m.threshold = m.track->Threshold(cfg);
      matched.push_back(m);
      ++i;
      ++j;
    }
  }
  std::sort(matched.begin(), matched.end(),
            [](const MatchedTensor& x, const MatchedTensor& y) { return x.c->order < y.c->order; });

  PairStepView v;
  v.step = cs.step;
  v.rank = rank;
  v.b = &bs;
  v.c = &cs;
  v.precision = pair_precision == DT::kUnknown ? DT::kF32 : pair_precision;
  v.matched = &matched;
  for (auto& d : p->detectors) {
    const uint64_t n = emitter_.total();
    d->OnPairStep(v);
    if (!p->diverged && emitter_.total() > n && emitter_.last().rule == "first_divergence") {
      p->diverged = true;
      p->first_divergence = emitter_.last();
    }
  }

  for (MatchedTensor& m : matched) {
    TensorTrack& t = *m.track;
    t.order = m.c->order;
    ++t.compared;
    if (t.floor_n < static_cast<uint32_t>(cfg.floor_steps)) {
      if (std::isfinite(m.eval.score)) t.floor = std::max(t.floor, m.eval.score);
      ++t.floor_n;
    }
    if (m.drifting() && t.first_drift_step < 0) t.first_drift_step = static_cast<int64_t>(cs.step);
    const double ratio = m.eval.score / m.threshold;
    if (ratio > t.worst_score) {
      t.worst_score = ratio;
      t.worst_step = cs.step;
      t.worst = m.eval;
      t.worst_b_l2 = m.b->l2;
      t.worst_c_l2 = m.c->l2;
      t.worst_threshold = m.threshold;
    }
  }
  if (bs.has_scalars && cs.has_scalars) {
    p->loss_b = bs.scalars.loss;
    p->loss_c = cs.scalars.loss;
    p->loss_b_given = bs.scalars.loss_given;
    p->loss_c_given = cs.scalars.loss_given;
  }
  ++p->steps_compared;
  ++counters_.steps_compared;
  counters_.pairs_compared += matched.size();
  if (observer_) observer_(p->ctx, v);
}

std::vector<PairReport> Analyzer::Reports() const {
  std::vector<PairReport> out;
  for (const auto& p : pairs_) {
    PairReport r;
    r.experiment = p->ctx.experiment;
    r.baseline = p->b->id;
    r.candidate = p->c->id;
    r.steps_compared = p->steps_compared;
    r.steps_only_baseline = p->only_b;
    r.steps_only_candidate = p->only_c;
    r.steps_evicted = p->evicted;
    r.loss_b = p->loss_b;
    r.loss_c = p->loss_c;
    r.loss_b_given = p->loss_b_given;
    r.loss_c_given = p->loss_c_given;
    r.diverged = p->diverged;
    if (p->diverged) r.first_divergence = p->first_divergence;
    r.setup_known = p->facts.setup_known;
    r.setup = p->facts.setup;
    for (const auto& [key, t] : p->tracks) {
      TensorReport tr;
      tr.name = names_.Name(KeyNameId(key));
      tr.label = names_.Label(KeyNameId(key), static_cast<uint8_t>(KeyKind(key)));
      tr.aliases = names_.Aliases(KeyNameId(key), static_cast<uint8_t>(KeyKind(key)));
      tr.kind = KindName(KeyKind(key));
      tr.micro_step = KeyMicroStep(key);
      tr.order = t.order;
      tr.dtype_b = DTypeName(t.dtype_b);
      tr.dtype_c = DTypeName(t.dtype_c);
      tr.steps = t.compared;
      tr.worst_step = t.worst_step;
      tr.b_l2 = t.worst_b_l2;
      tr.c_l2 = t.worst_c_l2;
      tr.rel_l2 = t.worst.rel_l2;
      tr.rel_mean = t.worst.rel_mean;
      tr.rel_absmax = t.worst.rel_absmax;
      tr.rel_std = t.worst.rel_std;
      tr.cosine = t.worst.cosine;
      tr.rel_dist = t.worst.rel_dist;
      tr.kl = t.worst.kl;
      tr.score = t.worst.score;
      tr.threshold = t.worst_threshold;
      tr.metric = MetricName(t.worst.dominant);
      tr.first_drift_step = t.first_drift_step;
      if (t.worst.nonfinite_mismatch) {
        tr.status = "nonfinite";
      } else if (t.worst_score >= opt_.rules.critical_factor) {
        tr.status = "critical";
      } else if (t.first_drift_step >= 0) {
        tr.status = "drift";
      } else {
        tr.status = "ok";
      }
      r.tensors.push_back(std::move(tr));
    }
    std::sort(r.tensors.begin(), r.tensors.end(), [](const TensorReport& a, const TensorReport& b) {
      return a.order != b.order ? a.order < b.order : a.name < b.name;
    });
    for (const auto& [key, u] : p->unmatched) {
      r.unmatched.push_back(UnmatchedReport{names_.Name(KeyNameId(key)), KindName(KeyKind(key)),
                                            u.in_baseline ? "baseline" : "candidate", u.first_step, u.steps});
    }
    std::sort(r.unmatched.begin(), r.unmatched.end(),
              [](const UnmatchedReport& a, const UnmatchedReport& b) { return a.first_step != b.first_step ? a.first_step < b.first_step : a.name < b.name; });
    out.push_back(std::move(r));
  }
  return out;
}

AnalyzerCounters Analyzer::counters() const {
  AnalyzerCounters c = counters_;
  c.late_records = 0;
  c.unknown_ids = 0;
  for (const auto& [id, r] : runs_) {
    c.late_records += r->decoder->counters().late_records;
    c.unknown_ids += r->decoder->counters().unknown_ids;
  }
  return c;
}

}  // namespace lockstep::collector
