// Canonical tensor names and their interning (DESIGN.md "Aligner").
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
class NameTable {
 public:
  uint32_t Intern(const std::string& name);
  const std::string& Name(uint32_t id) const { return names_[id]; }
  size_t size() const { return names_.size(); }

 private:
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<std::string> names_;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_ALIGN_NAMES_H_
