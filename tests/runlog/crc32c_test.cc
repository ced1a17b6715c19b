#include "runlog/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace lockstep::collector {
namespace {

// RFC 3720 (iSCSI) appendix B.4 test vectors, plus the classic "123456789" check value.
struct Vector {
  std::vector<uint8_t> data;
  uint32_t crc;
};

std::vector<Vector> KnownAnswers() {
  std::vector<Vector> v;
  v.push_back({std::vector<uint8_t>(32, 0x00), 0x8A9136AAu});
  v.push_back({std::vector<uint8_t>(32, 0xFF), 0x62A8AB43u});
  std::vector<uint8_t> up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<uint8_t>(i);
    down[i] = static_cast<uint8_t>(31 - i);
  }
  v.push_back({up, 0x46DD794Eu});
  v.push_back({down, 0x113FDB5Cu});
  const char* digits = "123456789";
  v.push_back({std::vector<uint8_t>(digits, digits + 9), 0xE3069283u});
  v.push_back({{}, 0u});
  return v;
}

TEST(Crc32c, SoftwareMatchesKnownAnswers) {
  for (const auto& v : KnownAnswers())
    EXPECT_EQ(crc32c::ExtendSoftware(0, v.data.data(), v.data.size()), v.crc);
}

TEST(Crc32c, HardwareMatchesKnownAnswers) {
  if (!crc32c::HardwareAvailable()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  for (const auto& v : KnownAnswers())
    EXPECT_EQ(crc32c::ExtendHardware(0, v.data.data(), v.data.size()), v.crc);
}

TEST(Crc32c, DispatchedMatchesKnownAnswers) {
  for (const auto& v : KnownAnswers()) EXPECT_EQ(crc32c::Value(v.data.data(), v.data.size()), v.crc);
}

TEST(Crc32c, ImplementationsAgreeOnEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  // Up to 4 x 3 x 8 KiB: the hardware path switches to three interleaved streams at
  // 3 x 256 and 3 x 8192 bytes, so lengths around and past both are covered.
  std::vector<uint8_t> buf(100000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths;
  for (size_t n = 0; n < 1024; n += (n < 64 ? 1 : 37)) lengths.push_back(n);
  for (size_t n : {767, 768, 769, 775, 776, 1536, 24575, 24576, 24577, 24583, 49152, 99000})
    lengths.push_back(n);
  for (size_t off = 0; off < 8; ++off) {
    for (size_t n : lengths) {
      uint32_t sw = crc32c::ExtendSoftware(0, buf.data() + off, n);
      EXPECT_EQ(crc32c::Value(buf.data() + off, n), sw) << off << " " << n;
      if (crc32c::HardwareAvailable()) {
        EXPECT_EQ(crc32c::ExtendHardware(0, buf.data() + off, n), sw) << off << " " << n;
      }
    }
  }
}

TEST(Crc32c, ExtendConcatenates) {
  const char* s = "hello, lockstep run log";
  size_t n = std::strlen(s);
  for (size_t cut = 0; cut <= n; ++cut) {
    uint32_t c = crc32c::Extend(crc32c::Value(s, cut), s + cut, n - cut);
    EXPECT_EQ(c, crc32c::Value(s, n));
  }
  EXPECT_NE(crc32c::Value("a", 1), crc32c::Value("b", 1));
}

}  // namespace
}  // namespace lockstep::collector
