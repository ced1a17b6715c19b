#include "lockstep/common/wire_names.h"

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
  }
  return "unknown";
}

const char* DTypeName(uint8_t dtype) {
  static const char* const kNames[] = {"unknown", "f32", "f16", "bf16", "f64", "i8", "u8",
                                       "i16", "i32", "i64", "bool", "f8e4m3", "f8e5m2"};
  return dtype < sizeof kNames / sizeof kNames[0] ? kNames[dtype] : "unknown";
}

}  // namespace lockstep::wire
