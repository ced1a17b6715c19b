// Aligner (aligner.h): the entry points and each run's bookkeeping (its decoder, the
// ranks heard from and ended), and the counters. aligner_state.h lists the other parts.
#include "align/aligner.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "align/aligner_state.h"
#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::collector {

namespace {

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
