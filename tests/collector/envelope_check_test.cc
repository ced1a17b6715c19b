#include "ingest/envelope_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "ingest/registry.h"
#include "runlog/inspect_format.h"
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
                         testing::Heartbeat(At("r", 0, 4), 0, 0), testing::Goodbye(At("r", 0, 5), 0)}) {
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
TEST(EnvelopeCheck, MutatedMessagesAreSafeForEveryConsumer) {
  std::vector<Bytes> seeds = {testing::Hello(At("m", 0, 0)),
                              testing::Directory(At("m", 0, 1), {{0, "a"}, {1, "b"}}),
                              testing::Stats(At("m", 0, 2), 3, 4, 8, 4),
                              testing::Scalars(At("m", 0, 3), 3, 0.5),
                              testing::Heartbeat(At("m", 0, 4), 1, 2),
                              testing::Goodbye(At("m", 0, 5), 9)};
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

}  // namespace
}  // namespace lockstep::collector
