// How msprobe's dump entries map to lockstep's tensor names and kinds (docs/msprobe.md
// "What maps to what"). Pure functions; any thread.
//
//   Module.<path>.<Class>.forward.<n>      output  -> act     <path>[#n]
//                                          inputs  -> act_in  <path>[#n], (i), (key), (i)[j]
//                                          parameters (n = 0) -> param  <path>.<name>
//   Module.<path>.<Class>.backward.<n>     input (grad of the outputs) -> act_grad <path>[#n]
//   Module.<path>.<Class>.parameters_grad.<n>  -> param_grad <path>.<name>
//   <Prefix>.<api>.<n>.forward             output -> act, inputs -> act_in of the op
//                                          <module>/<func>#k (k: the k-th call of func in
//                                          that call of its module, as lockstep's zoom
//                                          names them; <root>/<func>#k outside modules)
//   <Prefix>.<api>.<n>.backward            input -> act_grad of the same op
//
// Output and input names follow agent/python/lockstep/_names.py: one tensor is named
// like its owner; elements get [i] / [key]; several inputs (i), (key), (i)[j].
#ifndef LOCKSTEP_COLLECTOR_INTEROP_MSPROBE_NAMES_H_
#define LOCKSTEP_COLLECTOR_INTEROP_MSPROBE_NAMES_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace lockstep::collector::msprobe {

// lockstep's name of the root module, and the module of the optimizer's calls.
inline constexpr const char* kRootName = "<root>";
inline constexpr const char* kOptimizerName = "<optimizer>";

enum class EntryKind : uint8_t { kUnknown, kModule, kApi };
enum class Pass : uint8_t { kUnknown, kForward, kBackward, kParamsGrad };

struct Entry {
  EntryKind kind = EntryKind::kUnknown;
  Pass pass = Pass::kUnknown;
  std::string path;    // module: its path in named_modules() ("blocks.0.fc1")
  std::string cls;     // module: its class ("Linear")
  std::string prefix;  // API: Functional, Tensor, Torch, Aten, Distributed, NPU, ...
  std::string api;     // API: as msprobe spells it ("linear", "__add__", "addmm.default")
  std::string call;    // API: "<Prefix>.<api>.<n>", shared by its forward and backward
  uint64_t n = 0;      // the call count msprobe gives
};

// Parses an entry name of dump.json; kind kUnknown when it is neither form.
Entry ParseEntry(std::string_view name);

// The function name lockstep's zoom gives an API ("linear", "add" for Tensor.__add__ and
// __radd__, "addmm" for Aten's addmm.default): agent/python/lockstep/_zoom.py _func_name.
std::string FuncName(const Entry& e);

// `base` for call 0, `base#n` after (lockstep's call suffix).
std::string CallName(const std::string& base, uint64_t n);

// lockstep's dtype name code (schema DType) for msprobe's "torch.float32"; 0 = unknown.
uint8_t DTypeCode(std::string_view torch_dtype);
bool IsFloatDType(std::string_view torch_dtype);

}  // namespace lockstep::collector::msprobe

#endif  // LOCKSTEP_COLLECTOR_INTEROP_MSPROBE_NAMES_H_
