#include "lockstep/common/envelope_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "lockstep/collector/registry.h"
#include "cli/inspect_format.h"
#include "test_messages.h"

namespace lockstep::collector {
namespace {

using testing::At;
using testing::Bytes;

EnvelopeCheck Check(const Bytes& b, size_t max = kMaxMessageBytes) {
  return CheckEnvelope(b.data(), b.size(), max);
}

TEST(EnvelopeCheck, AcceptsEveryBodyType) {
  for (const Bytes& b : {testing::Hello(At("r", 0, 0)), testing::Directory(At("r", 0, 1), {{0, "a"}}),
                         testing::Stats(At("r", 0, 2), 0, 3), testing::Scalars(At("r", 0, 3), 0, 1.0),
                         testing::Heartbeat(At("r", 0, 4), 0, 0), testing::Goodbye(At("r", 0, 5), 0),
                         testing::Fingerprint(At("r", 0, 6), {{"optim.group0.lr", "0.001"}})}) {
    EnvelopeCheck c = Check(b);
    EXPECT_EQ(c.reject, Reject::kNone) << RejectName(c.reject);
    ASSERT_NE(c.env, nullptr);
    EXPECT_EQ(c.env->run_id()->str(), "r");
  }
}

TEST(EnvelopeCheck, RejectsGarbage) {
  std::mt19937 rng(1);
  int refused = 0;
  for (int i = 0; i < 2000; ++i) {
    Bytes b(1 + rng() % 300);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    // Some garbage gets the right identifier, to reach the verifier.
    if (i % 2 == 0 && b.size() >= 8) std::memcpy(b.data() + 4, "LKS1", 4);
    if (Check(b).reject != Reject::kNone) ++refused;
  }
  EXPECT_EQ(refused, 2000);
  EXPECT_EQ(Check(Bytes{}).reject, Reject::kEmpty);
}

TEST(EnvelopeCheck, RejectsEveryTruncation) {
  Bytes good = testing::Stats(At("r", 0, 7), 3, 5);
  for (size_t n = 1; n < good.size(); ++n) {
    Bytes cut(good.begin(), good.begin() + static_cast<long>(n));
    EXPECT_NE(Check(cut).reject, Reject::kNone) << "accepted a prefix of " << n << " bytes";
  }
}

TEST(EnvelopeCheck, RejectsOversized) {
  Bytes b = testing::Stats(At("r", 0, 0), 0, 10);
  EXPECT_EQ(Check(b, b.size()).reject, Reject::kNone);
  EXPECT_EQ(Check(b, b.size() - 1).reject, Reject::kOversized);
}

TEST(EnvelopeCheck, RejectsWrongFileIdentifier) {
  auto h = At("r", 0, 0);
  h.identifier = "XXXX";
  EXPECT_EQ(Check(testing::Hello(h)).reject, Reject::kFileIdentifier);
}

TEST(EnvelopeCheck, RejectsUnknownMajorAndMissingMajor) {
  auto h = At("r", 3, 0);
  h.major = 2;
  h.minor = 0;
  Bytes major2 = testing::Hello(h);  // c.env points into it
  EnvelopeCheck c = Check(major2);
  EXPECT_EQ(c.reject, Reject::kSchemaMajor);
  EXPECT_EQ(c.schema_major, 2);
  ASSERT_NE(c.env, nullptr);  // still attributable to its run
  EXPECT_EQ(c.env->rank(), 3u);
  EXPECT_NE(DescribeReject(c, 100, 1000).find("schema version 2.0"), std::string::npos);
  h.major = 0;
  EXPECT_EQ(Check(testing::Hello(h)).reject, Reject::kSchemaMajor);
}

TEST(EnvelopeCheck, AcceptsNewerMinor) {
  auto h = At("r", 0, 0);
  h.minor = kSchemaMinor + 7;
  EnvelopeCheck c = Check(testing::Stats(h, 1, 2));
  EXPECT_EQ(c.reject, Reject::kNone);
  EXPECT_EQ(c.schema_minor, kSchemaMinor + 7);
}

TEST(EnvelopeCheck, RejectsRunIdsThatCouldEscapeTheDataDir) {
  for (const char* bad : {"", "../etc", ".hidden", "a/b", "a b"}) {
    EXPECT_EQ(Check(testing::Hello(At(bad, 0, 0))).reject, Reject::kRunId) << bad;
  }
  EXPECT_EQ(Check(testing::Hello(At(std::string("run\0/../x", 10), 0, 0))).reject, Reject::kRunId);  // NUL
  EXPECT_EQ(Check(testing::Hello(At(std::string(129, 'x'), 0, 0))).reject, Reject::kRunId);
  EXPECT_EQ(Check(testing::Hello(At(std::string(128, 'x'), 0, 0))).reject, Reject::kNone);
}

TEST(EnvelopeCheck, CapsTensorNameAndLabelLengths) {
  auto ok = Check(testing::Directory(At("r", 0, 0), {{1, std::string(kMaxTensorNameLength, 'n')}}));
  EXPECT_EQ(ok.reject, Reject::kNone);
  auto long_name =
      Check(testing::Directory(At("r", 0, 0), {{1, "a"}, {2, std::string(kMaxTensorNameLength + 1, 'n')}}));
  EXPECT_EQ(long_name.reject, Reject::kTooLong);
  ASSERT_NE(long_name.env, nullptr);  // still attributable to its run
  EXPECT_EQ(Check(testing::Hello(At("r", 0, 0), std::string(kMaxRunIdLength + 1, 'e'))).reject,
            Reject::kTooLong);
  EXPECT_EQ(Check(testing::Hello(At("r", 0, 0), std::string(kMaxRunIdLength, 'e'))).reject, Reject::kNone);
}

// Random bit flips, byte overwrites and cuts of valid messages: whatever passes the
// check must be safe to read by every consumer (registry, inspect formatter), which
// the ASan/UBSan build (LOCKSTEP_SANITIZE) turns into a hard check.
TEST(EnvelopeCheck, CapsFingerprintKeysAndValues) {
  EXPECT_EQ(Check(testing::Fingerprint(At("r", 0, 0), {{"k", std::string(kMaxTensorNameLength, 'v')}})).reject,
            Reject::kNone);
  EXPECT_EQ(Check(testing::Fingerprint(At("r", 0, 0), {{"k", std::string(kMaxTensorNameLength + 1, 'v')}})).reject,
            Reject::kTooLong);
  EXPECT_EQ(Check(testing::Fingerprint(At("r", 0, 0), {{std::string(kMaxTensorNameLength + 1, 'k'), "v"}})).reject,
            Reject::kTooLong);
}

// A capture's own replay (ControlAck.replay, schema minor 6): every string and each
// settings list capped, so nothing longer reaches the log, FollowUp or compare.
Bytes ReplayAck(const std::string& file, size_t settings, const std::string& value = "v") {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::KeyValue>> kv;
  for (size_t i = 0; i < settings; ++i) kv.push_back(wire::CreateKeyValueDirect(fbb, "k", value.c_str()));
  auto r = wire::CreateSelfReplay(fbb, fbb.CreateString(file), fbb.CreateString("blocks.0/gelu#0"),
                                  fbb.CreateString("float32"), fbb.CreateString("float32"), 1e-7, 1.0, 16, 0,
                                  fbb.CreateVector(kv));
  auto body = wire::CreateControlAck(fbb, 3, wire::AckStatus::Done, 5, fbb.CreateString("capture"), r);
  return testing::Finish(fbb, At("r", 0, 0), wire::Body::ControlAck, body.Union());
}

TEST(EnvelopeCheck, CapsASelfReplaysStringsAndSettings) {
  EXPECT_EQ(Check(ReplayAck(std::string(kMaxTensorNameLength, 'f'), kMaxSelfReplaySettings)).reject, Reject::kNone);
  EXPECT_EQ(Check(ReplayAck(std::string(kMaxTensorNameLength + 1, 'f'), 1)).reject, Reject::kTooLong);
  EXPECT_EQ(Check(ReplayAck("/x.pt", kMaxSelfReplaySettings + 1)).reject, Reject::kTooLong);
  EXPECT_EQ(Check(ReplayAck("/x.pt", 1, std::string(kMaxTensorNameLength + 1, 'v'))).reject, Reject::kTooLong);
}

TEST(EnvelopeCheck, CapsSamplingPatternsAndPassesStepEnd) {
  const std::string longest(kMaxTensorNameLength, 'p'), too_long(kMaxTensorNameLength + 1, 'p');
  EXPECT_EQ(Check(testing::Sampling(At("r", 0, 0), longest, longest)).reject, Reject::kNone);
  EXPECT_EQ(Check(testing::Sampling(At("r", 0, 0), too_long)).reject, Reject::kTooLong);
  EXPECT_EQ(Check(testing::Sampling(At("r", 0, 0), "", too_long)).reject, Reject::kTooLong);
  EXPECT_EQ(Check(testing::StepEnd(At("r", 0, 0), 7, 12, {5, 7})).reject, Reject::kNone);
}

TEST(EnvelopeCheck, MutatedMessagesAreSafeForEveryConsumer) {
  std::vector<Bytes> seeds = {testing::Hello(At("m", 0, 0)), testing::Sampling(At("m", 0, 0), "^enc"),
                              testing::StepEnd(At("m", 0, 0), 3, 4, {4}),
                              testing::Directory(At("m", 0, 1), {{0, "a"}, {1, "b"}}),
                              testing::Stats(At("m", 0, 2), 3, 4, 8, 4),
                              testing::Scalars(At("m", 0, 3), 3, 0.5),
                              testing::Heartbeat(At("m", 0, 4), 1, 2),
                              testing::Goodbye(At("m", 0, 5), 9),
                              testing::Fingerprint(At("m", 0, 6), {{"a", "1"}, {"module.x.p", "0.1"}})};
  std::mt19937 rng(11);
  Registry reg;
  InspectFormatter fmt;
  std::string out;
  int accepted = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) {
    Bytes b = seeds[i % seeds.size()];
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = rng() % b.size();
      switch (rng() % 3) {
        case 0: b[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: b[at] = static_cast<uint8_t>(rng()); break;
        default: b.resize(std::max<size_t>(1, at)); break;
      }
    }
    EnvelopeCheck c = Check(b);
    if (c.reject != Reject::kNone) {
      ++refused;
      continue;
    }
    ++accepted;
    reg.OnMessage(*c.env, 1, b.size());
    out.clear();
    fmt.Record(*c.env, 1, 0, static_cast<uint32_t>(b.size()), &out);
    ASSERT_FALSE(out.empty());
  }
  // Both outcomes happen: flips in float payloads are harmless, flips in offsets not.
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 100);
}

TEST(EnvelopeCheck, RejectsMissingBody) {
  flatbuffers::FlatBufferBuilder fbb;
  Bytes b = testing::Finish(fbb, At("r", 0, 0), wire::Body::NONE, flatbuffers::Offset<void>());
  EXPECT_EQ(Check(b).reject, Reject::kNoBody);
}

// A vector of `count` elements (`bytes` raw bytes, 8-byte values) whose elements start
// at 4 mod 8 in the finished buffer. FlatBufferBuilder never writes that; FlatBuffers
// 2.0.8's Verifier checks only the length field's 4-byte alignment and lets it pass.
flatbuffers::uoffset_t MisalignedVector(flatbuffers::FlatBufferBuilder& fbb, const void* raw,
                                        size_t bytes, size_t count) {
  // The builder grows down from the end of a buffer whose size ends up a multiple of 8
  // (the envelope has 8-byte fields): data that ends GetSize() bytes before the end
  // starts at -GetSize() mod 8. Push 4 bytes of padding when that would be 0.
  if ((fbb.GetSize() + bytes) % 8 != 4) fbb.PushElement<uint32_t>(0);
  fbb.StartVector(bytes / 4, 4);
  const auto* words = static_cast<const uint32_t*>(raw);
  for (size_t i = bytes / 4; i-- > 0;) fbb.PushElement(words[i]);
  return fbb.EndVector(count);
}

// The envelope's 8-byte vectors as the verifier saw them: passes, and misaligned.
void ExpectVerifiesMisaligned(const Bytes& b, const void* wide_data) {
  flatbuffers::Verifier v(b.data(), b.size());
  ASSERT_TRUE(wire::VerifyEnvelopeBuffer(v)) << "the test message itself is broken";
  ASSERT_EQ(reinterpret_cast<uintptr_t>(wide_data) % 8, 4u);
}

// fuzz_envelope: a TensorDirectory whose shape ([long]) started at 4 mod 8 was accepted,
// and InspectFormatter / RunDecoder then read it with misaligned 8-byte loads (UBSan:
// "load of misaligned address ... for type 'const long'").
TEST(EnvelopeCheck, RejectsMisalignedShapeVector) {
  flatbuffers::FlatBufferBuilder fbb;
  const int64_t shape[] = {2, 3};
  auto shape_v = flatbuffers::Offset<flatbuffers::Vector<int64_t>>(
      MisalignedVector(fbb, shape, sizeof shape, 2));
  auto name = fbb.CreateString("layer");
  std::vector<flatbuffers::Offset<wire::TensorInfo>> infos = {
      wire::CreateTensorInfo(fbb, 0, name, wire::TensorKind::Act, wire::DType::F32, shape_v, 0)};
  auto body = wire::CreateTensorDirectoryDirect(fbb, &infos);
  Bytes b = testing::Finish(fbb, At("r", 0, 0), wire::Body::TensorDirectory, body.Union());
  const auto* env = wire::GetEnvelope(b.data());
  ExpectVerifiesMisaligned(b, env->body_as_TensorDirectory()->tensors()->Get(0)->shape()->data());
  EnvelopeCheck c = Check(b);
  EXPECT_EQ(c.reject, Reject::kMalformed) << RejectName(c.reject);
  EXPECT_EQ(c.env, nullptr);
}

// FlatBufferBuilder writes an empty vector without aligning it (a 0-d tensor's shape:
// the loss inside a Hugging Face model's output). Nothing is loaded from it: accepted.
// test_neutrality.py found this: a transformers model's TensorDirectory was refused.
TEST(EnvelopeCheck, AcceptsEmptyShapeVectorAtAnyAlignment) {
  flatbuffers::FlatBufferBuilder fbb;
  auto shape_v = flatbuffers::Offset<flatbuffers::Vector<int64_t>>(
      MisalignedVector(fbb, nullptr, 0, 0));
  auto name = fbb.CreateString("<root>[loss]");
  std::vector<flatbuffers::Offset<wire::TensorInfo>> infos = {
      wire::CreateTensorInfo(fbb, 0, name, wire::TensorKind::Act, wire::DType::F32, shape_v, 0)};
  auto body = wire::CreateTensorDirectoryDirect(fbb, &infos);
  Bytes b = testing::Finish(fbb, At("r", 0, 0), wire::Body::TensorDirectory, body.Union());
  const auto* env = wire::GetEnvelope(b.data());
  ExpectVerifiesMisaligned(b, env->body_as_TensorDirectory()->tensors()->Get(0)->shape()->data());
  EnvelopeCheck c = Check(b);
  EXPECT_EQ(c.reject, Reject::kNone) << RejectName(c.reject);
  EXPECT_NE(c.env, nullptr);
}

// The same for StepStats' vector of TensorStat structs (8-byte aligned doubles).
TEST(EnvelopeCheck, RejectsMisalignedStatsVector) {
  flatbuffers::FlatBufferBuilder fbb;
  wire::TensorStat st(0, 0, 0, wire::DType::F16, 0, 0, 6, -1, 1, 0, 0.5, 2, 1, 0, 0, 1, 0, 0);
  auto stats_v = flatbuffers::Offset<flatbuffers::Vector<const wire::TensorStat*>>(
      MisalignedVector(fbb, &st, sizeof st, 1));
  auto body = wire::CreateStepStats(fbb, 3, stats_v);
  Bytes b = testing::Finish(fbb, At("r", 0, 0), wire::Body::StepStats, body.Union());
  const auto* env = wire::GetEnvelope(b.data());
  ExpectVerifiesMisaligned(b, env->body_as_StepStats()->stats()->data());
  EXPECT_EQ(Check(b).reject, Reject::kMalformed);
}

}  // namespace
}  // namespace lockstep::collector
