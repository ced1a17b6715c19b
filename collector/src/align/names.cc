#include "align/names.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace lockstep::collector {
namespace {

// Path components that wrappers insert and that never name a layer of the model.
// `module.` only counts at the front (DDP/DataParallel wrap the whole model; a layer
// may legitimately be called "module" deeper down); the others are removed anywhere.
constexpr std::string_view kLeadingWrapper = "module.";
constexpr std::string_view kAnywhereWrappers[] = {
    "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.",
};

std::string StripWrappers(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  size_t i = 0;
  bool at_front = true;
  while (i < name.size()) {
    // At a component boundary: try each wrapper.
    std::string_view rest = name.substr(i);
    bool stripped = false;
    if (at_front && rest.substr(0, kLeadingWrapper.size()) == kLeadingWrapper) {
      i += kLeadingWrapper.size();
      stripped = true;
    } else {
      for (std::string_view w : kAnywhereWrappers) {
        if (rest.substr(0, w.size()) == w) {
          i += w.size();
          stripped = true;
          break;
        }
      }
    }
    if (stripped) continue;
    // Copy one component (up to and including the next '.').
    at_front = false;
    size_t dot = name.find('.', i);
    size_t end = dot == std::string_view::npos ? name.size() : dot + 1;
    out.append(name.substr(i, end - i));
    i = end;
  }
  // "model._orig_mod" (wrapper as the last component, without a dot) names the
  // wrapped module itself.
  for (std::string_view w : kAnywhereWrappers) {
    std::string_view bare = w.substr(0, w.size() - 1);
    if (out.size() > bare.size() && out.compare(out.size() - bare.size(), bare.size(), bare) == 0 &&
        out[out.size() - bare.size() - 1] == '.') {
      out.resize(out.size() - bare.size() - 1);
    }
  }
  return out;
}

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace

StatusOr<NameCanonicalizer> NameCanonicalizer::FromText(std::string_view text,
                                                        const std::string& origin) {
  NameCanonicalizer c;
  std::istringstream in{std::string(text)};
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    std::string t = Trim(line);
    if (t.empty() || t[0] == '#') continue;
    size_t arrow = t.find("=>");
    if (arrow == std::string::npos) {
      return Status::InvalidArgument(origin + " line " + std::to_string(lineno) +
                                     ": expected 'REGEX => REPLACEMENT'; fix or remove the line");
    }
    Rule r;
    r.pattern = Trim(std::string_view(t).substr(0, arrow));
    r.replacement = Trim(std::string_view(t).substr(arrow + 2));
    if (r.pattern.empty()) {
      return Status::InvalidArgument(origin + " line " + std::to_string(lineno) +
                                     ": the regex before '=>' is empty");
    }
    try {
      r.re = std::regex(r.pattern, std::regex::ECMAScript | std::regex::optimize);
    } catch (const std::regex_error& e) {
      return Status::InvalidArgument(origin + " line " + std::to_string(lineno) + ": '" + r.pattern +
                                     "' is not a valid regex (" + e.what() + ")");
    }
    c.rules_.push_back(std::move(r));
  }
  return c;
}

StatusOr<NameCanonicalizer> NameCanonicalizer::FromFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    return Status::InvalidArgument("cannot read the name-map file '" + path +
                                   "'; check the path given to --name-map");
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return FromText(ss.str(), "name-map file '" + path + "'");
}

std::string NameCanonicalizer::Canonical(std::string_view name) const {
  std::string out = StripWrappers(name);
  for (const Rule& r : rules_) out = std::regex_replace(out, r.re, r.replacement);
  return out;
}

uint32_t NameTable::Intern(const std::string& name) {
  auto [it, inserted] = ids_.try_emplace(name, static_cast<uint32_t>(names_.size()));
  if (inserted) names_.push_back(name);
  return it->second;
}

int64_t NameTable::Find(const std::string& name) const {
  auto it = ids_.find(name);
  return it == ids_.end() ? -1 : static_cast<int64_t>(it->second);
}

void NameTable::SetWidth(uint32_t id, uint64_t width) {
  if (id >= widths_.size()) widths_.resize(id + 1, 0);
  widths_[id] = std::max(widths_[id], width);
}

void NameTable::AddAlias(uint32_t producer, uint32_t alias, uint8_t kind) {
  if (producer == alias) return;
  auto& v = aliases_[(static_cast<uint64_t>(producer) << 8) | kind];
  for (uint32_t a : v)
    if (a == alias) return;
  v.push_back(alias);
}

std::vector<std::string> NameTable::Aliases(uint32_t id, uint8_t kind) const {
  std::vector<std::string> v;
  auto it = aliases_.find((static_cast<uint64_t>(id) << 8) | kind);
  if (it != aliases_.end())
    for (uint32_t a : it->second) v.push_back(names_[a]);
  return v;
}

void NameTable::SetModuleType(uint32_t id, const std::string& type) {
  if (type.empty()) return;
  module_types_.try_emplace(id, type);
}

const std::string& NameTable::ModuleType(uint32_t id) const {
  static const std::string kNone;
  auto it = module_types_.find(id);
  return it == module_types_.end() ? kNone : it->second;
}

std::string NameTable::Display(uint32_t id) const {
  const std::string& name = names_[id];
  const std::string& type = ModuleType(id);
  if (!type.empty()) return name + " (" + type + ")";
  const bool number = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
  return number ? "module " + name : name;
}

std::string NameTable::Label(uint32_t id, uint8_t kind) const {
  auto it = aliases_.find((static_cast<uint64_t>(id) << 8) | kind);
  if (it == aliases_.end() || it->second.empty()) return Display(id);
  // One parenthesis for the module type and the aliases: "fc2 (Linear, = mlp)".
  const std::string& type = ModuleType(id);
  std::string s = type.empty() ? Display(id) + " (=" : names_[id] + " (" + type + ", =";
  for (size_t i = 0; i < it->second.size(); ++i) {
    const std::string& a = names_[it->second[i]];
    s += (i ? ", " : " ") + (a.empty() ? std::string("the model") : a);
  }
  return s + ")";
}

}  // namespace lockstep::collector
