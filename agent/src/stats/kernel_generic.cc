// The one-pass stats kernel for the Generic ISA (4 lanes, SSE2); see kernel_body.inc.
// CMake compiles this file with the matching target flags; host_stats.cc calls it
// only when the CPU supports them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <immintrin.h>

#include "stats/kernel.h"

namespace lockstep::stats {
namespace {
#define LOCKSTEP_STATS_W 4
#include "stats/kernel_body.inc"
#undef LOCKSTEP_STATS_W
}  // namespace

void AccumulateF32_Generic(const float* p, uint64_t n, const KernelParams& kp, Acc* acc) {
  Run<In::kF32>(p, n, kp, acc);
}
void AccumulateF16_Generic(const uint16_t* p, uint64_t n, const KernelParams& kp, Acc* acc) {
  Run<In::kF16>(p, n, kp, acc);
}
void AccumulateBF16_Generic(const uint16_t* p, uint64_t n, const KernelParams& kp, Acc* acc) {
  Run<In::kBF16>(p, n, kp, acc);
}

}  // namespace lockstep::stats
