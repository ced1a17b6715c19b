#include "ingest/control_requests.h"

#include <algorithm>
#include <random>
#include <utility>

#include "lockstep/common/wire.h"
#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::collector {
namespace {

// Requests kept for Snapshot() (the oldest settled ones go first).
constexpr size_t kMaxKept = 256;

const char* StatusName(wire::AckStatus s) {
  switch (s) {
    case wire::AckStatus::Received: return "received";
    case wire::AckStatus::Done: return "done";
    case wire::AckStatus::Refused: return "refused";
    case wire::AckStatus::Ignored: return "ignored";
  }
  return "unknown";
}

uint64_t RandomStart() {
  std::random_device rd;
  // The top bits random, the low 32 counting: ids of two collector sessions do not meet.
  return (static_cast<uint64_t>(rd()) << 32) | 1u;
}

}  // namespace

ControlRequests::ControlRequests(int64_t republish_ns, int64_t expire_ns,
                                 std::function<uint32_t(const std::string&)> world_size)
    : republish_ns_(republish_ns), expire_ns_(expire_ns), world_size_(std::move(world_size)), next_id_(RandomStart()) {}

uint64_t ControlRequests::Add(ControlRequestSpec spec, int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.size() >= kMaxKept) {
    auto old = std::find_if(entries_.begin(), entries_.end(), [](const Entry& e) { return e.state.settled; });
    entries_.erase(old != entries_.end() ? old : entries_.begin());
  }
  Entry e;
  e.state.id = next_id_++;
  e.state.spec = std::move(spec);
  e.state.created_unix_ns = now_ns;
  e.next_ns = now_ns;  // published at the ingest thread's next turn
  entries_.push_back(std::move(e));
  return entries_.back().state.id;
}

std::string ControlRequests::Encode(uint64_t id, const ControlRequestSpec& s, int64_t now_ns) {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto req = wire::CreateControlRequest(fbb, kSchemaMajor, id, fbb.CreateString(s.experiment),
                                        fbb.CreateString(s.run), s.rank, fbb.CreateString(s.action),
                                        fbb.CreateString(s.target), s.step, s.steps, now_ns);
  fbb.Finish(req);
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
}

std::vector<std::string> ControlRequests::Due(int64_t now_ns, bool subscribed) {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (Entry& e : entries_) {
    ControlRequestState& st = e.state;
    if (st.settled) continue;
    if (now_ns - st.created_unix_ns >= expire_ns_) {
      st.settled = st.expired = true;
      continue;
    }
    if (!subscribed && now_ns < e.next_ns) continue;
    out.push_back(Encode(st.id, st.spec, now_ns));
    ++st.publications;
    e.next_ns = now_ns + republish_ns_;
  }
  return out;
}

std::optional<SelfReplayResult> ControlRequests::SelfReplayOf(const wire::ControlAck& ack) {
  const wire::SelfReplay* r = ack.replay();
  if (r == nullptr) return std::nullopt;
  auto str = [](const flatbuffers::String* s) { return s == nullptr ? std::string() : s->str(); };
  auto pairs = [&str](const flatbuffers::Vector<flatbuffers::Offset<wire::KeyValue>>* kv) {
    std::vector<std::pair<std::string, std::string>> out;
    if (kv == nullptr) return out;
    for (const wire::KeyValue* e : *kv) {
      if (e != nullptr) out.emplace_back(str(e->key()), str(e->value()));
    }
    return out;
  };
  SelfReplayResult s;
  s.file = str(r->file());
  s.row = str(r->row());
  s.dtype = str(r->dtype());
  s.coarsest = str(r->coarsest());
  s.max_rel_error = r->max_rel_error();
  s.ulps = r->ulps();
  s.width = r->width();
  s.settings_digest = str(r->settings_digest());
  s.inputs_digest = str(r->inputs_digest());
  s.output_digest = str(r->output_digest());
  s.settings = pairs(r->settings());
  s.precision = pairs(r->precision());
  s.error = str(r->error());
  return s;
}

bool ControlRequests::OnAnswer(const std::string& run, uint32_t rank, const wire::ControlAck& ack,
                               ControlRequestState* now, uint16_t schema_minor) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Entry& e : entries_) {
    ControlRequestState& st = e.state;
    if (st.id != ack.id()) continue;
    if (!st.spec.run.empty() && st.spec.run != run) return false;
    ControlAnswer a;
    a.rank = rank;
    a.status = StatusName(ack.status());
    a.step = ack.step();
    if (ack.detail() != nullptr) a.detail = ack.detail()->str();
    a.schema_minor = schema_minor;
    a.replay = SelfReplayOf(ack);
    auto it = std::find_if(st.answers.begin(), st.answers.end(), [&](const ControlAnswer& x) { return x.rank == rank; });
    // "received" never replaces a final answer (publications cross the answers).
    if (it == st.answers.end()) {
      st.answers.push_back(std::move(a));
      std::sort(st.answers.begin(), st.answers.end(),
                [](const ControlAnswer& x, const ControlAnswer& y) { return x.rank < y.rank; });
    } else if (a.status != "received") {
      *it = std::move(a);
    }
    const uint32_t world = std::max<uint32_t>(1, world_size_ ? world_size_(run) : 1);
    size_t final_answers = 0;
    for (const ControlAnswer& x : st.answers) final_answers += x.status != "received";
    // A request for every run is never settled by one run's answers: it expires.
    if (!st.spec.run.empty() && (st.spec.rank >= 0 ? final_answers >= 1 : final_answers >= world)) st.settled = true;
    if (now != nullptr) *now = st;
    return true;
  }
  return false;
}

std::vector<ControlRequestState> ControlRequests::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ControlRequestState> out;
  out.reserve(entries_.size());
  for (const Entry& e : entries_) out.push_back(e.state);
  return out;
}

}  // namespace lockstep::collector
