// Canonical tensor names and their interning (docs/design.md "Aligner").
//
// Two runs of one model name the same tensor differently when one of them is wrapped
// (DDP `module.`, torch.compile `_orig_mod.`, FSDP `_fsdp_wrapped_module.`, activation
// checkpointing `_checkpoint_wrapped_module.`) or when a framework port renamed a layer.
// NameCanonicalizer strips the wrappers and then applies the user's mapping rules
// (--name-map FILE) in file order. NameTable gives each canonical name a dense id so
// the aligner matches integers, not strings.
//
// Threads: both are used by the analyzer's single thread; a const NameCanonicalizer
// may be shared.
#ifndef LOCKSTEP_COLLECTOR_ALIGN_NAMES_H_
#define LOCKSTEP_COLLECTOR_ALIGN_NAMES_H_

#include <cstdint>
#include <regex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lockstep/common/status.h"

namespace lockstep::collector {

class NameCanonicalizer {
 public:
  struct Rule {
    std::string pattern;      // ECMAScript regex, as written by the user
    std::string replacement;  // $1.. back-references allowed
    std::regex re;
  };

  NameCanonicalizer() = default;

  // Parses a mapping file: one rule per line, `REGEX => REPLACEMENT`; blank lines and
  // lines starting with '#' are ignored. An unreadable file or a bad regex gives one
  // sentence naming the file and line.
  static StatusOr<NameCanonicalizer> FromFile(const std::string& path);
  // The same from text (for tests and the TOML config); `origin` names it in errors.
  static StatusOr<NameCanonicalizer> FromText(std::string_view text, const std::string& origin);

  // Wrapper prefixes stripped, then every rule applied in order (regex_replace of
  // all matches). Pure function of `name`.
  std::string Canonical(std::string_view name) const;

  size_t rule_count() const { return rules_.size(); }

 private:
  std::vector<Rule> rules_;
};

// Interns canonical names. Ids are dense from 0 and stable for the table's life.
// Also remembers aliases: a name whose records repeat another's (the agent says so on
// the wire, StatFlags::kRepeat: a container whose output is its last child's output)
// is shown as an alias of the producer, "blocks.0.mlp.fc2 (= blocks.0.mlp)".
class NameTable {
 public:
  uint32_t Intern(const std::string& name);
  const std::string& Name(uint32_t id) const { return names_[id]; }
  size_t size() const { return names_.size(); }

  // `alias`'s tensor of `kind` (the Kind of align/step_data.h) is `producer`'s: a
  // container's output is its child's, while one gradient reaches the container first
  // and then the children (idempotent).
  void AddAlias(uint32_t producer, uint32_t alias, uint8_t kind);
  // The type of the module the tensor belongs to (TensorInfo.module_type: "Conv2d"),
  // as the agent declared it; the first non-empty one is kept. "" if never declared.
  void SetModuleType(uint32_t id, const std::string& type);
  const std::string& ModuleType(uint32_t id) const;
  // The name as messages show it: "features.0 (Conv2d)" when the module type is known;
  // a bare number (a Sequential child of the model itself) without one is
  // "module 0", never just "0".
  std::string Display(uint32_t id) const;
  // Display() and the aliases for that kind: "blocks.0.mlp.fc2 (Linear) (= blocks.0.mlp)";
  // just Display() if none.
  std::string Label(uint32_t id, uint8_t kind) const;
  // Just the aliases, in the order learned.
  std::vector<std::string> Aliases(uint32_t id, uint8_t kind) const;
  // The id of `name` if interned, else -1 (a lookup that adds nothing).
  int64_t Find(const std::string& name) const;
  // The width of what a module received (the last dimension of its act_in tensor,
  // TensorInfo.shape): the reduction length its rounding noise grows with (birth rule).
  // 0 if never declared; the largest declared is kept.
  void SetWidth(uint32_t id, uint64_t width);
  uint64_t Width(uint32_t id) const { return id < widths_.size() ? widths_[id] : 0; }

 private:
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<std::string> names_;
  std::unordered_map<uint32_t, std::string> module_types_;
  // (producer << 8 | kind) -> aliases
  std::unordered_map<uint64_t, std::vector<uint32_t>> aliases_;
  std::vector<uint64_t> widths_;  // by id
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_ALIGN_NAMES_H_
