// The stable lower-case names of the wire enums (schema/lockstep.fbs), one function per
// name, for logs, messages and JSON: the run registry, run claims, `lockstep inspect` and
// the aligner's kind names all print these.
//
// Pure functions, callable from any thread. An out-of-range value is "unknown".
#ifndef LOCKSTEP_COMMON_WIRE_NAMES_H_
#define LOCKSTEP_COMMON_WIRE_NAMES_H_

#include <cstdint>

namespace lockstep::wire {

// Role: "baseline", "candidate", "solo" ("unknown" for Unknown).
const char* RoleName(uint8_t role);
// TensorKind: "act", "act_grad", "param_grad", "param", "optim", "loss", "input", "act_in".
const char* KindName(uint8_t kind);
// DType as the run log spells it: "f32", "f16", "bf16", ..., "f8e4m3" (the reports use
// the longer "fp32" of align/step_data.h's DTypeName).
const char* DTypeName(uint8_t dtype);

}  // namespace lockstep::wire

#endif  // LOCKSTEP_COMMON_WIRE_NAMES_H_
