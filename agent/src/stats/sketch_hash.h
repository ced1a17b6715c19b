// The count-sketch's bucket and sign, and the histogram's bin, as pure functions of
// the flat element index (docs/statistics.md "Count-sketch"). Header-only and
// constexpr so the kernels, the tests and anything else that needs the exact
// definition share one copy; agent/python/lockstep/_torch_stats.py mirrors it in
// int64 torch ops (every product stays below 2^63).
#ifndef LOCKSTEP_AGENT_STATS_SKETCH_HASH_H_
#define LOCKSTEP_AGENT_STATS_SKETCH_HASH_H_

#include <array>
#include <cstdint>

namespace lockstep::stats {

inline constexpr uint32_t kMixMul = 0x045D9F3Bu;  // < 2^31
inline constexpr uint32_t kSignSeed = 0x2545F491u;
inline constexpr uint32_t kRotSeed = 0x1B873593u;
inline constexpr uint32_t kPatSeed = 0x6A09E667u;
inline constexpr int kNumPatterns = 256;     // sign patterns, chosen per block
inline constexpr int kPatternBits = 256;     // = kMaxSketchK: one bit per block offset
inline constexpr int kPatternWords = kPatternBits / 32;

constexpr uint32_t Mix32(uint32_t v) {
  v = (v ^ (v >> 16)) * kMixMul;
  v = (v ^ (v >> 16)) * kMixMul;
  return v ^ (v >> 16);
}

constexpr uint32_t HashIndex(uint64_t i, uint32_t seed) {
  return Mix32(static_cast<uint32_t>(i) ^ seed ^ Mix32(static_cast<uint32_t>(i >> 32)));
}

// Per-block hashes: the rotation of block b (elements [b*K, (b+1)*K)), which of the
// sign patterns it uses and whether it flips that pattern. One index hash per block;
// the pattern choice re-mixes it.
constexpr uint32_t BlockRotationFromHash(uint32_t h1, int k) {
  return static_cast<uint32_t>((uint64_t{h1} * static_cast<uint64_t>(k)) >> 32);
}
constexpr uint32_t BlockRotation(uint64_t b, int k) {
  return BlockRotationFromHash(HashIndex(b, kRotSeed), k);
}
constexpr uint32_t BlockPatternHash(uint64_t b) { return Mix32(HashIndex(b, kRotSeed) ^ kPatSeed); }
constexpr uint32_t BlockPattern(uint64_t b) { return BlockPatternHash(b) >> 24; }
constexpr bool BlockFlip(uint64_t b) { return (BlockPatternHash(b) >> 23) & 1u; }

constexpr bool PatternBit(uint32_t p, uint32_t o) {
  return HashIndex(uint64_t{p} * kPatternBits + o, kSignSeed) >> 31;
}

// The 256 patterns as bits: word w of pattern p holds offsets [32w, 32w+32).
using PatternTable = std::array<uint32_t, kNumPatterns * kPatternWords>;
constexpr PatternTable MakePatternTable() {
  PatternTable t{};
  for (uint32_t p = 0; p < kNumPatterns; ++p)
    for (uint32_t o = 0; o < kPatternBits; ++o)
      if (PatternBit(p, o)) t[p * kPatternWords + o / 32] |= 1u << (o % 32);
  return t;
}
inline constexpr PatternTable kPatterns = MakePatternTable();

// sign(i) = -1 iff SketchNegative(i, k).
constexpr bool SketchNegative(uint64_t i, int k) {
  uint64_t b = i / static_cast<uint64_t>(k);
  uint32_t o = static_cast<uint32_t>(i % static_cast<uint64_t>(k));
  return PatternBit(BlockPattern(b), o) != BlockFlip(b);
}
constexpr uint32_t SketchBucket(uint64_t i, int k) {
  uint64_t b = i / static_cast<uint64_t>(k);
  uint32_t o = static_cast<uint32_t>(i % static_cast<uint64_t>(k));
  return (o + BlockRotation(b, k)) % static_cast<uint32_t>(k);
}

// Histogram bin of a finite value from its unbiased binary exponent e = floor(log2|x|)
// (x != 0); zero is bin 0. Bins 2..14 hold four binades each from 2^-40 up.
constexpr int HistBinFromExponent(int e) {
  int b = 2 + ((e + 40) >> 2);  // arithmetic shift: floor division by 4
  return b < 1 ? 1 : (b > 15 ? 15 : b);
}
// Biased fp32 exponent at which bin b (2..15) starts.
constexpr int HistBinStartF32Exponent(int b) { return 87 + 4 * (b - 2); }

}  // namespace lockstep::stats

#endif  // LOCKSTEP_AGENT_STATS_SKETCH_HASH_H_
