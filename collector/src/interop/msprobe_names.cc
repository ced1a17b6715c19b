#include "interop/msprobe_names.h"

#include <cstdlib>
#include <vector>

namespace lockstep::collector::msprobe {
namespace {

std::vector<std::string_view> Split(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '.') {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

bool ParseCount(std::string_view s, uint64_t* n) {
  if (s.empty() || s.size() > 18) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *n = v;
  return true;
}

std::string Join(const std::vector<std::string_view>& parts, size_t from, size_t to) {
  std::string out;
  for (size_t i = from; i < to; ++i) {
    if (i > from) out += '.';
    out.append(parts[i]);
  }
  return out;
}

}  // namespace

Entry ParseEntry(std::string_view name) {
  Entry e;
  const auto parts = Split(name);
  if (parts.size() < 4) return e;
  const size_t m = parts.size();
  if (parts[0] == "Module") {
    // Module.<path...>.<Class>.<pass>.<n>: the path has at least one part.
    uint64_t n;
    if (m < 5 || !ParseCount(parts[m - 1], &n)) return e;
    const std::string_view pass = parts[m - 2];
    if (pass == "forward") e.pass = Pass::kForward;
    else if (pass == "backward") e.pass = Pass::kBackward;
    else if (pass == "parameters_grad") e.pass = Pass::kParamsGrad;
    else return e;
    e.kind = EntryKind::kModule;
    e.n = n;
    e.cls = std::string(parts[m - 3]);
    e.path = Join(parts, 1, m - 3);
    return e;
  }
  // <Prefix>.<api...>.<n>.<forward|backward>
  uint64_t n;
  const std::string_view pass = parts[m - 1];
  if (!ParseCount(parts[m - 2], &n)) return e;
  if (pass == "forward") e.pass = Pass::kForward;
  else if (pass == "backward") e.pass = Pass::kBackward;
  else return e;
  e.kind = EntryKind::kApi;
  e.n = n;
  e.prefix = std::string(parts[0]);
  e.api = Join(parts, 1, m - 2);
  e.call = Join(parts, 0, m - 1);
  return e;
}

std::string FuncName(const Entry& e) {
  std::string name = e.api;
  // Aten overloads ("addmm.default", "add.Tensor"): the op's own name.
  if (const size_t dot = name.find('.'); dot != std::string::npos) name.resize(dot);
  if (name.size() > 4 && name.compare(0, 2, "__") == 0 && name.compare(name.size() - 2, 2, "__") == 0) {
    name = name.substr(2, name.size() - 4);  // __add__ -> add
    // __radd__ -> add, __iadd__ stays iadd (an in-place op is its own function)
    static const char* const kReflected[] = {"add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul",
                                             "and", "or", "xor", "lshift", "rshift", "div"};
    if (name.size() > 1 && name[0] == 'r') {
      for (const char* r : kReflected) {
        if (name.compare(1, std::string::npos, r) == 0) {
          name.erase(0, 1);
          break;
        }
      }
    }
  }
  return name;
}

std::string CallName(const std::string& base, uint64_t n) {
  return n == 0 ? base : base + "#" + std::to_string(n);
}

uint8_t DTypeCode(std::string_view d) {
  if (d.rfind("torch.", 0) == 0) d.remove_prefix(6);
  struct Pair {
    const char* name;
    uint8_t code;
  };
  // schema/lockstep.fbs DType
  static const Pair kMap[] = {
      {"float32", 1}, {"float", 1},    {"float16", 2},     {"half", 2},  {"bfloat16", 3},
      {"float64", 4}, {"double", 4},   {"int8", 5},        {"uint8", 6}, {"int16", 7},
      {"int32", 8},   {"int64", 9},    {"long", 9},        {"bool", 10}, {"float8_e4m3fn", 11},
      {"float8_e5m2", 12}};
  for (const auto& p : kMap) {
    if (d == p.name) return p.code;
  }
  return 0;
}

bool IsFloatDType(std::string_view d) {
  const uint8_t c = DTypeCode(d);
  return c == 1 || c == 2 || c == 3 || c == 4 || c == 11 || c == 12;
}

}  // namespace lockstep::collector::msprobe
