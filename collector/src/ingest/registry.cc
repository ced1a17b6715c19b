#include "lockstep/collector/registry.h"

#include <algorithm>

#include "lockstep/common/wire_names.h"
#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::collector {
namespace {

std::string Str(const flatbuffers::String* s) {
  return s == nullptr ? std::string() : std::string(s->c_str(), s->size());
}

void SeeStep(RankInfo& r, uint64_t step, bool authoritative) {
  // Stats and scalars carry the step being recorded: take it as is (a restarted job
  // may go back). Heartbeats and goodbyes only move it forward.
  if (authoritative || !r.has_step || step > r.last_step) r.last_step = step;
  r.has_step = true;
}

}  // namespace

RankInfo& Registry::Rank(std::string_view run, uint32_t rank) {
  auto it = runs_.find(run);
  if (it == runs_.end()) it = runs_.emplace(std::string(run), std::map<uint32_t, RankInfo>{}).first;
  auto& ranks = it->second;
  auto rit = ranks.find(rank);
  if (rit == ranks.end()) {
    rit = ranks.emplace(rank, RankInfo{}).first;
    rit->second.run = it->first;
    rit->second.rank = rank;
  }
  return rit->second;
}

void Registry::CountSeq(RankInfo& r, uint64_t seq) {
  if (!r.any_seq) {
    r.any_seq = true;
    r.first_seq = r.last_seq = seq;
  }
  r.first_seq = std::min(r.first_seq, seq);
  r.last_seq = std::max(r.last_seq, seq);
  if (seq == r.next_seq) {
    ++r.next_seq;
    return;
  }
  if (seq > r.next_seq) {
    r.gaps += seq - r.next_seq;
    r.missing.emplace_back(r.next_seq, seq);
    // Beyond the cap the oldest holes are forgotten: still counted as gaps, but a very
    // late arrival into one would then be called a duplicate.
    if (r.missing.size() > kMaxMissingRanges) r.missing.erase(r.missing.begin());
    r.next_seq = seq + 1;
    return;
  }
  // Below next_seq: fills a hole, or was seen already.
  auto it = std::upper_bound(r.missing.begin(), r.missing.end(), seq,
                             [](uint64_t s, const auto& range) { return s < range.first; });
  if (it != r.missing.begin()) {
    auto& range = *std::prev(it);
    if (seq >= range.first && seq < range.second) {
      --r.gaps;
      uint64_t lo = range.first, hi = range.second;
      auto pos = std::prev(it);
      if (seq == lo && seq + 1 == hi) {
        r.missing.erase(pos);
      } else if (seq == lo) {
        pos->first = seq + 1;
      } else if (seq + 1 == hi) {
        pos->second = seq;
      } else {
        pos->second = seq;
        r.missing.insert(std::next(pos), {seq + 1, hi});
      }
      return;
    }
  }
  ++r.duplicates;
}

void Registry::OnMessage(const wire::Envelope& env, int64_t recv_unix_ns, size_t bytes) {
  std::string_view run(env.run_id()->c_str(), env.run_id()->size());
  std::lock_guard<std::mutex> lock(mu_);
  RankInfo& r = Rank(run, env.rank());
  if (r.messages == 0) {
    r.first_recv_unix_ns = recv_unix_ns;
    r.sessions = 1;
  }

  if (env.body_type() == wire::Body::Hello) {
    const auto* h = env.body_as_Hello();
    bool new_session = r.hello_seen && (h->pid() != r.pid || h->start_unix_ns() != r.start_unix_ns);
    if (new_session) {
      // The agent restarted: its numbering and counters start over.
      ++r.sessions;
      r.next_seq = 0;
      r.any_seq = false;
      r.missing.clear();
      r.goodbye = false;
      r.goodbye_reason.clear();
      r.hb_base_enq = r.agent_records_enqueued;
      r.hb_base_sent = r.agent_records_sent;
      r.hb_base_drop = r.agent_records_dropped;
      r.hb_base_mdrop = r.agent_messages_dropped;
      r.hb_base_err = r.agent_errors;
    }
    r.hello_seen = true;
    r.experiment = Str(h->experiment());
    r.role = wire::RoleName(static_cast<uint8_t>(h->role()));
    r.platform = Str(h->platform());
    r.device_name = Str(h->device_name());
    r.framework = Str(h->framework());
    r.host = Str(h->host());
    r.agent_version = Str(h->agent_version());
    r.world_size = h->world_size();
    r.pid = h->pid();
    r.start_unix_ns = h->start_unix_ns();
    r.start_step = h->start_step();
  }

  CountSeq(r, env.seq());
  ++r.messages;
  r.bytes += bytes;
  r.last_recv_unix_ns = recv_unix_ns;

  switch (env.body_type()) {
    case wire::Body::StepStats: {
      const auto* s = env.body_as_StepStats();
      uint64_t n = s->stats() ? s->stats()->size() : 0;
      r.stat_records += n;
      r.records += n;
      SeeStep(r, s->step(), true);
      break;
    }
    case wire::Body::StepScalars:
      ++r.scalar_records;
      ++r.records;
      SeeStep(r, env.body_as_StepScalars()->step(), true);
      break;
    case wire::Body::Heartbeat: {
      const auto* hb = env.body_as_Heartbeat();
      r.agent_records_enqueued = r.hb_base_enq + hb->records_enqueued();
      r.agent_records_sent = r.hb_base_sent + hb->records_sent();
      r.agent_records_dropped = r.hb_base_drop + hb->records_dropped();
      r.agent_messages_dropped = r.hb_base_mdrop + hb->messages_dropped();
      r.agent_errors = r.hb_base_err + hb->errors();
      r.agent_queue_depth = hb->queue_depth();
      r.last_heartbeat_unix_ns = recv_unix_ns;
      SeeStep(r, hb->last_step(), false);
      break;
    }
    case wire::Body::Goodbye: {
      const auto* g = env.body_as_Goodbye();
      r.goodbye = true;
      r.goodbye_reason = Str(g->reason());
      SeeStep(r, g->last_step(), false);
      break;
    }
    default:
      break;
  }
}

void Registry::OnBad(std::string_view run, uint32_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  ++Rank(run, rank).bad_messages;
}

std::vector<RankInfo> Registry::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RankInfo> out;
  for (const auto& [run, ranks] : runs_)
    for (const auto& [rank, info] : ranks) out.push_back(info);
  return out;
}

bool Registry::Get(std::string_view run, uint32_t rank, RankInfo* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = runs_.find(run);
  if (it == runs_.end()) return false;
  auto rit = it->second.find(rank);
  if (rit == it->second.end()) return false;
  *out = rit->second;
  return true;
}

RegistryTotals Registry::Totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  RegistryTotals t;
  t.runs = runs_.size();
  for (const auto& [run, ranks] : runs_) {
    for (const auto& [rank, r] : ranks) {
      ++t.ranks;
      t.messages += r.messages;
      t.records += r.records;
      t.gaps += r.gaps;
      t.duplicates += r.duplicates;
      t.agent_records_dropped += r.agent_records_dropped;
      t.bad_messages += r.bad_messages;
    }
  }
  return t;
}

}  // namespace lockstep::collector
