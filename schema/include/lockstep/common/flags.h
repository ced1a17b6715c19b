// FlagSet: the command-line and TOML-config parser shared by every `lockstep`
// subcommand.
//
// Each subcommand declares its flags once (name, target, help); Parse() fills the
// targets from argv and, when `--config FILE` is given, from a TOML file whose keys
// are the flag names (dashes or underscores) at top level or in a table named after
// the subcommand ([collect], [top], ...). The command line wins over the file.
// Unknown flags, keys and tables, values of the wrong type and numbers out of range give
// one clear sentence (a config mistake names the file and line, and the closest flag).
// Single-threaded: used once at start-up.
#ifndef LOCKSTEP_COMMON_FLAGS_H_
#define LOCKSTEP_COMMON_FLAGS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/common/status.h"

namespace lockstep::cli {

// `text` safe for a one-line message: control characters escaped (\n, \x01), at most
// `max` characters (the middle elided, the length said).
std::string OneLine(const std::string& text, size_t max = 400);

class FlagSet {
 public:
  // `command` is e.g. "collect"; `usage` the synopsis after "lockstep "; `summary`
  // a paragraph shown by --help.
  FlagSet(std::string command, std::string usage, std::string summary);

  void String(const std::string& name, std::string* target, const std::string& help,
              const std::string& value_name = "VALUE");
  void StringList(const std::string& name, std::vector<std::string>* target,
                  const std::string& help, const std::string& value_name = "VALUE");
  void Int(const std::string& name, int64_t* target, const std::string& help,
           const std::string& value_name = "N");
  void Double(const std::string& name, double* target, const std::string& help,
              const std::string& value_name = "X");
  // --name, --name=true|false, --no-name.
  void Bool(const std::string& name, bool* target, const std::string& help);
  // The values an Int or Double flag accepts (inclusive). Without a call: 0 to +inf,
  // finite (every number lockstep takes is a count, a size, a duration or a tolerance,
  // so a negative one is a mistake, never "off").
  void Range(const std::string& name, double lo, double hi);

  // Parses argv[0..argc) (the words after the subcommand). Positionals are collected
  // in positional(). "--" ends flags. `--help`/`-h` sets help_requested().
  Status Parse(int argc, const char* const* argv);

  const std::vector<std::string>& positional() const { return positional_; }
  bool help_requested() const { return help_requested_; }
  // Was the flag given (command line or config)?
  bool WasSet(const std::string& name) const;
  std::string Help() const;
  const std::string& command() const { return command_; }

 private:
  enum class Type { kString, kStringList, kInt, kDouble, kBool };
  struct Flag {
    std::string name;
    Type type;
    void* target;
    std::string help;
    std::string value_name;
    std::string default_text;
    bool set = false;
    double lo = 0, hi = 1e300;  // Int and Double only
  };
  Flag* Find(const std::string& name);
  Status Assign(Flag* f, const std::string& value, const std::string& origin);
  Status LoadConfig(const std::string& path);
  void Add(Flag f);

  std::string command_, usage_, summary_;
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
  std::string config_path_;
  bool help_requested_ = false;
};

}  // namespace lockstep::cli

#endif  // LOCKSTEP_COMMON_FLAGS_H_
