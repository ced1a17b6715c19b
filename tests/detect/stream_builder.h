// Builds synthetic wire messages for the analyzer tests and benches: a fake agent
// that emits Hello, TensorDirectory, StepStats, StepScalars and Goodbye as real
// FlatBuffers Envelopes (the same bytes a real agent sends).
#ifndef LOCKSTEP_TESTS_DETECT_STREAM_BUILDER_H_
#define LOCKSTEP_TESTS_DETECT_STREAM_BUILDER_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <flatbuffers/flatbuffers.h>

#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::testing {

struct FakeTensor {
  std::string name;
  wire::TensorKind kind = wire::TensorKind::Act;
  wire::DType dtype = wire::DType::F32;
  uint32_t order = 0;
};

// One record's statistics; Vec() derives them from a value vector.
struct FakeStat {
  uint32_t id = 0;
  uint32_t micro_step = 0;
  uint64_t numel = 4;
  double min = 0, max = 0, mean = 0, std = 0, l2 = 0, absmax = 0;
  uint64_t nan = 0, inf = 0, zero = 0, sat = 0, subnormal = 0;
  wire::DType limit = wire::DType::F16;
  std::vector<float> sketch;   // empty = none
  std::vector<uint32_t> hist;  // empty = none
  uint32_t order = 0;
  uint8_t flags = 0;           // wire::StatFlags bits (kRepeat)

  // Statistics of `v` (finite only), with a K=8 "sketch" that is simply v folded
  // with alternating signs — linear, like the real count-sketch.
  static FakeStat Vec(uint32_t id, const std::vector<double>& v, int k = 8) {
    FakeStat s;
    s.id = id;
    s.numel = v.size();
    double sum = 0, sq = 0, mn = INFINITY, mx = -INFINITY;
    uint64_t n = 0;
    for (double x : v) {
      if (std::isnan(x)) { ++s.nan; continue; }
      if (std::isinf(x)) { ++s.inf; continue; }
      ++n;
      sum += x;
      sq += x * x;
      mn = std::min(mn, x);
      mx = std::max(mx, x);
      if (x == 0) ++s.zero;
      if (std::fabs(x) >= 65504) ++s.sat;
      if (x != 0 && std::fabs(x) < 6.103515625e-05) ++s.subnormal;
    }
    if (n == 0) {
      s.min = s.max = s.mean = s.std = s.l2 = s.absmax = NAN;
    } else {
      s.min = mn;
      s.max = mx;
      s.mean = sum / n;
      s.std = std::sqrt(std::max(0.0, sq / n - s.mean * s.mean));
      s.l2 = std::sqrt(sq);
      s.absmax = std::max(-mn, mx);
    }
    if (k > 0) {
      s.sketch.assign(k, 0.f);
      for (size_t i = 0; i < v.size(); ++i) {
        if (std::isfinite(v[i])) s.sketch[(i * 2654435761u) % k] += static_cast<float>((i % 3 == 0 ? -1 : 1) * v[i]);
      }
    }
    return s;
  }
};

struct FakeScalars {
  double loss = NAN, lr = NAN, grad_norm = NAN, loss_scale = NAN, step_time_s = NAN;
};

class StreamBuilder {
 public:
  StreamBuilder(std::string run, std::string experiment, wire::Role role, uint32_t rank = 0)
      : run_(std::move(run)), experiment_(std::move(experiment)), role_(role), rank_(rank) {}

  std::vector<uint8_t> Hello(uint32_t world_size = 1) {
    auto fbb = Begin();
    auto h = wire::CreateHelloDirect(*fbb, experiment_.c_str(), role_, "cpu", nullptr, nullptr, world_size);
    return Finish(fbb, wire::Body::Hello, h.Union());
  }
  // A RunFingerprint of these key/value pairs.
  std::vector<uint8_t> Fingerprint(const std::vector<std::pair<std::string, std::string>>& kv) {
    auto fbb = Begin();
    std::vector<flatbuffers::Offset<wire::KeyValue>> v;
    for (const auto& [k, val] : kv) v.push_back(wire::CreateKeyValueDirect(*fbb, k.c_str(), val.c_str()));
    auto f = wire::CreateRunFingerprintDirect(*fbb, &v);
    return Finish(fbb, wire::Body::RunFingerprint, f.Union());
  }
  // Ids first_id, first_id + 1, ... in the order given.
  std::vector<uint8_t> Directory(const std::vector<FakeTensor>& ts, uint32_t first_id = 0) {
    auto fbb = Begin();
    std::vector<flatbuffers::Offset<wire::TensorInfo>> v;
    for (size_t i = 0; i < ts.size(); ++i) {
      v.push_back(wire::CreateTensorInfoDirect(*fbb, first_id + static_cast<uint32_t>(i), ts[i].name.c_str(), ts[i].kind,
                                                ts[i].dtype, nullptr, ts[i].order));
    }
    auto d = wire::CreateTensorDirectoryDirect(*fbb, &v);
    return Finish(fbb, wire::Body::TensorDirectory, d.Union());
  }
  std::vector<uint8_t> Stats(uint64_t step, const std::vector<FakeStat>& stats) {
    auto fbb = Begin();
    std::vector<wire::TensorStat> v;
    std::vector<float> sk;
    std::vector<uint32_t> hist;
    uint16_t k = stats.empty() ? 0 : static_cast<uint16_t>(stats[0].sketch.size());
    uint8_t hb = stats.empty() ? 0 : static_cast<uint8_t>(stats[0].hist.size());
    for (const auto& s : stats) {
      v.emplace_back(s.id, s.micro_step, s.order, s.limit, s.flags, 0, s.numel, s.min, s.max, s.mean, s.std, s.l2,
                     s.absmax, s.nan, s.inf, s.zero, s.sat, s.subnormal);
      sk.insert(sk.end(), s.sketch.begin(), s.sketch.end());
      hist.insert(hist.end(), s.hist.begin(), s.hist.end());
    }
    auto b = wire::CreateStepStatsDirect(*fbb, step, &v, k, k ? &sk : nullptr, hb, hb ? &hist : nullptr);
    return Finish(fbb, wire::Body::StepStats, b.Union());
  }
  std::vector<uint8_t> Scalars(uint64_t step, const FakeScalars& s) {
    auto fbb = Begin();
    auto b = wire::CreateStepScalars(*fbb, step, s.loss, s.lr, s.grad_norm, s.loss_scale, s.step_time_s, 1, 0);
    return Finish(fbb, wire::Body::StepScalars, b.Union());
  }
  std::vector<uint8_t> Heartbeat() {
    auto fbb = Begin();
    auto b = wire::CreateHeartbeat(*fbb);
    return Finish(fbb, wire::Body::Heartbeat, b.Union());
  }
  std::vector<uint8_t> Goodbye(uint64_t last_step) {
    auto fbb = Begin();
    auto b = wire::CreateGoodbyeDirect(*fbb, "close", last_step);
    return Finish(fbb, wire::Body::Goodbye, b.Union());
  }
  // The end of a step (schema minor 3): give `minor` 3 so the Hello says StepEnd comes.
  std::vector<uint8_t> StepEnd(uint64_t step, uint64_t records, const std::vector<uint32_t>& micro = {}) {
    auto fbb = Begin();
    auto b = wire::CreateStepEndDirect(*fbb, step, records, micro.empty() ? nullptr : &micro);
    return Finish(fbb, wire::Body::StepEnd, b.Union());
  }
  const std::string& run() const { return run_; }

  uint16_t minor = 0;    // Envelope.schema_minor (0: an agent without StepEnd)
  uint64_t session = 0;  // Envelope.session (0: an older agent)

 private:
  std::unique_ptr<flatbuffers::FlatBufferBuilder> Begin() {
    return std::make_unique<flatbuffers::FlatBufferBuilder>(1024);
  }
  std::vector<uint8_t> Finish(std::unique_ptr<flatbuffers::FlatBufferBuilder>& fbb, wire::Body type,
                              flatbuffers::Offset<void> body) {
    auto run = fbb->CreateString(run_);
    wire::EnvelopeBuilder eb(*fbb);
    eb.add_schema_major(1);
    eb.add_schema_minor(minor);
    eb.add_run_id(run);
    eb.add_rank(rank_);
    eb.add_seq(seq_++);
    eb.add_sent_unix_ns(0);
    eb.add_body_type(type);
    eb.add_body(body);
    eb.add_session(session);
    wire::FinishEnvelopeBuffer(*fbb, eb.Finish());
    return std::vector<uint8_t>(fbb->GetBufferPointer(), fbb->GetBufferPointer() + fbb->GetSize());
  }
  std::string run_, experiment_;
  wire::Role role_;
  uint32_t rank_;
  uint64_t seq_ = 0;
};

inline const wire::Envelope& AsEnvelope(const std::vector<uint8_t>& bytes) {
  return *wire::GetEnvelope(bytes.data());
}

}  // namespace lockstep::testing

#endif  // LOCKSTEP_TESTS_DETECT_STREAM_BUILDER_H_
