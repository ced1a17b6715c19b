#include "cli/inspect_format.h"

#include <utility>

#include "lockstep/common/wire.h"
#include "lockstep/common/wire_names.h"
#include "lockstep/schema/lockstep_generated.h"
#include "lockstep/common/json_out.h"

namespace lockstep::collector {
namespace {

std::string_view Sv(const flatbuffers::String* s) {
  return s == nullptr ? std::string_view() : std::string_view(s->c_str(), s->size());
}

template <typename T>
void Ints(JsonOut& j, std::string_view key, const flatbuffers::Vector<T>* v) {
  j.Key(key).BeginArray();
  if (v != nullptr)
    for (auto x : *v) j.Int(static_cast<int64_t>(x));
  j.EndArray();
}

// "sampling": {...} (Hello.sampling, Sampling.config), or null.
void Sampling(JsonOut& j, const wire::SamplingConfig* s) {
  if (s == nullptr) {
    j.Key("sampling").Null();
    return;
  }
  j.Key("sampling").BeginObject()
      .FieldU("every", s->every())
      .FieldU("sketch_k", s->sketch_k())
      .FieldU("hist_bins", s->hist_bins())
      .Field("include", Sv(s->include()))
      .Field("exclude", Sv(s->exclude()));
  j.Key("kinds").BeginArray();
  if (s->kinds())
    for (auto k : *s->kinds()) j.Str(wire::KindName(static_cast<uint8_t>(k)));
  j.EndArray().EndObject();
}

void Hello(JsonOut& j, const wire::Hello& h) {
  j.Field("experiment", Sv(h.experiment()))
      .Field("role", wire::RoleName(static_cast<uint8_t>(h.role())))
      .Field("platform", Sv(h.platform()))
      .Field("device_name", Sv(h.device_name()))
      .Field("framework", Sv(h.framework()))
      .FieldU("world_size", h.world_size())
      .Field("host", Sv(h.host()))
      .FieldU("pid", h.pid())
      .Field("agent_version", Sv(h.agent_version()))
      .FieldI("start_unix_ns", h.start_unix_ns())
      .FieldU("start_step", h.start_step());
  Sampling(j, h.sampling());
}

}  // namespace

void InspectFormatter::Record(const wire::Envelope& env, int64_t recv_unix_ns, uint64_t offset,
                              uint32_t bytes, std::string* out) {
  JsonOut j(out);
  std::string run(Sv(env.run_id()));
  j.BeginObject()
      .FieldU("offset", offset)
      .FieldU("bytes", bytes)
      .FieldI("recv_unix_ns", recv_unix_ns)
      .Field("run", run)
      .FieldU("rank", env.rank())
      .FieldU("seq", env.seq())
      .FieldI("sent_unix_ns", env.sent_unix_ns())
      .FieldU("session", env.session())
      .Field("schema", std::to_string(env.schema_major()) + "." + std::to_string(env.schema_minor()))
      .Field("type", wire::EnumNameBody(env.body_type()));
  j.Key("body").BeginObject();
  switch (env.body_type()) {
    case wire::Body::Hello:
      Hello(j, *env.body_as_Hello());
      break;
    case wire::Body::TensorDirectory: {
      j.Key("tensors").BeginArray();
      if (const auto* ts = env.body_as_TensorDirectory()->tensors()) {
        for (const auto* t : *ts) {
          Tensor& d = directory_[{run, env.rank(), t->id()}];
          d.name = std::string(Sv(t->name()));
          d.kind = static_cast<uint8_t>(t->kind());
          d.dtype = static_cast<uint8_t>(t->dtype());
          d.shape.clear();
          if (t->shape()) d.shape.assign(t->shape()->begin(), t->shape()->end());
          j.BeginObject()
              .FieldU("id", t->id())
              .Field("name", d.name)
              .Field("kind", wire::KindName(d.kind))
              .Field("dtype", wire::DTypeName(d.dtype));
          Ints(j, "shape", t->shape());
          j.FieldU("order", t->order());
          if (t->module_type() != nullptr) j.Field("module_type", std::string(Sv(t->module_type())));
          j.EndObject();
        }
      }
      j.EndArray();
      break;
    }
    case wire::Body::StepStats: {
      const auto* s = env.body_as_StepStats();
      const uint32_t k = s->sketch_k(), bins = s->hist_bins();
      const auto* sketch = s->sketch();
      const auto* hist = s->hist();
      j.FieldU("step", s->step()).FieldU("sketch_k", k).FieldU("hist_bins", bins);
      j.Key("stats").BeginArray();
      if (const auto* stats = s->stats()) {
        for (uint32_t i = 0; i < stats->size(); ++i) {
          const wire::TensorStat* st = stats->Get(i);
          j.BeginObject().FieldU("tensor_id", st->tensor_id());
          auto it = directory_.find({run, env.rank(), st->tensor_id()});
          if (it != directory_.end()) {
            j.Field("name", it->second.name)
                .Field("kind", wire::KindName(it->second.kind))
                .Field("dtype", wire::DTypeName(it->second.dtype));
            j.Key("shape").BeginArray();
            for (int64_t d : it->second.shape) j.Int(d);
            j.EndArray();
          } else {
            j.Key("name").Null();  // no directory entry before this record
          }
          // The agent's word that this is the same tensor as the record before it.
          if (st->flags() & static_cast<uint8_t>(wire::StatFlags::kRepeat)) j.FieldB("repeat", true);
          if (st->flags() & static_cast<uint8_t>(wire::StatFlags::kStatsOnly)) j.FieldB("stats_only", true);
          if (st->flags() & static_cast<uint8_t>(wire::StatFlags::kDevice)) j.FieldB("device", true);
          j.FieldU("micro_step", st->micro_step())
              .FieldU("order", st->order())
              .Field("limit_dtype", wire::DTypeName(static_cast<uint8_t>(st->limit_dtype())))
              .FieldU("numel", st->numel())
              .FieldD("min", st->min())
              .FieldD("max", st->max())
              .FieldD("mean", st->mean())
              .FieldD("std", st->std())
              .FieldD("l2", st->l2())
              .FieldD("absmax", st->absmax())
              .FieldU("nan_count", st->nan_count())
              .FieldU("inf_count", st->inf_count())
              .FieldU("zero_count", st->zero_count())
              .FieldU("sat_count", st->sat_count())
              .FieldU("subnormal_count", st->subnormal_count());
          // Slices past the vectors' ends (an agent bug) print as empty, never read out
          // of bounds.
          j.Key("sketch").BeginArray();
          if (sketch && k > 0 && (uint64_t{i} + 1) * k <= sketch->size())
            for (uint32_t x = 0; x < k; ++x) j.Double(sketch->Get(i * k + x));
          j.EndArray();
          j.Key("hist").BeginArray();
          if (hist && bins > 0 && (uint64_t{i} + 1) * bins <= hist->size())
            for (uint32_t x = 0; x < bins; ++x) j.Uint(hist->Get(i * bins + x));
          j.EndArray();
          j.EndObject();
        }
      }
      j.EndArray();
      break;
    }
    case wire::Body::StepScalars: {
      const auto* s = env.body_as_StepScalars();
      j.FieldU("step", s->step())
          .FieldD("loss", s->loss())
          .FieldD("lr", s->lr())
          .FieldD("grad_norm", s->grad_norm())
          .FieldD("loss_scale", s->loss_scale())
          .FieldD("step_time_s", s->step_time_s())
          .FieldU("micro_steps", s->micro_steps())
          .FieldU("samples", s->samples());
      // Which scalars the job gave (a NaN loss that was given is a real NaN, not "none").
      j.Key("given").BeginArray();
      const auto mask = static_cast<uint8_t>(s->given());
      const std::pair<wire::ScalarGiven, const char*> fields[] = {{wire::ScalarGiven::Loss, "loss"},
                                                                 {wire::ScalarGiven::Lr, "lr"},
                                                                 {wire::ScalarGiven::GradNorm, "grad_norm"},
                                                                 {wire::ScalarGiven::LossScale, "loss_scale"}};
      const double values[] = {s->loss(), s->lr(), s->grad_norm(), s->loss_scale()};
      for (size_t i = 0; i < 4; ++i) {
        if (ScalarIsGiven(mask, static_cast<uint8_t>(fields[i].first), values[i])) j.Str(fields[i].second);
      }
      j.EndArray();
      break;
    }
    case wire::Body::Heartbeat: {
      const auto* h = env.body_as_Heartbeat();
      j.FieldU("records_enqueued", h->records_enqueued())
          .FieldU("records_sent", h->records_sent())
          .FieldU("records_dropped", h->records_dropped())
          .FieldU("messages_dropped", h->messages_dropped())
          .FieldU("queue_depth", h->queue_depth())
          .FieldU("errors", h->errors())
          .FieldU("last_step", h->last_step());
      break;
    }
    case wire::Body::Goodbye: {
      const auto* g = env.body_as_Goodbye();
      j.Field("reason", Sv(g->reason())).FieldU("last_step", g->last_step());
      break;
    }
    case wire::Body::StepEnd: {
      const auto* e = env.body_as_StepEnd();
      j.FieldU("step", e->step()).FieldU("records", e->records());
      Ints(j, "micro_records", e->micro_records());
      break;
    }
    case wire::Body::Sampling:
      Sampling(j, env.body_as_Sampling()->config());
      break;
    case wire::Body::ControlAck: {
      const auto* a = env.body_as_ControlAck();
      j.FieldU("request", a->id())
          .Field("status", wire::EnumNameAckStatus(a->status()))
          .FieldU("step", a->step())
          .Field("detail", Sv(a->detail()));
      if (const auto* r = a->replay()) {  // schema minor 6: the capture replayed on the job's host
        j.Key("replay").BeginObject();
        j.Field("file", Sv(r->file()))
            .Field("row", Sv(r->row()))
            .Field("dtype", Sv(r->dtype()))
            .Field("coarsest", Sv(r->coarsest()))
            .FieldD("max_rel_error", r->max_rel_error())
            .FieldD("ulps", r->ulps())
            .FieldU("width", r->width())
            .Field("settings_digest", Sv(r->settings_digest()))
            .Field("inputs_digest", Sv(r->inputs_digest()))
            .Field("output_digest", Sv(r->output_digest()));
        for (const auto& [name, kv] : {std::pair{"settings", r->settings()}, std::pair{"precision", r->precision()}}) {
          j.Key(name).BeginObject();
          if (kv != nullptr) {
            for (const auto* e : *kv) j.Field(Sv(e->key()), Sv(e->value()));
          }
          j.EndObject();
        }
        j.Field("error", Sv(r->error()));
        j.EndObject();
      }
      break;
    }
    case wire::Body::RunFingerprint: {
      j.Key("entries").BeginObject();
      if (const auto* es = env.body_as_RunFingerprint()->entries()) {
        for (const auto* e : *es) j.Field(Sv(e->key()), Sv(e->value()));
      }
      j.EndObject();
      break;
    }
    default:
      break;
  }
  j.EndObject().EndObject();
}

void RankSummaryJson(const RankInfo& r, std::string* out) {
  JsonOut j(out);
  j.BeginObject()
      .Field("run", r.run)
      .FieldU("rank", r.rank)
      .Field("experiment", r.experiment)
      .Field("role", r.hello_seen ? r.role : "unknown")
      .Field("platform", r.platform)
      .Field("device_name", r.device_name)
      .Field("framework", r.framework)
      .Field("host", r.host)
      .FieldU("pid", r.pid)
      .FieldU("world_size", r.world_size)
      .Field("agent_version", r.agent_version)
      .FieldB("hello_seen", r.hello_seen)
      .FieldU("messages", r.messages)
      .FieldU("records", r.records)
      .FieldU("stat_records", r.stat_records)
      .FieldU("scalar_records", r.scalar_records)
      .FieldU("bytes", r.bytes)
      .FieldU("first_seq", r.first_seq)
      .FieldU("last_seq", r.last_seq)
      .FieldU("gaps", r.gaps)
      .FieldU("duplicates", r.duplicates)
      .FieldU("sessions", r.sessions)
      .FieldU("bad_messages", r.bad_messages)
      .FieldU("agent_records_enqueued", r.agent_records_enqueued)
      .FieldU("agent_records_sent", r.agent_records_sent)
      .FieldU("agent_records_dropped", r.agent_records_dropped)
      .FieldU("agent_messages_dropped", r.agent_messages_dropped)
      .FieldU("agent_errors", r.agent_errors)
      .FieldU("agent_queue_depth", r.agent_queue_depth);
  if (r.has_step)
    j.FieldU("last_step", r.last_step);
  else
    j.Key("last_step").Null();
  j.FieldB("goodbye", r.goodbye)
      .Field("goodbye_reason", r.goodbye_reason)
      .FieldI("first_recv_unix_ns", r.first_recv_unix_ns)
      .FieldI("last_recv_unix_ns", r.last_recv_unix_ns)
      .FieldI("last_heartbeat_unix_ns", r.last_heartbeat_unix_ns)
      .EndObject();
}

}  // namespace lockstep::collector
