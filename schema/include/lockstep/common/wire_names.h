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
// DType: "fp32", "fp16", "bf16", "fp64", "int8", ..., "fp8_e4m3", "fp8_e5m2": the one
// spelling of `lockstep inspect`, the reports, alerts and `compare --json`.
const char* DTypeName(uint8_t dtype);

}  // namespace lockstep::wire

#endif  // LOCKSTEP_COMMON_WIRE_NAMES_H_
