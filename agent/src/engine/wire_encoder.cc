#include "engine/wire_encoder.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "lockstep/common/clock.h"
#include "lockstep/common/wire.h"

#ifndef LOCKSTEP_AGENT_VERSION
#define LOCKSTEP_AGENT_VERSION "0.0.0"
#endif

namespace lockstep::engine {
namespace {

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

uint64_t NewSessionId() {
  std::random_device rd;
  uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(UnixNowNs()) ^
                (static_cast<uint64_t>(getpid()) << 17);
  return id == 0 ? 1 : id;
}

}  // namespace

WireEncoder::WireEncoder(std::string run_id, uint32_t rank, BufferPool* pool,
                         size_t initial_bytes)
    : run_id_(std::move(run_id)),
      rank_(rank),
      session_(NewSessionId()),
      allocator_(pool != nullptr ? std::make_unique<PooledAllocator>(pool) : nullptr),
      fbb_(initial_bytes, allocator_.get()) {}

OwnedBytes WireEncoder::Detach() {
  OwnedBytes out;
  out.size = fbb_.GetSize();
  size_t reserved = 0, offset = 0;
  out.block = fbb_.ReleaseRaw(reserved, offset);
  out.data = out.block + offset;
  return out;
}

Bytes WireEncoder::Finish(wire::Body type, flatbuffers::Offset<void> body, uint64_t seq) {
  auto run = fbb_.CreateString(run_id_);
  auto env = wire::CreateEnvelope(fbb_, kSchemaMajor, kSchemaMinor, run, rank_, seq, UnixNowNs(),
                                  type, body, session_);
  wire::FinishEnvelopeBuffer(fbb_, env);
  return Bytes{fbb_.GetBufferPointer(), fbb_.GetSize()};
}

Bytes WireEncoder::Hello(const AgentOptions& o, int64_t start_unix_ns, uint64_t seq) {
  fbb_.Clear();
  std::vector<wire::TensorKind> kinds = {wire::TensorKind::Act, wire::TensorKind::ActGrad,
                                         wire::TensorKind::ParamGrad, wire::TensorKind::Loss};
  auto sampling = wire::CreateSamplingConfig(
      fbb_, o.every, static_cast<uint16_t>(o.sketch_k), static_cast<uint8_t>(o.hist_bins),
      fbb_.CreateString(o.include_regex), fbb_.CreateString(o.exclude_regex),
      fbb_.CreateVector(kinds));
  auto hello = wire::CreateHello(
      fbb_, fbb_.CreateString(o.experiment), static_cast<wire::Role>(o.role),
      fbb_.CreateString(o.platform), fbb_.CreateString(o.device_name),
      fbb_.CreateString(o.framework), o.world_size, fbb_.CreateString(HostName()),
      static_cast<uint32_t>(getpid()), fbb_.CreateString(LOCKSTEP_AGENT_VERSION), start_unix_ns,
      o.start_step, sampling);
  return Finish(wire::Body::Hello, hello.Union(), seq);
}

Bytes WireEncoder::Directory(const TensorRegistry& registry, uint32_t from, uint32_t to,
                             uint64_t seq) {
  fbb_.Clear();
  std::vector<flatbuffers::Offset<wire::TensorInfo>> infos;
  infos.reserve(to - from);
  registry.ForEach(from, to, [&](const TensorEntry& e) {
    infos.push_back(wire::CreateTensorInfo(fbb_, e.id, fbb_.CreateString(e.name),
                                           static_cast<wire::TensorKind>(e.kind),
                                           static_cast<wire::DType>(e.dtype),
                                           fbb_.CreateVector(e.shape), e.order,
                                           e.module_type.empty()
                                               ? flatbuffers::Offset<flatbuffers::String>()
                                               : fbb_.CreateString(e.module_type)));
  });
  auto dir = wire::CreateTensorDirectory(fbb_, fbb_.CreateVector(infos));
  return Finish(wire::Body::TensorDirectory, dir.Union(), seq);
}

Bytes WireEncoder::Stats(uint64_t step, const wire::TensorStat* stats, size_t n, uint16_t sketch_k,
                         const float* sketch, uint8_t hist_bins, const uint32_t* hist,
                         uint64_t seq) {
  fbb_.Clear();
  auto stats_v = fbb_.CreateVectorOfStructs(stats, n);
  flatbuffers::Offset<flatbuffers::Vector<float>> sketch_v;
  if (sketch_k > 0) sketch_v = fbb_.CreateVector(sketch, n * sketch_k);
  flatbuffers::Offset<flatbuffers::Vector<uint32_t>> hist_v;
  if (hist_bins > 0) hist_v = fbb_.CreateVector(hist, n * hist_bins);
  auto body = wire::CreateStepStats(fbb_, step, stats_v, sketch_k, sketch_v, hist_bins, hist_v);
  return Finish(wire::Body::StepStats, body.Union(), seq);
}

Bytes WireEncoder::Scalars(uint64_t step, const StepScalars& s, uint64_t seq) {
  fbb_.Clear();
  // The mask always carries Authoritative, so a reader tells a NaN loss from none.
  uint8_t given = static_cast<uint8_t>(wire::ScalarGiven::Authoritative) | s.given;
  if (!std::isnan(s.loss)) given |= StepScalars::kLossGiven;
  if (!std::isnan(s.lr)) given |= StepScalars::kLrGiven;
  if (!std::isnan(s.grad_norm)) given |= StepScalars::kGradNormGiven;
  if (!std::isnan(s.loss_scale)) given |= StepScalars::kLossScaleGiven;
  static_assert(StepScalars::kLossGiven == static_cast<uint8_t>(wire::ScalarGiven::Loss) &&
                StepScalars::kLrGiven == static_cast<uint8_t>(wire::ScalarGiven::Lr) &&
                StepScalars::kGradNormGiven == static_cast<uint8_t>(wire::ScalarGiven::GradNorm) &&
                StepScalars::kLossScaleGiven == static_cast<uint8_t>(wire::ScalarGiven::LossScale));
  auto body = wire::CreateStepScalars(fbb_, step, s.loss, s.lr, s.grad_norm, s.loss_scale,
                                      s.step_time_s, s.micro_steps, s.samples,
                                      static_cast<wire::ScalarGiven>(given));
  return Finish(wire::Body::StepScalars, body.Union(), seq);
}

Bytes WireEncoder::Heartbeat(const HeartbeatValues& h, uint64_t seq) {
  fbb_.Clear();
  auto body = wire::CreateHeartbeat(fbb_, h.records_enqueued, h.records_sent, h.records_dropped,
                                    h.messages_dropped, h.queue_depth, h.errors, h.last_step);
  return Finish(wire::Body::Heartbeat, body.Union(), seq);
}

Bytes WireEncoder::Fingerprint(const std::vector<std::pair<std::string, std::string>>& entries,
                               uint64_t seq) {
  fbb_.Clear();
  std::vector<flatbuffers::Offset<wire::KeyValue>> kv;
  kv.reserve(entries.size());
  for (const auto& [k, v] : entries) {
    kv.push_back(wire::CreateKeyValue(fbb_, fbb_.CreateString(k), fbb_.CreateString(v)));
  }
  auto body = wire::CreateRunFingerprint(fbb_, fbb_.CreateVector(kv));
  return Finish(wire::Body::RunFingerprint, body.Union(), seq);
}

Bytes WireEncoder::StepEnd(uint64_t step, uint64_t records, const std::vector<uint32_t>& micro,
                           uint64_t seq) {
  fbb_.Clear();
  flatbuffers::Offset<flatbuffers::Vector<uint32_t>> micro_v;
  if (!micro.empty()) micro_v = fbb_.CreateVector(micro);
  auto body = wire::CreateStepEnd(fbb_, step, records, micro_v);
  return Finish(wire::Body::StepEnd, body.Union(), seq);
}

Bytes WireEncoder::Sampling(const lockstep::Sampling& s, uint16_t sketch_k, uint8_t hist_bins,
                            uint64_t seq) {
  fbb_.Clear();
  std::vector<wire::TensorKind> kinds;
  kinds.reserve(s.kinds.size());
  for (TensorKind k : s.kinds) kinds.push_back(static_cast<wire::TensorKind>(k));
  auto config = wire::CreateSamplingConfig(fbb_, s.every, sketch_k, hist_bins,
                                           fbb_.CreateString(s.include_regex),
                                           fbb_.CreateString(s.exclude_regex), fbb_.CreateVector(kinds));
  auto body = wire::CreateSampling(fbb_, config);
  return Finish(wire::Body::Sampling, body.Union(), seq);
}

Bytes WireEncoder::Ack(uint64_t id, AckStatus status, uint64_t step, const std::string& detail,
                        uint64_t seq, const SelfReplay* replay) {
  fbb_.Clear();
  flatbuffers::Offset<wire::SelfReplay> rep;
  if (replay != nullptr) {
    const SelfReplay& r = *replay;
    auto pairs = [this](const std::vector<std::pair<std::string, std::string>>& kv) {
      std::vector<flatbuffers::Offset<wire::KeyValue>> out;
      out.reserve(kv.size());
      for (const auto& [k, v] : kv) out.push_back(wire::CreateKeyValue(fbb_, fbb_.CreateString(k), fbb_.CreateString(v)));
      return fbb_.CreateVector(out);
    };
    auto settings = pairs(r.settings);
    auto precision = pairs(r.precision);
    rep = wire::CreateSelfReplay(fbb_, fbb_.CreateString(r.file), fbb_.CreateString(r.row), fbb_.CreateString(r.dtype),
                                 fbb_.CreateString(r.coarsest), r.max_rel_error, r.ulps, r.width,
                                 fbb_.CreateString(r.settings_digest), settings, precision,
                                 fbb_.CreateString(r.inputs_digest), fbb_.CreateString(r.output_digest),
                                 fbb_.CreateString(r.error));
  }
  auto body = wire::CreateControlAck(fbb_, id, static_cast<wire::AckStatus>(status), step,
                                     fbb_.CreateString(detail), rep);
  return Finish(wire::Body::ControlAck, body.Union(), seq);
}

Bytes WireEncoder::Goodbye(const char* reason, uint64_t last_step, uint64_t seq) {
  fbb_.Clear();
  auto body = wire::CreateGoodbye(fbb_, fbb_.CreateString(reason), last_step);
  return Finish(wire::Body::Goodbye, body.Union(), seq);
}

}  // namespace lockstep::engine
