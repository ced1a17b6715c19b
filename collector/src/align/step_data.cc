#include "align/step_data.h"

#include "lockstep/common/wire_names.h"
#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::collector {

// Kind and DT are the wire's enums kept as bytes (step_data.h): the same values.
using wire::SameValue;
static_assert(SameValue(Kind::kAct, wire::TensorKind::Act) &&
              SameValue(Kind::kActGrad, wire::TensorKind::ActGrad) &&
              SameValue(Kind::kParamGrad, wire::TensorKind::ParamGrad) &&
              SameValue(Kind::kParam, wire::TensorKind::Param) &&
              SameValue(Kind::kOptim, wire::TensorKind::Optim) &&
              SameValue(Kind::kLoss, wire::TensorKind::Loss) &&
              SameValue(Kind::kInput, wire::TensorKind::Input) &&
              SameValue(Kind::kActIn, wire::TensorKind::ActIn) &&
              SameValue(Kind::kGradReduced, wire::TensorKind::GradReduced) &&
              wire::TensorKind::MAX == wire::TensorKind::GradReduced,
              "step_data.h's Kind is schema/lockstep.fbs's TensorKind");
static_assert(SameValue(DT::kUnknown, wire::DType::Unknown) &&
              SameValue(DT::kF32, wire::DType::F32) && SameValue(DT::kF16, wire::DType::F16) &&
              SameValue(DT::kBF16, wire::DType::BF16) && SameValue(DT::kF64, wire::DType::F64) &&
              SameValue(DT::kI8, wire::DType::I8) && SameValue(DT::kU8, wire::DType::U8) &&
              SameValue(DT::kI16, wire::DType::I16) && SameValue(DT::kI32, wire::DType::I32) &&
              SameValue(DT::kI64, wire::DType::I64) && SameValue(DT::kBool, wire::DType::Bool) &&
              SameValue(DT::kF8E4M3, wire::DType::F8E4M3) &&
              SameValue(DT::kF8E5M2, wire::DType::F8E5M2) &&
              wire::DType::MAX == wire::DType::F8E5M2,
              "step_data.h's DT is schema/lockstep.fbs's DType");

const char* KindName(Kind k) { return wire::KindName(static_cast<uint8_t>(k)); }

const char* DTypeName(DT d) { return wire::DTypeName(static_cast<uint8_t>(d)); }

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
