// Aligner (aligner.h): the steps waiting for their partner, the memory bound, and the
// merge-join of a pair's steps by (rank, step).
#include <algorithm>
#include <cstdint>
#include <utility>

#include <spdlog/spdlog.h>

#include "align/aligner.h"
#include "align/aligner_state.h"

namespace lockstep::collector {

namespace {

// No more steps of `rank` will come to pair: the run ended (Finish, its log is done)
// or, live, that rank said Goodbye, or it is a rank the run never had and every rank
// it has said Goodbye. A read-back run ends with its log only.
bool RankEnded(const auto* r, uint32_t rank) {
  if (r->ended) return true;
  if (r->readback) return false;
  if (r->ranks_seen.count(rank) != 0) return r->ranks_ended.count(rank) != 0;
  return !r->ranks_ended.empty() && r->ranks_ended.size() == r->ranks_seen.size();
}

}  // namespace

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

void Aligner::Drain() {
  while (dirty_) {
    dirty_ = false;
    for (auto& p : pairs_) Match(p.get());
  }
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

}  // namespace lockstep::collector
