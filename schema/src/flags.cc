#include "lockstep/common/flags.h"

#include "lockstep/common/exit_codes.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

#include <toml++/toml.h>

namespace lockstep::cli {
namespace {

std::string Normalize(std::string s) {
  for (char& c : s)
    if (c == '_') c = '-';
  return s;
}

const char* TypeName(int t) {
  switch (t) {
    case 0: return "a string";
    case 1: return "a string (may repeat)";
    case 2: return "an integer";
    case 3: return "a number";
    default: return "true or false";
  }
}

// The tables a config file may hold: one per subcommand (cli/commands.h).
constexpr const char* kCommandTables[] = {"collect", "top", "compare", "inspect", "alert-test", "keygen"};

// Edits (insert, delete, substitute, swap two neighbours) from a to b.
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// " (did you mean 'X'?)" for the closest of `names` within a few edits, else "".
std::string Suggest(const std::string& word, const std::vector<std::string>& names, const char* prefix) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 4) + 1;
  for (const auto& n : names) {
    const size_t d = EditDistance(word, n);
    if (d < best_d) best_d = d, best = n;
  }
  return best.empty() ? "" : " (did you mean '" + std::string(prefix) + best + "'?)";
}

std::string Number(double x) {
  std::ostringstream o;
  o << x;
  return o.str();
}

}  // namespace

std::string OneLine(const std::string& text, size_t max) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (out.size() > max && max >= 40) {
    out = out.substr(0, max - 30) + "...(" + std::to_string(text.size()) + " chars)..." + out.substr(out.size() - 8);
  }
  return out;
}

FlagSet::FlagSet(std::string command, std::string usage, std::string summary)
    : command_(std::move(command)), usage_(std::move(usage)), summary_(std::move(summary)) {
  String("config", &config_path_,
         "TOML file whose keys are these flag names (top level or in a [" + command_ +
             "] table); flags on the command line win",
         "FILE");
}

void FlagSet::Add(Flag f) { flags_.push_back(std::move(f)); }

void FlagSet::String(const std::string& name, std::string* target, const std::string& help,
                     const std::string& value_name) {
  Add({name, Type::kString, target, help, value_name, target->empty() ? "" : *target});
}
void FlagSet::StringList(const std::string& name, std::vector<std::string>* target,
                         const std::string& help, const std::string& value_name) {
  Add({name, Type::kStringList, target, help, value_name, ""});
}
void FlagSet::Int(const std::string& name, int64_t* target, const std::string& help,
                  const std::string& value_name) {
  Add({name, Type::kInt, target, help, value_name, std::to_string(*target)});
}
void FlagSet::Double(const std::string& name, double* target, const std::string& help,
                     const std::string& value_name) {
  std::ostringstream d;
  d << *target;
  Add({name, Type::kDouble, target, help, value_name, d.str()});
}
void FlagSet::Bool(const std::string& name, bool* target, const std::string& help) {
  Add({name, Type::kBool, target, help, "", *target ? "true" : "false"});
}

void FlagSet::Range(const std::string& name, double lo, double hi) {
  if (Flag* f = Find(name)) f->lo = lo, f->hi = hi;
}

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  std::string n = Normalize(name);
  for (auto& f : flags_)
    if (f.name == n) return &f;
  return nullptr;
}

bool FlagSet::WasSet(const std::string& name) const {
  for (const auto& f : flags_)
    if (f.name == name) return f.set;
  return false;
}

Status FlagSet::Assign(Flag* f, const std::string& value, const std::string& origin) {
  auto bad = [&](const char* what) {
    return Status::InvalidArgument(origin + ": --" + f->name + " expects " + what + ", got '" +
                                   OneLine(value, 80) + "'");
  };
  auto range = [&](double x) -> Status {
    if (x >= f->lo && x <= f->hi) return Status::OK();
    std::string want = f->hi >= 1e300 ? (f->lo == 0 ? "must not be negative"
                                                    : "must be at least " + Number(f->lo))
                                      : "must be from " + Number(f->lo) + " to " + Number(f->hi);
    return Status::InvalidArgument(origin + ": --" + f->name + " " + want + ", got '" + OneLine(value, 80) + "'");
  };
  switch (f->type) {
    case Type::kString:
      *static_cast<std::string*>(f->target) = value;
      break;
    case Type::kStringList: {
      auto* v = static_cast<std::vector<std::string>*>(f->target);
      // The first value given replaces the default list; later ones append.
      if (!f->set) v->clear();
      v->push_back(value);
      break;
    }
    case Type::kInt: {
      errno = 0;
      char* end = nullptr;
      long long x = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || errno != 0 || *end != '\0') return bad("an integer");
      LOCKSTEP_RETURN_IF_ERROR(range(static_cast<double>(x)));
      *static_cast<int64_t*>(f->target) = x;
      break;
    }
    case Type::kDouble: {
      errno = 0;
      char* end = nullptr;
      double x = std::strtod(value.c_str(), &end);
      if (value.empty() || errno != 0 || *end != '\0' || !std::isfinite(x)) return bad("a number");
      LOCKSTEP_RETURN_IF_ERROR(range(x));
      *static_cast<double*>(f->target) = x;
      break;
    }
    case Type::kBool:
      if (value == "true" || value == "1" || value == "yes" || value == "on") {
        *static_cast<bool*>(f->target) = true;
      } else if (value == "false" || value == "0" || value == "no" || value == "off") {
        *static_cast<bool*>(f->target) = false;
      } else {
        return bad("true or false");
      }
      break;
  }
  f->set = true;
  return Status::OK();
}

Status FlagSet::Parse(int argc, const char* const* argv) {
  bool flags_done = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (flags_done || arg.size() < 2 || arg[0] != '-') {
      positional_.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      return Status::InvalidArgument("unknown option '" + arg + "' for 'lockstep " + command_ +
                                     "' (flags start with --; see 'lockstep " + command_ +
                                     " --help')");
    }
    std::string body = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = body.find('='); eq != std::string::npos) {
      value = body.substr(eq + 1);
      body = body.substr(0, eq);
      has_value = true;
    }
    Flag* f = Find(body);
    if (f == nullptr && !has_value && body.rfind("no-", 0) == 0) {
      Flag* nf = Find(body.substr(3));
      if (nf != nullptr && nf->type == Type::kBool) {
        LOCKSTEP_RETURN_IF_ERROR(Assign(nf, "false", "command line"));
        continue;
      }
    }
    if (f == nullptr) {
      std::vector<std::string> names;
      for (const auto& fl : flags_) names.push_back(fl.name);
      std::string hint = Suggest(Normalize(body), names, "--");
      return Status::InvalidArgument("unknown flag '--" + body + "' for 'lockstep " + command_ + "'" +
                                     (hint.empty() ? " (see 'lockstep " + command_ + " --help')" : hint));
    }
    if (!has_value) {
      if (f->type == Type::kBool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return Status::InvalidArgument("flag --" + f->name + " needs a value (" +
                                       TypeName(static_cast<int>(f->type)) + ")");
      }
    }
    LOCKSTEP_RETURN_IF_ERROR(Assign(f, value, "command line"));
  }
  if (!config_path_.empty() && !help_requested_) return LoadConfig(config_path_);
  return Status::OK();
}

Status FlagSet::LoadConfig(const std::string& path) {
  toml::table tbl;
  try {
    tbl = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream m;
    m << "config file " << path << ": " << e.description() << " (line "
      << e.source().begin.line << ")";
    return Status::InvalidArgument(m.str());
  } catch (const std::exception& e) {
    return Status::InvalidArgument("cannot read config file " + path + ": " + e.what());
  }
  // Flags already given on the command line are not overridden.
  std::vector<std::string> from_cli;
  for (const auto& f : flags_)
    if (f.set) from_cli.push_back(f.name);
  auto on_cli = [&](const std::string& n) {
    for (const auto& c : from_cli)
      if (c == n) return true;
    return false;
  };

  std::vector<std::string> names, tables(std::begin(kCommandTables), std::end(kCommandTables));
  for (const auto& f : flags_)
    if (f.name != "config") names.push_back(f.name);
  auto apply = [&](const toml::table& t, const std::string& where) -> Status {
    for (const auto& [k, node] : t) {
      std::string key(k.str());
      const auto line = node.source().begin.line ? node.source().begin.line : k.source().begin.line;
      std::string origin = "config file " + path + " line " + std::to_string(line) +
                           (where.empty() ? "" : " (in [" + command_ + "])");
      if (node.is_table()) {
        // Only a top-level table named after a subcommand; [colect] is a mistake, not
        // another subcommand's section.
        bool known = false;
        for (const auto& c : tables) known = known || Normalize(key) == c;
        if (where.empty() && known) continue;
        return Status::InvalidArgument(
            origin + ": unknown table [" + (where.empty() ? key : command_ + "." + key) + "]" +
            (where.empty() ? Suggest(Normalize(key), tables, "")
                           : std::string(" (a [") + command_ + "] table holds keys, not tables)") +
            "; tables are named after subcommands: collect, top, compare, inspect, alert-test, keygen");
      }
      Flag* f = Find(key);
      if (f == nullptr || f->name == "config") {
        std::string hint = Suggest(Normalize(key), names, "");
        return Status::InvalidArgument(origin + ": unknown key '" + key + "' for 'lockstep " + command_ + "'" +
                                       (hint.empty() ? " (see 'lockstep " + command_ + " --help')" : hint));
      }
      if (on_cli(f->name)) continue;
      auto scalar = [&](const toml::node& n, std::string* out) -> bool {
        if (auto s = n.value<std::string>(); s && n.is_string()) { *out = *s; return true; }
        if (n.is_integer()) { *out = std::to_string(*n.value<int64_t>()); return true; }
        if (n.is_floating_point()) {
          // The shortest text that reads back as the same double (-0.1, not -0.10000000000000001).
          const double x = *n.value<double>();
          for (int p = 1; p <= 17; ++p) {
            std::ostringstream o;
            o.precision(p);
            o << x;
            *out = o.str();
            if (std::strtod(out->c_str(), nullptr) == x) break;
          }
          return true;
        }
        if (n.is_boolean()) { *out = *n.value<bool>() ? "true" : "false"; return true; }
        return false;
      };
      std::string v;
      if (const auto* arr = node.as_array()) {
        if (f->type != Type::kStringList)
          return Status::InvalidArgument(origin + ": key '" + key + "' takes one value, not a list");
        for (const auto& el : *arr) {
          if (!scalar(el, &v))
            return Status::InvalidArgument(origin + ": key '" + key + "' has a value of the wrong type");
          LOCKSTEP_RETURN_IF_ERROR(Assign(f, v, origin));
        }
        continue;
      }
      if (!scalar(node, &v))
        return Status::InvalidArgument(origin + ": key '" + key + "' has a value of the wrong type");
      LOCKSTEP_RETURN_IF_ERROR(Assign(f, v, origin));
    }
    return Status::OK();
  };
  LOCKSTEP_RETURN_IF_ERROR(apply(tbl, ""));
  if (const auto* sec = tbl[command_].as_table()) {
    LOCKSTEP_RETURN_IF_ERROR(apply(*sec, command_));
  }
  return Status::OK();
}

std::string FlagSet::Help() const {
  std::ostringstream o;
  o << "usage: lockstep " << usage_ << "\n\n" << summary_ << "\n\nflags:\n";
  for (const auto& f : flags_) {
    std::string left = "  --" + f.name;
    if (f.type != Type::kBool) left += " " + f.value_name;
    o << left;
    if (left.size() < 28) o << std::string(28 - left.size(), ' ');
    else o << "\n" << std::string(28, ' ');
    o << f.help;
    if (!f.default_text.empty() && f.type != Type::kStringList) o << " (default: " << f.default_text << ")";
    if (f.type == Type::kStringList) o << " (may repeat)";
    o << "\n";
  }
  o << "  --help                    show this help\n";
  o << "\n" << kExitCodesHelp;
  return o.str();
}

}  // namespace lockstep::cli
