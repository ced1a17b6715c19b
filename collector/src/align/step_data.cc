#include "align/step_data.h"

#include "lockstep/common/wire_names.h"

namespace lockstep::collector {

const char* KindName(Kind k) { return wire::KindName(static_cast<uint8_t>(k)); }

const char* DTypeName(DT d) {
  switch (d) {
    case DT::kUnknown: return "unknown";
    case DT::kF32: return "fp32";
    case DT::kF16: return "fp16";
    case DT::kBF16: return "bf16";
    case DT::kF64: return "fp64";
    case DT::kI8: return "int8";
    case DT::kU8: return "uint8";
    case DT::kI16: return "int16";
    case DT::kI32: return "int32";
    case DT::kI64: return "int64";
    case DT::kBool: return "bool";
    case DT::kF8E4M3: return "fp8_e4m3";
    case DT::kF8E5M2: return "fp8_e5m2";
  }
  return "unknown";
}

bool IsLowPrecisionFloat(DT d) {
  return d == DT::kF16 || d == DT::kBF16 || d == DT::kF8E4M3 || d == DT::kF8E5M2;
}

double DTypeMaxFinite(DT d) {
  switch (d) {
    case DT::kF16: return 65504.0;
    case DT::kBF16: return 3.3895313892515355e38;
    case DT::kF32: return 3.4028234663852886e38;
    case DT::kF64: return 1.7976931348623157e308;
    case DT::kF8E4M3: return 448.0;
    case DT::kF8E5M2: return 57344.0;
    default: return 0.0;
  }
}

}  // namespace lockstep::collector
