#include "runlog/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define LOCKSTEP_CRC32C_X86 1
#endif

namespace lockstep::collector::crc32c {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, reflected

// Slicing-by-8 tables: table[k][b] is the CRC of byte b followed by k zero bytes,
// so eight input bytes are folded with eight lookups instead of eight rounds.
struct Tables {
  uint32_t t[8][256];
  constexpr Tables() : t{} {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
  }
};
constexpr Tables kTables;

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian hosts only (x86, arm64): the log is LE too
  return v;
}

#ifdef LOCKSTEP_CRC32C_X86
// One crc32q instruction per 8 bytes has a 3-cycle latency but a 1-cycle throughput,
// so three independent streams over three adjacent blocks run ~3x faster than one.
// The three partial CRCs are joined with "shift by N zero bytes" operators (after Mark
// Adler's crc32c.c): crc(A|B) = shift_|B|(crc(A)) ^ crc0(B), linear over GF(2).
constexpr size_t kLong = 8192, kShort = 256;

uint32_t Gf2Times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec; vec >>= 1, ++mat)
    if (vec & 1) sum ^= *mat;
  return sum;
}
void Gf2Square(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = Gf2Times(mat, mat[n]);
}

// Four byte-wise tables applying `len` (a power of two) zero bytes to a CRC register.
struct ShiftTables {
  uint32_t t[4][256];
  explicit ShiftTables(size_t len) {
    uint32_t even[32], odd[32];
    odd[0] = kPoly;  // the operator for one zero bit
    for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
    Gf2Square(even, odd);  // 2 bits
    Gf2Square(odd, even);  // 4 bits
    const uint32_t* op = nullptr;
    for (;;) {
      Gf2Square(even, odd);  // 8 bits = 1 byte, then 4, 16, ... bytes
      len >>= 1;
      if (len == 0) {
        op = even;
        break;
      }
      Gf2Square(odd, even);
      len >>= 1;
      if (len == 0) {
        op = odd;
        break;
      }
    }
    for (uint32_t n = 0; n < 256; ++n) {
      t[0][n] = Gf2Times(op, n);
      t[1][n] = Gf2Times(op, n << 8);
      t[2][n] = Gf2Times(op, n << 16);
      t[3][n] = Gf2Times(op, n << 24);
    }
  }
  uint32_t Shift(uint32_t crc) const {
    return t[0][crc & 0xFF] ^ t[1][(crc >> 8) & 0xFF] ^ t[2][(crc >> 16) & 0xFF] ^ t[3][crc >> 24];
  }
};

const ShiftTables& LongShift() {
  static const ShiftTables t(kLong);
  return t;
}
const ShiftTables& ShortShift() {
  static const ShiftTables t(kShort);
  return t;
}

template <size_t kBlock>
__attribute__((target("sse4.2"))) inline uint64_t ThreeWay(uint64_t c0, const uint8_t*& p,
                                                           size_t& n, const ShiftTables& shift) {
  while (n >= 3 * kBlock) {
    uint64_t c1 = 0, c2 = 0;
    const uint8_t* end = p + kBlock;
    do {
      c0 = _mm_crc32_u64(c0, Load64(p));
      c1 = _mm_crc32_u64(c1, Load64(p + kBlock));
      c2 = _mm_crc32_u64(c2, Load64(p + 2 * kBlock));
      p += 8;
    } while (p < end);
    c0 = shift.Shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c0 = shift.Shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c2);
    p += 2 * kBlock;
    n -= 3 * kBlock;
  }
  return c0;
}

__attribute__((target("sse4.2"))) uint32_t Sse42(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = static_cast<uint32_t>(~crc);
  if (n >= 3 * kShort) {
    c = ThreeWay<kLong>(c, p, n, LongShift());
    c = ThreeWay<kShort>(c, p, n, ShortShift());
  }
  while (n >= 8) {
    c = _mm_crc32_u64(c, Load64(p));
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}
#endif

using ExtendFn = uint32_t (*)(uint32_t, const void*, size_t);

ExtendFn Pick() {
#ifdef LOCKSTEP_CRC32C_X86
  if (HardwareAvailable()) return &ExtendHardware;
#endif
  return &ExtendSoftware;
}

}  // namespace

bool HardwareAvailable() {
#ifdef LOCKSTEP_CRC32C_X86
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
#else
  return false;
#endif
}

uint32_t ExtendSoftware(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  const auto& t = kTables.t;
  uint32_t c = ~crc;
  while (n >= 8) {
    uint64_t v = Load64(p) ^ c;
    c = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^
        t[4][(v >> 24) & 0xFF] ^ t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^
        t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = t[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n) {
#ifdef LOCKSTEP_CRC32C_X86
  return Sse42(crc, static_cast<const uint8_t*>(data), n);
#else
  return ExtendSoftware(crc, data, n);
#endif
}

uint32_t Extend(uint32_t crc, const void* data, size_t n) {
  static const ExtendFn fn = Pick();
  return fn(crc, data, n);
}

}  // namespace lockstep::collector::crc32c
