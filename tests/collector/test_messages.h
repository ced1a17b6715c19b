// Envelopes for the collector's tests and bench, built with the generated FlatBuffers
// API directly (independent of the agent library).
#ifndef LOCKSTEP_TESTS_COLLECTOR_TEST_MESSAGES_H_
#define LOCKSTEP_TESTS_COLLECTOR_TEST_MESSAGES_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/common/wire.h"
#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::testing {

using Bytes = std::vector<uint8_t>;

struct Head {
  std::string run = "run-a";
  uint32_t rank = 0;
  uint64_t seq = 0;
  uint16_t major = kSchemaMajor;
  uint16_t minor = kSchemaMinor;
  uint64_t session = 0;  // Envelope.session (0: an older agent)
  const char* identifier = "LKS1";
};

inline Bytes Finish(flatbuffers::FlatBufferBuilder& fbb, const Head& h, wire::Body type,
                    flatbuffers::Offset<void> body) {
  auto run = fbb.CreateString(h.run);
  wire::EnvelopeBuilder e(fbb);
  e.add_schema_major(h.major);
  e.add_schema_minor(h.minor);
  e.add_run_id(run);
  e.add_rank(h.rank);
  e.add_seq(h.seq);
  e.add_session(h.session);
  e.add_sent_unix_ns(1700000000000000000LL + static_cast<int64_t>(h.seq));
  e.add_body_type(type);
  e.add_body(body);
  fbb.Finish(e.Finish(), h.identifier);
  return Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

// A Sampling message (schema minor 3) with these patterns.
inline Bytes Sampling(const Head& h, const std::string& include, const std::string& exclude = "") {
  flatbuffers::FlatBufferBuilder fbb;
  auto config = wire::CreateSamplingConfigDirect(fbb, 2, 4, 2, include.c_str(), exclude.c_str());
  auto body = wire::CreateSampling(fbb, config);
  return Finish(fbb, h, wire::Body::Sampling, body.Union());
}

// A StepEnd message (schema minor 3).
inline Bytes StepEnd(const Head& h, uint64_t step, uint64_t records, const std::vector<uint32_t>& micro = {}) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = wire::CreateStepEndDirect(fbb, step, records, micro.empty() ? nullptr : &micro);
  return Finish(fbb, h, wire::Body::StepEnd, body.Union());
}

inline Bytes Hello(const Head& h, const std::string& experiment = "exp",
                   wire::Role role = wire::Role::Baseline, uint32_t pid = 4242,
                   int64_t start_ns = 1) {
  flatbuffers::FlatBufferBuilder fbb;
  auto exp = fbb.CreateString(experiment);
  auto platform = fbb.CreateString("cpu");
  auto host = fbb.CreateString("testhost");
  auto sampling = wire::CreateSamplingConfig(fbb, 1, 4, 2);
  wire::HelloBuilder b(fbb);
  b.add_experiment(exp);
  b.add_role(role);
  b.add_platform(platform);
  b.add_host(host);
  b.add_world_size(2);
  b.add_pid(pid);
  b.add_start_unix_ns(start_ns);
  b.add_sampling(sampling);
  return Finish(fbb, h, wire::Body::Hello, b.Finish().Union());
}

inline Bytes Directory(const Head& h, const std::vector<std::pair<uint32_t, std::string>>& tensors) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::TensorInfo>> infos;
  uint32_t order = 0;
  for (const auto& [id, name] : tensors) {
    std::vector<int64_t> shape{2, 3};
    infos.push_back(wire::CreateTensorInfoDirect(fbb, id, name.c_str(), wire::TensorKind::Act,
                                                 wire::DType::BF16, &shape, order++));
  }
  auto body = wire::CreateTensorDirectoryDirect(fbb, &infos);
  return Finish(fbb, h, wire::Body::TensorDirectory, body.Union());
}

// `n` records of tensors 0..n-1, sketch_k 4 and 2 histogram bins each; record i has
// mean = step + i / 1000.
inline Bytes Stats(const Head& h, uint64_t step, uint32_t n, uint16_t sketch_k = 4,
                   uint8_t bins = 2) {
  flatbuffers::FlatBufferBuilder fbb(1024 + n * (128 + sketch_k * 4 + bins * 4));
  std::vector<wire::TensorStat> stats;
  std::vector<float> sketch;
  std::vector<uint32_t> hist;
  for (uint32_t i = 0; i < n; ++i) {
    wire::TensorStat s(i, 0, i, wire::DType::BF16, 0, 0, 6, -1.0, 1.0, step + i / 1000.0, 0.5,
                       2.0, 1.0, 0, 0, 1, 0, 0);
    stats.push_back(s);
    for (uint32_t k = 0; k < sketch_k; ++k) sketch.push_back(static_cast<float>(i + k));
    for (uint32_t b = 0; b < bins; ++b) hist.push_back(3);
  }
  auto body = wire::CreateStepStatsDirect(fbb, step, &stats, sketch_k, &sketch, bins, &hist);
  return Finish(fbb, h, wire::Body::StepStats, body.Union());
}

inline Bytes Scalars(const Head& h, uint64_t step, double loss) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = wire::CreateStepScalars(fbb, step, loss, 1e-3, 2.0, std::nan(""), 0.25, 1, 0);
  return Finish(fbb, h, wire::Body::StepScalars, body.Union());
}

inline Bytes Heartbeat(const Head& h, uint64_t dropped, uint32_t depth, uint64_t last_step = 0) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = wire::CreateHeartbeat(fbb, 100, 90, dropped, 0, depth, 0, last_step);
  return Finish(fbb, h, wire::Body::Heartbeat, body.Union());
}

inline Bytes Goodbye(const Head& h, uint64_t last_step) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = wire::CreateGoodbyeDirect(fbb, "close", last_step);
  return Finish(fbb, h, wire::Body::Goodbye, body.Union());
}

inline Bytes Fingerprint(const Head& h, const std::vector<std::pair<std::string, std::string>>& kv) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::KeyValue>> v;
  for (const auto& [k, val] : kv) v.push_back(wire::CreateKeyValueDirect(fbb, k.c_str(), val.c_str()));
  auto body = wire::CreateRunFingerprintDirect(fbb, &v);
  return Finish(fbb, h, wire::Body::RunFingerprint, body.Union());
}

inline Head At(std::string run, uint32_t rank, uint64_t seq) {
  Head h;
  h.run = std::move(run);
  h.rank = rank;
  h.seq = seq;
  return h;
}

}  // namespace lockstep::testing

#endif  // LOCKSTEP_TESTS_COLLECTOR_TEST_MESSAGES_H_
