// Where an msprobe dump's files are: msprobe_import.h's layout, and its errors.
#include "interop/msprobe_layout.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>

namespace lockstep::collector::msprobe {
namespace fs = std::filesystem;
namespace {

// "step12" -> 12, "rank3" -> 3, "proc4242" -> 4242; false if not that form.
bool NumberAfter(const std::string& name, const char* prefix, uint64_t* n) {
  const std::string p(prefix);
  if (name.size() <= p.size() || name.compare(0, p.size(), p) != 0 || name.size() - p.size() > 18) return false;
  uint64_t v = 0;
  for (size_t i = p.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  *n = v;
  return true;
}

bool IsDir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

bool IsFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// The rank folders of one step folder: (rank<R> | proc<PID>) -> path.
void RankFolders(const fs::path& step, std::map<std::string, fs::path>* out) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(step, ec)) {
    const std::string name = e.path().filename().string();
    uint64_t n;
    if ((NumberAfter(name, "rank", &n) || NumberAfter(name, "proc", &n)) && IsDir(e.path())) (*out)[name] = e.path();
  }
}

}  // namespace

bool LooksLikeDump(const std::string& path) {
  const fs::path root(path);
  if (!IsDir(root)) return false;
  if (IsFile(root / "dump.json")) return true;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    uint64_t n;
    if (!NumberAfter(e.path().filename().string(), "step", &n) || !IsDir(e.path())) continue;
    std::map<std::string, fs::path> ranks;
    RankFolders(e.path(), &ranks);
    for (const auto& [name, p] : ranks) {
      if (IsFile(p / "dump.json")) return true;
    }
  }
  return false;
}

Status FindLayout(const std::string& path, Layout* out) {
  const fs::path root(path);
  out->parts.clear();
  if (!IsDir(root)) {
    std::error_code ec;
    if (!fs::exists(root, ec)) return Status::NotFound(path + ": no such directory");
    return Status::InvalidArgument(path + ": not an msprobe dump (give the dump's folder, the dump_path of its "
                                          "config, which holds step<N>/rank<R>/dump.json)");
  }
  // A single rank's folder (dump.json in it): step and rank from the folders' names.
  if (IsFile(root / "dump.json")) {
    uint64_t step = 0, rank = 0;
    const fs::path abs = fs::absolute(root);
    NumberAfter(abs.parent_path().filename().string(), "step", &step);
    const std::string name = abs.filename().string();
    if (!NumberAfter(name, "rank", &rank)) rank = 0;
    out->parts.push_back(Part{step, static_cast<uint32_t>(rank), root.string()});
    out->steps = 1;
    out->ranks = 1;
    return Status::OK();
  }
  std::map<uint64_t, fs::path> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    uint64_t n;
    if (NumberAfter(e.path().filename().string(), "step", &n) && IsDir(e.path())) steps[n] = e.path();
  }
  if (ec) return Status::IOError(path + ": cannot list: " + ec.message());
  if (steps.empty()) {
    return Status::InvalidArgument(path + ": not an msprobe dump (no step<N> folder with rank<R>/dump.json or "
                                          "proc<PID>/dump.json in it)");
  }
  // Ranks: rank<R> as numbered; proc<PID> folders (no process group) numbered in the
  // order of their PIDs over the whole dump (one process: rank 0).
  std::map<uint64_t, std::map<std::string, fs::path>> by_step;
  std::set<uint64_t> pids;
  std::set<std::string> all_names;
  for (const auto& [n, p] : steps) {
    RankFolders(p, &by_step[n]);
    for (const auto& [name, rp] : by_step[n]) {
      all_names.insert(name);
      uint64_t pid;
      if (NumberAfter(name, "proc", &pid)) pids.insert(pid);
    }
  }
  if (all_names.empty()) {
    return Status::InvalidArgument(path + ": not an msprobe dump (its step folders hold no rank<R> or proc<PID> "
                                          "folder)");
  }
  auto rank_of = [&](const std::string& name) -> uint32_t {
    uint64_t n = 0;
    if (NumberAfter(name, "rank", &n)) return static_cast<uint32_t>(n);
    NumberAfter(name, "proc", &n);
    return static_cast<uint32_t>(std::distance(pids.begin(), pids.find(n)));
  };
  std::set<uint32_t> ranks;
  for (const auto& name : all_names) ranks.insert(rank_of(name));
  for (const auto& [n, folders] : by_step) {
    for (const auto& name : all_names) {
      const auto it = folders.find(name);
      if (it == folders.end()) {
        // msprobe writes every rank of every step it dumps: a missing one was lost.
        return Status::InvalidArgument((steps[n] / name).string() + ": missing (other steps have " + name +
                                       "; copy the whole dump)");
      }
      if (!IsFile(it->second / "dump.json")) {
        return Status::InvalidArgument((it->second / "dump.json").string() + ": missing (each rank folder of an "
                                                                              "msprobe dump holds one)");
      }
      out->parts.push_back(Part{n, rank_of(name), it->second.string()});
    }
  }
  std::sort(out->parts.begin(), out->parts.end(),
            [](const Part& a, const Part& b) { return a.step != b.step ? a.step < b.step : a.rank < b.rank; });
  out->steps = steps.size();
  out->ranks = ranks.size();
  return Status::OK();
}

}  // namespace lockstep::collector::msprobe
