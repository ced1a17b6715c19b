#include "align/run_decoder.h"

#include <algorithm>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "lockstep/common/wire.h"
#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::collector {
namespace {

// Agent-local tensor ids are dense small integers; a larger one is a broken agent,
// and must not make us allocate a huge directory.
constexpr uint32_t kMaxTensorId = 1u << 22;
// How far past twice the declared count an id may reach (directory chunks arrive in
// order, but a reconnect may resend them after later ones).
constexpr size_t kDirectorySlack = 4096;
constexpr uint32_t kMaxLag = 2;
// Sessions remembered per rank (the oldest ended ones are forgotten first).
constexpr size_t kMaxSessions = 32;

std::string Who(const wire::Envelope& env) {
  char id[32];
  std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(env.session()));
  if (env.body_type() != wire::Body::Hello) return std::string("session ") + id;
  const auto* h = env.body_as_Hello();
  return "host " + (h->host() ? h->host()->str() : std::string("?")) + " pid " + std::to_string(h->pid()) +
         " (session " + id + ")";
}

}  // namespace

RunDecoder::RunDecoder(std::string run_id, const NameCanonicalizer* canon, NameTable* names,
                       int64_t idle_close_ns, ClosedFn on_closed, int64_t settle_ns)
    : run_id_(std::move(run_id)),
      canon_(canon),
      names_(names),
      idle_close_ns_(idle_close_ns),
      settle_ns_(settle_ns),
      on_closed_(std::move(on_closed)) {}

RunDecoder::RankState& RunDecoder::Rank(uint32_t rank) {
  auto [it, inserted] = ranks_.try_emplace(rank);
  if (inserted) it->second.settle_ns = settle_ns_;
  return it->second;
}

const TensorMeta* RunDecoder::Meta(uint32_t rank, uint32_t id) const {
  auto it = ranks_.find(rank);
  if (it == ranks_.end() || id >= it->second.dir.size() || !it->second.dir[id].known) return nullptr;
  return &it->second.dir[id];
}

int64_t RunDecoder::LastClosed(uint32_t rank) const {
  auto it = ranks_.find(rank);
  return it == ranks_.end() ? -1 : it->second.last_closed;
}

std::shared_ptr<StepData> RunDecoder::OpenStep(RankState& rs, uint32_t rank, uint64_t step,
                                               int64_t sent_ns) {
  auto it = rs.open.find(step);
  if (it != rs.open.end()) return it->second;
  auto sd = std::make_shared<StepData>();
  sd->step = step;
  sd->rank = rank;
  sd->first_sent_ns = sent_ns;
  rs.open.emplace(step, sd);
  return sd;
}

void RunDecoder::NoteLate(RankState& rs, uint32_t rank, uint64_t step, uint64_t n) {
  counters_.late_records += n;
  // Only a record for the most recently closed step teaches us to wait longer; older
  // ones are a rewind or a reordering we do not try to follow.
  if (static_cast<int64_t>(step) == rs.last_closed) {
    switch (rs.last_cause) {
      case Cause::kAtScalars:
        rs.stats_after_scalars = true;
        break;
      case Cause::kAfterScalars:
        rs.scalars_close_ok = false;
        break;
      case Cause::kSettle:
        rs.settle_ns = std::min(rs.settle_ns * 2, idle_close_ns_ > 0 ? idle_close_ns_ : rs.settle_ns * 2);
        break;
      case Cause::kData:
        if (rs.lag < kMaxLag && !rs.step_end) ++rs.lag;
        break;
      case Cause::kStepEnd:
        break;  // the agent said the step was over: nothing to learn, the rows were late
    }
  }
  if (!rs.warned_late) {
    rs.warned_late = true;
    spdlog::warn(
        "run {} rank {}: {} statistics record(s) for step {} arrived after the step was compared; "
        "they are counted as late and not compared (later steps now wait for them)",
        run_id_, rank, n, step);
  }
}

bool RunDecoder::Rewound(RankState& rs, uint32_t rank, uint64_t step, uint64_t n) {
  if (rs.new_session) {
    // The first step of a new session: a resumed job continues its numbering (start_step);
    // one that starts below where the old session got to repeats step numbers.
    rs.new_session = false;
    rs.rewound = static_cast<int64_t>(step) <= rs.rewind_from;
    if (rs.rewound) {
      ++counters_.restarts;
      CloseThrough(rs, INT64_MAX, Cause::kData);  // what the old session left open
      spdlog::warn(
          "run {} rank {}: a new session started at step {} after the previous one reached step {} (a restart "
          "without start_step?); steps up to {} of the new session are not compared",
          run_id_, rank, step, rs.rewind_from, rs.rewind_from);
      if (on_rewind_) on_rewind_(Rewind{Rewind::What::kRestart, rank, static_cast<uint64_t>(rs.rewind_from), step, {}, {}});
    }
  }
  if (!rs.rewound) return false;
  if (static_cast<int64_t>(step) > rs.rewind_from) {
    rs.rewound = false;  // past the old numbering: its steps are new again
    return false;
  }
  counters_.rewound_records += n;
  return true;
}

void RunDecoder::OnStepEnd(RankState& rs, const wire::StepEnd& e) {
  rs.step_end = true;
  const uint64_t step = e.step();
  auto it = rs.open.find(step);
  if (it == rs.open.end() && static_cast<int64_t>(step) <= rs.last_closed) return;  // closed already
  uint64_t rows = 0;
  if (auto w = rs.wire_rows.find(step); w != rs.wire_rows.end()) rows = w->second;
  if (e.records() > rows) counters_.records_missing += e.records() - rows;
  rs.wire_rows.erase(rs.wire_rows.begin(), rs.wire_rows.upper_bound(step));
  // A step whose rows and scalars were all lost has nothing to compare: none is made up.
  CloseThrough(rs, static_cast<int64_t>(step), Cause::kStepEnd);
}

void RunDecoder::NoteAliases(const std::vector<StatRow>& rows) {
  // A repeat's producer is the record just before it on the agent's thread: the row of
  // the same kind and micro step with the highest lower order and the same statistics
  // (a chain of repeats resolves to the first).
  std::vector<const StatRow*> by_order;
  for (const StatRow& r : rows) {
    // A module's input that repeats the output before it is not another name of it.
    if (!r.repeat || KeyKind(r.key) == Kind::kActIn) continue;
    if (by_order.empty()) {
      for (const StatRow& x : rows) by_order.push_back(&x);
      std::sort(by_order.begin(), by_order.end(),
                [](const StatRow* a, const StatRow* b) { return a->order < b->order; });
    }
    auto pos = std::lower_bound(by_order.begin(), by_order.end(), r.order,
                                [](const StatRow* a, uint32_t o) { return a->order < o; });
    const StatRow* cur = &r;
    for (auto it = pos; it != by_order.begin();) {
      const StatRow* p = *--it;
      if (KeyKind(p->key) != KeyKind(cur->key) || KeyMicroStep(p->key) != KeyMicroStep(cur->key) ||
          p->numel != cur->numel || !(p->l2 == cur->l2 || (p->l2 != p->l2 && cur->l2 != cur->l2)))
        continue;
      cur = p;
      if (!p->repeat) break;
    }
    if (cur != &r && !cur->repeat)
      names_->AddAlias(KeyNameId(cur->key), KeyNameId(r.key), static_cast<uint8_t>(KeyKind(r.key)));
  }
}

void RunDecoder::CloseOne(RankState& rs, std::shared_ptr<StepData> step) {
  auto& rows = step->rows;
  std::sort(rows.begin(), rows.end(),
            [](const StatRow& a, const StatRow& b) { return a.key < b.key; });
  // Keep the last of duplicate keys (a re-sent record replaces the older one). After a
  // stable-enough sort equal keys are adjacent; which one survives is not important
  // enough to pay for stable_sort.
  size_t w = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (w > 0 && rows[w - 1].key == rows[i].key) {
      rows[w - 1] = rows[i];
      ++counters_.duplicate_rows;
    } else {
      rows[w++] = rows[i];
    }
  }
  rows.resize(w);
  NoteAliases(rows);
  rs.last_closed = std::max<int64_t>(rs.last_closed, static_cast<int64_t>(step->step));
  if (!rs.wire_rows.empty()) rs.wire_rows.erase(step->step);
  ++counters_.steps_closed;
  if (static_cast<int64_t>(step->step) == rs.scalars_step) rs.scalars_step = -1;
  if (rs.last_cause == Cause::kAtScalars) ++counters_.closed_at_scalars;
  if (rs.last_cause == Cause::kAfterScalars) ++counters_.closed_after_scalars;
  if (rs.last_cause == Cause::kSettle) ++counters_.closed_by_settle;
  if (rs.last_cause == Cause::kStepEnd) ++counters_.closed_at_step_end;
  const uint32_t rank = step->rank;
  on_closed_(rank, std::move(step));
}

void RunDecoder::BoundOpen(RankState& rs) {
  while (rs.open.size() > kMaxOpenSteps) {
    auto sd = std::move(rs.open.begin()->second);
    rs.open.erase(rs.open.begin());
    rs.last_cause = Cause::kData;
    CloseOne(rs, std::move(sd));
  }
}

void RunDecoder::CloseThrough(RankState& rs, int64_t through_step, Cause cause) {
  while (!rs.open.empty() && static_cast<int64_t>(rs.open.begin()->first) <= through_step) {
    auto sd = std::move(rs.open.begin()->second);
    rs.open.erase(rs.open.begin());
    rs.last_cause = cause;
    CloseOne(rs, std::move(sd));
  }
}

bool RunDecoder::SetApart(RankState& rs, uint32_t rank, const wire::Envelope& env) {
  const uint64_t s = env.session();
  if (s == 0) return false;  // an older agent: sessions cannot be told apart
  const bool hello = env.body_type() == wire::Body::Hello;
  if (hello) {
    // A session that says Hello as this rank has left any other rank it spoke as (an
    // agent that learned its rank after sending): there it is over, not a duplicate.
    for (auto& [r, other] : ranks_) {
      if (r == rank) continue;
      auto o = other.sessions.find(s);
      if (o != other.sessions.end()) o->second.ended = true;
    }
  }
  auto it = rs.sessions.find(s);
  if (it == rs.sessions.end()) {
    if (rs.sessions.size() >= kMaxSessions) {
      auto victim = rs.sessions.end();
      for (auto j = rs.sessions.begin(); j != rs.sessions.end(); ++j) {
        if (j->first == rs.session) continue;
        if (victim == rs.sessions.end() || (j->second.ended && !victim->second.ended) ||
            (j->second.ended == victim->second.ended && j->second.seq < victim->second.seq))
          victim = j;
      }
      if (victim != rs.sessions.end()) rs.sessions.erase(victim);
    }
    it = rs.sessions.emplace(s, RankState::SessionSeen{rs.next_seq++, false, false, Who(env)}).first;
    if (!hello && rs.session == 0) rs.session = s;  // its Hello was missed (e.g. before a collector restart)
    return false;
  }
  RankState::SessionSeen& me = it->second;
  if (hello && me.who.rfind("session ", 0) == 0) me.who = Who(env);
  if (me.apart) {
    ++counters_.apart_messages;
    return true;
  }
  if (env.body_type() == wire::Body::Goodbye) {
    me.ended = true;
    return s != rs.session && rs.session != 0;  // an old session's farewell closes nothing of the new one
  }
  if (s == rs.session || rs.session == 0 || me.ended) return false;
  // `s` was replaced by a later session, never said Goodbye, and speaks again: both live.
  Rewind ev;
  ev.what = Rewind::What::kDuplicate;
  ev.rank = rank;
  ev.kept = me.who;
  for (auto& [other, seen] : rs.sessions) {
    if (other == s || seen.ended || seen.apart || seen.seq < me.seq) continue;
    seen.apart = true;
    ++counters_.apart_sessions;
    ev.apart += (ev.apart.empty() ? "" : "; ") + seen.who;
  }
  rs.session = s;
  rs.new_session = false;
  rs.rewound = false;
  if (ev.apart.empty()) return false;
  const int64_t reached = std::max(rs.last_closed, rs.open.empty() ? int64_t{-1}
                                                                    : static_cast<int64_t>(rs.open.rbegin()->first));
  ev.from_step = ev.to_step = static_cast<uint64_t>(std::max<int64_t>(reached, 0));
  spdlog::warn("run {} rank {}: two live processes claim this rank: {} and {}; the latter's data is set apart "
               "(logged, not compared)",
               run_id_, rank, ev.kept, ev.apart);
  if (on_rewind_) on_rewind_(ev);
  return false;
}

void RunDecoder::Consume(const wire::Envelope& env, int64_t recv_ns) {
  const uint32_t rank = env.rank();
  RankState& rs = Rank(rank);
  if (SetApart(rs, rank, env)) return;
  rs.last_recv_ns = recv_ns;
  switch (env.body_type()) {
    case wire::Body::Hello: {
      rs.step_end = env.schema_minor() >= kStepEndMinor;
      // Another agent session of a rank that has steps already (sessions of older
      // agents, 0, cannot be told apart from a reconnection).
      const int64_t reached = std::max(rs.last_closed, rs.open.empty() ? int64_t{-1}
                                                                        : static_cast<int64_t>(rs.open.rbegin()->first));
      if (env.session() != 0 && env.session() != rs.session && reached >= 0) {
        rs.new_session = true;
        rs.rewind_from = reached;
      }
      rs.session = env.session();
      if (const auto* h = env.body_as_Hello(); h != nullptr) world_size_ = std::max(world_size_, h->world_size());
      return;
    }
    case wire::Body::StepEnd:
      if (Rewound(rs, rank, env.body_as_StepEnd()->step(), 0)) return;
      OnStepEnd(rs, *env.body_as_StepEnd());
      return;
    case wire::Body::TensorDirectory: {
      const auto* td = env.body_as_TensorDirectory();
      if (td->tensors() == nullptr) return;
      for (const wire::TensorInfo* ti : *td->tensors()) {
        if (ti == nullptr || ti->id() >= kMaxTensorId) continue;
        // The agent numbers its tensors 0, 1, 2...: the directory may be at most about
        // twice as long as the tensors declared, so one sparse id in a 100-byte message
        // cannot cost 64 MiB here. Rows of a skipped id count as unknown_ids.
        if (ti->id() >= rs.dir.size()) {
          if (ti->id() >= 2 * static_cast<size_t>(rs.declared) + kDirectorySlack) continue;
          rs.dir.resize(ti->id() + 1);
        }
        TensorMeta& m = rs.dir[ti->id()];
        if (!m.known) ++rs.declared;
        std::string raw = ti->name() ? ti->name()->str() : std::string("#") + std::to_string(ti->id());
        m.name_id = names_->Intern(canon_->Canonical(raw));
        if (ti->module_type() != nullptr) names_->SetModuleType(m.name_id, ti->module_type()->str());
        m.kind = static_cast<Kind>(ti->kind());
        if (m.kind == Kind::kActIn && ti->shape() != nullptr && ti->shape()->size() > 0) {
          const int64_t last = ti->shape()->Get(ti->shape()->size() - 1);
          if (last > 0) names_->SetWidth(m.name_id, static_cast<uint64_t>(last));
        }
        m.dtype = static_cast<DT>(ti->dtype());
        m.order = ti->order();
        m.known = true;
      }
      return;
    }
    case wire::Body::StepStats: {
      const auto* ss = env.body_as_StepStats();
      const uint64_t step = ss->step();
      const auto* stats = ss->stats();
      const size_t n = stats ? stats->size() : 0;
      if (Rewound(rs, rank, step, n)) return;
      if (static_cast<int64_t>(step) <= rs.last_closed && !rs.open.count(step)) {
        NoteLate(rs, rank, step, n);
        return;
      }
      auto sd = OpenStep(rs, rank, step, env.sent_unix_ns());
      sd->last_recv_ns = recv_ns;
      const uint16_t k = ss->sketch_k();
      const uint8_t hb = ss->hist_bins();
      const auto* sk = ss->sketch();
      const auto* hist = ss->hist();
      const bool have_sketch = k > 0 && sk != nullptr && sk->size() >= n * k;
      const bool have_hist = hb > 0 && hist != nullptr && hist->size() >= n * hb;
      sd->rows.reserve(sd->rows.size() + n);
      for (size_t i = 0; i < n; ++i) {
        const wire::TensorStat* t = stats->Get(static_cast<flatbuffers::uoffset_t>(i));
        const uint32_t id = t->tensor_id();
        if (id >= rs.dir.size() || !rs.dir[id].known) {
          ++counters_.unknown_ids;
          continue;
        }
        const TensorMeta& m = rs.dir[id];
        StatRow r;
        r.key = MakeKey(m.name_id, m.kind, t->micro_step());
        r.order = t->order();
        r.dtype = m.dtype;
        r.limit_dtype = static_cast<DT>(t->limit_dtype());
        r.numel = t->numel();
        r.min = t->min();
        r.max = t->max();
        r.mean = t->mean();
        r.std = t->std();
        r.l2 = t->l2();
        r.absmax = t->absmax();
        r.nan_count = t->nan_count();
        r.inf_count = t->inf_count();
        r.zero_count = t->zero_count();
        r.sat_count = t->sat_count();
        r.subnormal_count = t->subnormal_count();
        r.repeat = (t->flags() & static_cast<uint8_t>(wire::StatFlags::kRepeat)) != 0;
        r.stats_only = (t->flags() & static_cast<uint8_t>(wire::StatFlags::kStatsOnly)) != 0;
        r.device = (t->flags() & static_cast<uint8_t>(wire::StatFlags::kDevice)) != 0;
        if (have_sketch) {
          r.sketch_k = k;
          r.sketch_off = static_cast<uint32_t>(sd->sketch.size());
          const float* src = sk->data() + i * k;
          sd->sketch.insert(sd->sketch.end(), src, src + k);
        }
        if (have_hist) {
          r.hist_bins = hb;
          r.hist_off = static_cast<uint32_t>(sd->hist.size());
          const uint32_t* src = hist->data() + i * hb;
          sd->hist.insert(sd->hist.end(), src, src + hb);
        }
        sd->rows.push_back(r);
        ++counters_.records;
      }
      if (rs.step_end) {  // closed by its StepEnd
        rs.wire_rows[step] += n;
        BoundOpen(rs);
        return;
      }
      if (step > rs.lag) CloseThrough(rs, static_cast<int64_t>(step) - 1 - rs.lag, Cause::kData);
      if (static_cast<int64_t>(step) == rs.scalars_step) {
        // Rule 3b: the statistics that followed the scalars.
        if (rs.lag == 0 && rs.scalars_close_ok) CloseThrough(rs, static_cast<int64_t>(step), Cause::kAfterScalars);
      }
      return;
    }
    case wire::Body::StepScalars: {
      const auto* sc = env.body_as_StepScalars();
      const uint64_t step = sc->step();
      if (Rewound(rs, rank, step, 0)) return;
      if (static_cast<int64_t>(step) <= rs.last_closed && !rs.open.count(step)) {
        // Scalars of a closed step: the step has gone on without them. Not counted
        // as late statistics; the loss of that step is simply not compared.
        return;
      }
      auto sd = OpenStep(rs, rank, step, env.sent_unix_ns());
      sd->last_recv_ns = recv_ns;
      sd->scalars.loss = sc->loss();
      sd->scalars.loss_given =
          ScalarIsGiven(static_cast<uint8_t>(sc->given()), static_cast<uint8_t>(wire::ScalarGiven::Loss), sc->loss());
      sd->scalars.lr = sc->lr();
      sd->scalars.grad_norm = sc->grad_norm();
      sd->scalars.loss_scale = sc->loss_scale();
      sd->scalars.step_time_s = sc->step_time_s();
      sd->scalars.samples = sc->samples();
      sd->has_scalars = true;
      if (rs.step_end) {  // closed by its StepEnd
        BoundOpen(rs);
        return;
      }
      if (step > rs.lag + 1) CloseThrough(rs, static_cast<int64_t>(step) - 2 - rs.lag, Cause::kData);
      if (rs.lag != 0 || !rs.scalars_close_ok) return;
      if (!rs.stats_after_scalars && !sd->rows.empty()) {
        CloseThrough(rs, static_cast<int64_t>(step), Cause::kAtScalars);  // rule 3a
      } else {
        rs.scalars_step = static_cast<int64_t>(step);  // rule 3b
      }
      return;
    }
    case wire::Body::Goodbye:
      CloseThrough(rs, INT64_MAX, Cause::kData);
      return;
    case wire::Body::RunFingerprint: {
      // The run's fingerprint is its lowest rank's (ranks differ in dist.rank only);
      // a later message of that rank replaces it.
      if (fingerprint_rank_ >= 0 && rank > static_cast<uint32_t>(fingerprint_rank_)) return;
      fingerprint_rank_ = rank;
      fingerprint_.clear();
      if (const auto* es = env.body_as_RunFingerprint()->entries()) {
        for (const auto* e : *es) {
          if (e->key() != nullptr) fingerprint_[e->key()->str()] = e->value() ? e->value()->str() : std::string();
        }
      }
      ++fingerprint_version_;
      return;
    }
    default:
      return;
  }
}

void RunDecoder::Tick(int64_t now_ns) {
  if (idle_close_ns_ <= 0) return;
  for (auto& [rank, rs] : ranks_) {
    if (rs.open.empty()) continue;
    const int64_t silent = now_ns - rs.last_recv_ns;
    if (silent >= idle_close_ns_) {
      CloseThrough(rs, INT64_MAX, Cause::kData);
    } else if (rs.scalars_step >= 0 && silent >= rs.settle_ns) {
      CloseThrough(rs, rs.scalars_step, Cause::kSettle);  // rule 3b
    }
  }
}

void RunDecoder::Touch(int64_t now_ns) {
  for (auto& [rank, rs] : ranks_) rs.last_recv_ns = std::max(rs.last_recv_ns, now_ns);
}

void RunDecoder::CloseAll() {
  for (auto& [rank, rs] : ranks_) CloseThrough(rs, INT64_MAX, Cause::kData);
}

}  // namespace lockstep::collector
