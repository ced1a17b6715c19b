#include "rules/rules_config.h"

namespace lockstep::collector {
namespace {

int Rank(DT d) {
  switch (d) {
    case DT::kF8E4M3:
    case DT::kF8E5M2: return 1;
    case DT::kBF16: return 2;
    case DT::kF16: return 3;
    case DT::kF32: return 4;
    case DT::kF64: return 5;
    default: return 0;  // not a float: no say in the precision
  }
}

}  // namespace

double ByPrecision::For(DT d) const {
  switch (d) {
    case DT::kF64: return fp64;
    case DT::kF16: return fp16;
    case DT::kBF16: return bf16;
    case DT::kF8E4M3:
    case DT::kF8E5M2: return fp8;
    default: return fp32;
  }
}

DT LowerPrecision(DT a, DT b) {
  const int ra = Rank(a), rb = Rank(b);
  if (ra == 0) return b;
  if (rb == 0) return a;
  return ra <= rb ? a : b;
}

}  // namespace lockstep::collector
