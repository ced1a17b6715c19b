#include "lockstep/common/wire_names.h"

#include <iterator>

#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::wire {

const char* RoleName(uint8_t role) {
  switch (static_cast<Role>(role)) {
    case Role::Baseline: return "baseline";
    case Role::Candidate: return "candidate";
    case Role::Solo: return "solo";
    default: return "unknown";
  }
}

const char* KindName(uint8_t kind) {
  switch (static_cast<TensorKind>(kind)) {
    case TensorKind::Act: return "act";
    case TensorKind::ActGrad: return "act_grad";
    case TensorKind::ParamGrad: return "param_grad";
    case TensorKind::Param: return "param";
    case TensorKind::Optim: return "optim";
    case TensorKind::Loss: return "loss";
    case TensorKind::Input: return "input";
    case TensorKind::ActIn: return "act_in";
    case TensorKind::GradReduced: return "grad_reduced";
  }
  return "unknown";
}

const char* DTypeName(uint8_t dtype) {
  static const char* const kNames[] = {"unknown", "fp32",  "fp16",  "bf16", "fp64",
                                       "int8",    "uint8", "int16", "int32", "int64",
                                       "bool",    "fp8_e4m3", "fp8_e5m2"};
  static_assert(std::size(kNames) == static_cast<size_t>(DType::MAX) + 1,
                "a name for every DType of schema/lockstep.fbs");
  return dtype < std::size(kNames) ? kNames[dtype] : "unknown";
}

}  // namespace lockstep::wire
