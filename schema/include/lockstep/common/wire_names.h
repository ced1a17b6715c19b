// The stable lower-case names of the wire enums (schema/lockstep.fbs), one function per
// name, for logs, messages and JSON: the run registry, run claims, `lockstep inspect` and
// the aligner's kind names all print these.
//
// Pure functions, callable from any thread. An out-of-range value is "unknown".
// Also SameValue, the check of a room that keeps a wire enum as a type of its own.
#ifndef LOCKSTEP_COMMON_WIRE_NAMES_H_
#define LOCKSTEP_COMMON_WIRE_NAMES_H_

#include <cstdint>

namespace lockstep::wire {

// Role: "baseline", "candidate", "solo" ("unknown" for Unknown).
const char* RoleName(uint8_t role);
// TensorKind: "act", "act_grad", "param_grad", "param", "optim", "loss", "input", "act_in",
// "grad_reduced".
const char* KindName(uint8_t kind);
// DType: "fp32", "fp16", "bf16", "fp64", "int8", ..., "fp8_e4m3", "fp8_e5m2": the one
// spelling of `lockstep inspect`, the reports, alerts and `compare --json`.
const char* DTypeName(uint8_t dtype);

// Whether an enum member carries the value of its counterpart in the schema's generated
// enums. The rooms that keep a wire enum as a type of their own (the agent's types.h,
// the collector's align/step_data.h) static_assert it member by member, so that a
// schema change breaks their build rather than their data.
template <typename Mine, typename Wire>
constexpr bool SameValue(Mine mine, Wire wire) {
  return static_cast<int>(mine) == static_cast<int>(wire);
}

}  // namespace lockstep::wire

#endif  // LOCKSTEP_COMMON_WIRE_NAMES_H_
