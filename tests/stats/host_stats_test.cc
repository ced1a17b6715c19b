// The host kernel against a float64 reference written straight from
// docs/statistics.md, for fp32/fp16/bf16/fp64 inputs with NaN, +-Inf, zeros,
// subnormals, saturating and huge values, on every vector kernel this CPU has.
// Tolerances (docs/statistics.md "Precision"): counts, min, max, absmax and the
// histogram exact; mean within 1e-6 * (|mean| + std) + 1e-7 * absmax; std and l2 within
// 1e-6 relative; sketch entries within 1e-5 * l2 absolute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "lockstep/agent/host_stats.h"
#include "stats/kernel.h"
#include "stats/sketch_hash.h"

namespace lockstep {
namespace {

using stats::Isa;

uint16_t FloatToHalf(float f) {  // round to nearest even, for test data only
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7E00u);
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7C00u);
  if (a < 0x1p-14f) {  // subnormal: multiples of 2^-24
    uint32_t m = static_cast<uint32_t>(std::nearbyint(a * 0x1p24f));
    return static_cast<uint16_t>(sign | m);
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  uint32_t mant = static_cast<uint32_t>(std::nearbyint((m * 2 - 1) * 1024));
  uint32_t exp = static_cast<uint32_t>(e - 1 + 15);
  if (mant == 1024) { mant = 0; ++exp; }
  return static_cast<uint16_t>(sign | (exp << 10) | mant);
}
uint16_t FloatToBf16(float f) {  // truncation is fine: the test only needs bf16 values
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if (std::isnan(f)) return 0x7FC0;
  return static_cast<uint16_t>(x >> 16);
}

// Values as the kernel sees them (after rounding to the storage dtype), as double.
struct Buffer {
  DType dtype;
  std::vector<float> f32;
  std::vector<double> f64;
  std::vector<uint16_t> u16;
  std::vector<double> values;
  const void* data() const {
    if (dtype == DType::kF32) return f32.data();
    if (dtype == DType::kF64) return f64.data();
    return u16.data();
  }
};

Buffer MakeBuffer(DType dtype, const std::vector<double>& raw) {
  Buffer b;
  b.dtype = dtype;
  for (double v : raw) {
    switch (dtype) {
      case DType::kF32: b.f32.push_back(static_cast<float>(v)); b.values.push_back(b.f32.back()); break;
      case DType::kF64: b.f64.push_back(v); b.values.push_back(v); break;
      case DType::kF16:
        b.u16.push_back(FloatToHalf(static_cast<float>(v)));
        b.values.push_back(stats::HalfToFloat(b.u16.back()));
        break;
      default:
        b.u16.push_back(FloatToBf16(static_cast<float>(v)));
        b.values.push_back(stats::Bf16ToFloat(b.u16.back()));
        break;
    }
  }
  return b;
}

// Random data with every special kind sprinkled in.
std::vector<double> MakeRaw(size_t n, uint32_t seed, double scale, bool specials) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.5, scale);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<double> v(n);
  const double inf = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) {
    v[i] = nd(rng);
    if (!specials) continue;
    switch (pick(rng)) {
      case 0: v[i] = std::numeric_limits<double>::quiet_NaN(); break;
      case 1: v[i] = inf; break;
      case 2: v[i] = -inf; break;
      case 3: v[i] = 0.0; break;
      case 4: v[i] = -0.0; break;
      case 5: v[i] = 1e-40; break;       // fp32 subnormal; 0 in fp16
      case 6: v[i] = -3e-6; break;       // fp16 subnormal
      case 7: v[i] = 65504.0; break;     // fp16 max: saturated
      case 8: v[i] = -70000.0; break;    // beyond fp16
      case 9: v[i] = 1e-12; break;       // below fp16's min normal
      case 10: v[i] = 3e-42; break;      // deep fp32 subnormal
      default: break;
    }
  }
  return v;
}

struct Ref {
  TensorStats s;
  std::vector<double> sketch;
};

Ref Reference(const std::vector<double>& x, DType dtype, int k, int bins) {
  Ref r;
  TensorStats& s = r.s;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  DType lim = LimitDType(dtype);
  double sat = lim == DType::kBF16 ? 0x1.FEp127 : 65504.0;
  double mnorm = lim == DType::kBF16 ? 0x1p-126 : 0x1p-14;
  s.numel = x.size();
  s.limit_dtype = lim;
  double sum = 0, sq = 0, mn = INFINITY, mx = -INFINITY;
  uint64_t nf = 0;
  r.sketch.assign(k, 0.0);
  std::vector<uint64_t> hist(kHistBins, 0);
  for (size_t i = 0; i < x.size(); ++i) {
    double v = x[i];
    if (std::isnan(v)) { ++s.nan_count; continue; }
    if (std::isinf(v)) { ++s.inf_count; continue; }
    ++nf;
    sum += v;
    sq += v * v;
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    double a = std::fabs(v);
    if (v == 0) ++s.zero_count;
    else if (a < mnorm) ++s.subnormal_count;
    if (a >= sat) ++s.sat_count;
    if (v == 0) ++hist[0];
    else ++hist[stats::HistBinFromExponent(static_cast<int>(std::floor(std::log2(a))))];
    if (k > 0) {
      double sv = stats::SketchNegative(i, k) ? -v : v;
      r.sketch[stats::SketchBucket(i, k)] += sv;
    }
  }
  if (nf == 0) {
    s.min = s.max = s.mean = s.std = s.l2 = s.absmax = nan;
  } else {
    s.mean = sum / nf;
    double var = 0;
    for (double v : x)
      if (std::isfinite(v)) var += (v - s.mean) * (v - s.mean);
    s.std = std::sqrt(var / nf);
    s.l2 = std::sqrt(sq);
    s.min = mn;
    s.max = mx;
    s.absmax = std::max(-mn, mx);
  }
  s.sketch_k = static_cast<uint16_t>(k);
  s.hist_bins = static_cast<uint8_t>(bins);
  for (int b = 0; b < bins; ++b) s.hist[b] = static_cast<uint32_t>(hist[b]);
  return r;
}

void ExpectSameNaN(double got, double want, const char* what) {
  if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << what;
}

void Compare(const TensorStats& got, const Ref& ref, const std::string& where) {
  const TensorStats& w = ref.s;
  SCOPED_TRACE(where);
  EXPECT_EQ(got.numel, w.numel);
  EXPECT_EQ(got.nan_count, w.nan_count);
  EXPECT_EQ(got.inf_count, w.inf_count);
  EXPECT_EQ(got.zero_count, w.zero_count);
  EXPECT_EQ(got.sat_count, w.sat_count);
  EXPECT_EQ(got.subnormal_count, w.subnormal_count);
  EXPECT_EQ(got.limit_dtype, w.limit_dtype);
  ASSERT_EQ(got.sketch_k, w.sketch_k);
  ASSERT_EQ(got.hist_bins, w.hist_bins);
  for (int b = 0; b < w.hist_bins; ++b) EXPECT_EQ(got.hist[b], w.hist[b]) << "hist bin " << b;
  if (std::isnan(w.mean)) {
    for (double v : {got.min, got.max, got.mean, got.std, got.l2, got.absmax}) EXPECT_TRUE(std::isnan(v));
    return;
  }
  EXPECT_EQ(got.min, w.min);
  EXPECT_EQ(got.max, w.max);
  EXPECT_EQ(got.absmax, w.absmax);
  EXPECT_NEAR(got.mean, w.mean, 1e-6 * (std::fabs(w.mean) + w.std) + 1e-7 * w.absmax);
  EXPECT_NEAR(got.std, w.std, 1e-6 * w.std + 1e-300);
  EXPECT_NEAR(got.l2, w.l2, 1e-6 * w.l2);
  for (int j = 0; j < w.sketch_k; ++j)
    EXPECT_NEAR(got.sketch[j], ref.sketch[j], 1e-5 * w.l2 + 1e-30) << "sketch " << j;
}

std::vector<Isa> Isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512})
    if (stats::IsaSupported(i)) v.push_back(i);
  return v;
}

TEST(HostStats, MatchesFloat64ReferenceForEveryDtypeKernelAndShape) {
  const size_t sizes[] = {0, 1, 7, 16, 33, 100, 4096, 3 * 4096 + 17, 70001};
  const int ks[] = {0, 1, 5, 32, 64, 100, 256};
  int cases = 0;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64}) {
    for (size_t n : sizes) {
      for (int k : ks) {
        if (n > 5000 && k != 32 && k != 0 && k != 100) continue;  // keep the test fast
        const int bins = (k == 5) ? 0 : kHistBins;
        Buffer buf = MakeBuffer(dt, MakeRaw(n, static_cast<uint32_t>(n * 31 + k), 2.0, true));
        Ref ref = Reference(buf.values, dt, k, bins);
        for (Isa isa : Isas()) {
          TensorStats got;
          StatsConfig cfg{k, bins};
          ASSERT_TRUE(stats::ComputeHostStatsWithIsa(buf.data(), dt, n, cfg, isa, &got).ok());
          Compare(got, ref, "dtype " + std::to_string(int(dt)) + " n " + std::to_string(n) +
                                " k " + std::to_string(k) + " isa " + std::to_string(int(isa)));
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 100);
}

TEST(HostStats, CleanSmallTensorsMatchReferenceForEveryKernel) {
  // Without NaN/Inf only the fast pass runs. Below K blocks of K elements the kernel
  // adds each block's sketch row directly instead of through its K x K table (cheaper
  // there); sizes on both sides of that switch, and of a fixed-K step's blocks.
  const size_t sizes[] = {31, 32, 33, 64, 100, 127, 128, 512, 1000, 1023, 1024, 1025, 2048 + 5,
                          4096 + 64};
  int cases = 0;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (size_t n : sizes) {
      for (int k : {32, 64, 40}) {
        Buffer buf = MakeBuffer(dt, MakeRaw(n, static_cast<uint32_t>(n * 7 + k), 2.0, false));
        Ref ref = Reference(buf.values, dt, k, kHistBins);
        for (Isa isa : Isas()) {
          TensorStats got;
          StatsConfig cfg{k, kHistBins};
          ASSERT_TRUE(stats::ComputeHostStatsWithIsa(buf.data(), dt, n, cfg, isa, &got).ok());
          Compare(got, ref, "dtype " + std::to_string(int(dt)) + " n " + std::to_string(n) +
                                " k " + std::to_string(k) + " isa " + std::to_string(int(isa)));
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 80);
}

TEST(HostStats, CleanTilesAndTilesWithSpecialsAgreeWithReference) {
  // The vector kernels take a fast path for tiles (8192 elements) holding no NaN/Inf
  // and nothing at limit_dtype's max exponent, and redo the other tiles with masks.
  // Mostly clean data, specials only in some tiles: both paths, and the seams
  // between them, against the reference. Zeros and subnormals stay on the fast path.
  const size_t n = 5 * 8192 + 1000;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<double> raw = MakeRaw(n, 21, 3.0, false);
    for (size_t i = 5; i < n; i += 613) raw[i] = 0.0;             // zeros everywhere
    for (size_t i = 11; i < n; i += 1777) raw[i] = -2e-7;         // fp16 subnormal
    raw[2 * 8192 + 3] = std::numeric_limits<double>::quiet_NaN();  // tile 2: NaN
    raw[3 * 8192 + 100] = -std::numeric_limits<double>::infinity();  // tile 3: -Inf
    raw[4 * 8192 + 7] = 65504.0;                                   // tile 4: saturated
    raw[4 * 8192 + 8] = 40000.0;                                   // same exponent, not
    Buffer buf = MakeBuffer(dt, raw);
    for (int k : {0, 32, 64, 100}) {
      Ref ref = Reference(buf.values, dt, k, kHistBins);
      for (Isa isa : Isas()) {
        TensorStats got;
        ASSERT_TRUE(stats::ComputeHostStatsWithIsa(buf.data(), dt, n, StatsConfig{k, kHistBins}, isa, &got).ok());
        Compare(got, ref, "dtype " + std::to_string(int(dt)) + " k " + std::to_string(k) + " isa " +
                              std::to_string(int(isa)));
      }
    }
  }
}

TEST(HostStats, HugeValuesFallBackToDoubleAndStayExact) {
  // |x| ~ 1e30: x^2 overflows float, so the float partial sums cannot be used.
  std::vector<double> raw = MakeRaw(10000, 3, 1.0, true);
  for (size_t i = 0; i < raw.size(); i += 97) raw[i] = (i % 2 ? 1e30 : -3e35);  // sketch sums stay within float
  Buffer buf = MakeBuffer(DType::kF32, raw);
  Ref ref = Reference(buf.values, DType::kF32, 32, kHistBins);
  for (Isa isa : Isas()) {
    TensorStats got;
    ASSERT_TRUE(stats::ComputeHostStatsWithIsa(buf.data(), DType::kF32, raw.size(), StatsConfig{}, isa, &got).ok());
    EXPECT_TRUE(std::isfinite(got.l2));
    Compare(got, ref, "huge");
  }
}

TEST(HostStats, MeanFarFromZeroKeepsStdPrecise) {
  // mean/std = 1e6: a naive E[x^2] - mean^2 in float would lose every digit.
  std::vector<double> raw(50000);
  std::mt19937 rng(5);
  std::normal_distribution<double> nd(0, 1.0);
  for (auto& v : raw) v = 1000.0 + 1e-3 * nd(rng);
  Buffer buf = MakeBuffer(DType::kF32, raw);
  Ref ref = Reference(buf.values, DType::kF32, 32, kHistBins);
  TensorStats got;
  ASSERT_TRUE(ComputeHostStats(buf.data(), DType::kF32, raw.size(), StatsConfig{}, &got).ok());
  EXPECT_NEAR(got.std, ref.s.std, 1e-3 * ref.s.std);
  std::vector<float> same(1000, 3.25f);
  ASSERT_TRUE(ComputeHostStats(same.data(), DType::kF32, same.size(), StatsConfig{}, &got).ok());
  EXPECT_EQ(got.std, 0.0);
  EXPECT_EQ(got.mean, 3.25);
}

TEST(HostStats, AllNonFiniteGivesNaNStatisticsAndExactCounts) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {NAN, inf, -inf, NAN, NAN};
  TensorStats got;
  ASSERT_TRUE(ComputeHostStats(x.data(), DType::kF32, x.size(), StatsConfig{}, &got).ok());
  EXPECT_EQ(got.nan_count, 3u);
  EXPECT_EQ(got.inf_count, 2u);
  EXPECT_TRUE(std::isnan(got.min) && std::isnan(got.mean) && std::isnan(got.l2) && std::isnan(got.absmax));
  for (int j = 0; j < got.sketch_k; ++j) EXPECT_EQ(got.sketch[j], 0.0f);
  for (int b = 0; b < kHistBins; ++b) EXPECT_EQ(got.hist[b], 0u);
}

TEST(HostStats, LimitDtypeIsOwnLowPrecisionDtypeOrFp16) {
  EXPECT_EQ(LimitDType(DType::kF32), DType::kF16);
  EXPECT_EQ(LimitDType(DType::kF64), DType::kF16);
  EXPECT_EQ(LimitDType(DType::kBF16), DType::kBF16);
  EXPECT_EQ(LimitDType(DType::kF16), DType::kF16);
  EXPECT_EQ(LimitDType(DType::kI32), DType::kUnknown);
  // The thresholds are inclusive at the max finite value and exclusive at min normal.
  std::vector<float> x = {65504.0f, 65503.0f, 0x1p-14f, 0x1.fffffep-15f, 0.0f};
  TensorStats got;
  ASSERT_TRUE(ComputeHostStats(x.data(), DType::kF32, x.size(), StatsConfig{}, &got).ok());
  EXPECT_EQ(got.sat_count, 1u);
  EXPECT_EQ(got.subnormal_count, 1u);
  EXPECT_EQ(got.limit_dtype, DType::kF16);
}

TEST(HostStats, SketchHashKnownAnswers) {
  struct Kat { uint64_t i; uint32_t bucket; int negative; };
  const Kat kats[] = {{0ull, 11, 1}, {1ull, 12, 1}, {2ull, 13, 0}, {31ull, 10, 1}, {32ull, 29, 0},
                      {33ull, 30, 0}, {1000ull, 27, 1}, {4294967301ull, 1, 1}, {123456789012ull, 2, 0}};
  for (const Kat& k : kats) {
    EXPECT_EQ(stats::SketchBucket(k.i, 32), k.bucket) << k.i;
    EXPECT_EQ(stats::SketchNegative(k.i, 32), k.negative != 0) << k.i;
  }
  EXPECT_EQ(stats::Mix32(1), 824515495u);
  EXPECT_EQ(stats::HashIndex(5, stats::kSignSeed), 1464143695u);
  // A small tensor, end to end: x = 1..10 with K = 4.
  float x[10];
  for (int i = 0; i < 10; ++i) x[i] = static_cast<float>(i + 1);
  TensorStats st;
  ASSERT_TRUE(ComputeHostStats(x, DType::kF32, 10, StatsConfig{4, kHistBins}, &st).ok());
  const float want[4] = {10, -17, 16, 8};
  for (int j = 0; j < 4; ++j) EXPECT_EQ(st.sketch[j], want[j]) << j;
}

TEST(HostStats, SketchIsDeterministicAndIndependentOfKernel) {
  Buffer buf = MakeBuffer(DType::kF32, MakeRaw(100000, 11, 1.0, false));
  TensorStats a, b;
  ASSERT_TRUE(stats::ComputeHostStatsWithIsa(buf.data(), DType::kF32, 100000, StatsConfig{}, Isa::kGeneric, &a).ok());
  for (Isa isa : Isas()) {
    ASSERT_TRUE(stats::ComputeHostStatsWithIsa(buf.data(), DType::kF32, 100000, StatsConfig{}, isa, &b).ok());
    for (int j = 0; j < 32; ++j) EXPECT_NEAR(a.sketch[j], b.sketch[j], 1e-5 * a.l2);
  }
  // Buckets are used evenly: each block of K covers all K buckets exactly once.
  std::vector<int> seen(32, 0);
  for (uint64_t i = 64; i < 96; ++i) ++seen[stats::SketchBucket(i, 32)];
  for (int c : seen) EXPECT_EQ(c, 1);
}

// A view of a buffer: what torch's (sizes, strides, storage offset) describe.
struct View {
  std::vector<int64_t> sizes, strides;
  int64_t offset;
};

// The view's elements in flat (row-major) order.
std::vector<double> ViewValues(const std::vector<double>& storage, const View& v) {
  std::vector<double> out;
  std::vector<int64_t> idx(v.sizes.size(), 0);
  uint64_t n = 1;
  for (int64_t s : v.sizes) n *= static_cast<uint64_t>(s);
  for (uint64_t i = 0; i < n; ++i) {
    int64_t off = v.offset;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * v.strides[d];
    out.push_back(storage[static_cast<size_t>(off)]);
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < v.sizes[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

TEST(HostStats, StridedViewsMatchTheReferenceOfTheirFlatValues) {
  // Transposed, permuted (attention's (B, S, D) view of an (S, B, D) buffer), sliced,
  // strided, broadcast and mostly-size-1 views, over several chunks, with every kind
  // of special value: the statistics of the logical tensor, sketch included.
  const View views[] = {
      {{70, 300}, {1, 70}, 0},                // transpose: element-wise gather
      {{16, 64, 128}, {128, 2048, 1}, 0},     // permuted: runs of 128
      {{50, 33}, {100, 1}, 5},                // slice of rows: runs of 33
      {{5000}, {2}, 1},                       // every other element
      {{40, 257}, {0, 1}, 3},                 // a row broadcast 40 times
      {{3, 40, 200}, {200, 600, 1}, 0},       // several 32 KB chunks
      {{1, 8, 1, 500}, {9999, 500, 7, 1}, 11},  // size-1 dims: merges to contiguous
  };
  const size_t storage_n = 140000;
  int cases = 0;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64}) {
    Buffer buf = MakeBuffer(dt, MakeRaw(storage_n, 77 + static_cast<uint32_t>(dt), 2.0, true));
    const size_t esize = dt == DType::kF64 ? 8 : dt == DType::kF32 ? 4 : 2;
    for (const View& v : views) {
      std::vector<double> flat = ViewValues(buf.values, v);
      HostLayout layout;
      ASSERT_TRUE(MakeHostLayout(v.sizes.data(), v.strides.data(), static_cast<int>(v.sizes.size()),
                                 &layout).ok());
      EXPECT_EQ(layout.numel, flat.size());
      const void* data = static_cast<const char*>(buf.data()) + v.offset * esize;
      for (int k : {0, 5, 32, 48, 256}) {
        Ref ref = Reference(flat, dt, k, kHistBins);
        for (Isa isa : Isas()) {
          TensorStats got;
          ASSERT_TRUE(stats::ComputeHostStatsStridedWithIsa(data, dt, layout, StatsConfig{k, kHistBins},
                                                            isa, &got).ok());
          Compare(got, ref, "dtype " + std::to_string(int(dt)) + " view of " +
                                std::to_string(flat.size()) + " k " + std::to_string(k) + " isa " +
                                std::to_string(int(isa)));
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 100);
}

TEST(HostStats, HostLayoutMergesDimsAndRejectsWhatItCannotRead) {
  HostLayout l;
  // A contiguous 3-D tensor is one run; size-1 dims vanish whatever their stride.
  const int64_t sz[] = {4, 1, 5, 6}, st[] = {30, 77, 6, 1};
  ASSERT_TRUE(MakeHostLayout(sz, st, 4, &l).ok());
  EXPECT_TRUE(l.contiguous());
  EXPECT_EQ(l.numel, 120u);
  // Rows of a wider matrix: two dims, runs of 5.
  const int64_t sz2[] = {3, 5}, st2[] = {8, 1};
  ASSERT_TRUE(MakeHostLayout(sz2, st2, 2, &l).ok());
  EXPECT_FALSE(l.contiguous());
  EXPECT_EQ(l.ndim, 2);
  // Empty and 0-d tensors.
  const int64_t sz3[] = {3, 0}, st3[] = {1, 3};
  ASSERT_TRUE(MakeHostLayout(sz3, st3, 2, &l).ok());
  EXPECT_EQ(l.numel, 0u);
  EXPECT_TRUE(l.contiguous());
  ASSERT_TRUE(MakeHostLayout(nullptr, nullptr, 0, &l).ok());
  EXPECT_EQ(l.numel, 1u);
  EXPECT_TRUE(l.contiguous());
  // A negative stride, and nine dims that cannot be merged, are refused in a sentence.
  const int64_t sz4[] = {2, 3}, st4[] = {-3, 1};
  Status s = MakeHostLayout(sz4, st4, 2, &l);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("stride -3"), std::string::npos) << s.message();
  int64_t sz9[9], st9[9];
  for (int d = 0; d < 9; ++d) {
    sz9[d] = 2;
    st9[d] = int64_t{1} << (2 * (8 - d));  // every dim skips one: nothing merges
  }
  s = MakeHostLayout(sz9, st9, 9, &l);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("contiguous"), std::string::npos) << s.message();
}

TEST(HostStats, RejectsBadArgumentsWithOneSentence) {
  float x[4] = {};
  TensorStats st;
  Status s = ComputeHostStats(x, DType::kI32, 4, StatsConfig{}, &st);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("fp32"), std::string::npos);
  EXPECT_TRUE(ComputeHostStats(x, DType::kF32, 4, StatsConfig{257, 16}, &st).IsInvalidArgument());
  EXPECT_TRUE(ComputeHostStats(x, DType::kF32, 4, StatsConfig{-1, 16}, &st).IsInvalidArgument());
  EXPECT_TRUE(ComputeHostStats(x, DType::kF32, 4, StatsConfig{32, 8}, &st).IsInvalidArgument());
  EXPECT_TRUE(ComputeHostStats(nullptr, DType::kF32, 4, StatsConfig{}, &st).IsInvalidArgument());
  EXPECT_TRUE(ComputeHostStats(x, DType::kF32, 4, StatsConfig{}, nullptr).IsInvalidArgument());
  EXPECT_TRUE(ComputeHostStats(nullptr, DType::kF32, 0, StatsConfig{}, &st).ok());
}

}  // namespace
}  // namespace lockstep
