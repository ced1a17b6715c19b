#include "spool.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "formats.h"

namespace lockstep::alerting {

namespace fs = std::filesystem;

std::string SpoolSubdirName(const std::string& kind, const std::string& target) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : target) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, h);
  return kind + "-" + buf;
}

StatusOr<std::unique_ptr<Spool>> Spool::Open(const std::string& dir, uint64_t max_bytes,
                                             size_t max_items) {
  std::unique_ptr<Spool> s(new Spool());
  s->dir_ = dir;
  s->max_bytes_ = max_bytes;
  s->max_items_ = max_items;
  if (dir.empty()) return s;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec))
    return Status::IOError("cannot create alert spool directory '" + dir +
                           "': " + (ec ? ec.message() : "not a directory") +
                           " (choose a writable --alert-spool-dir)");
  std::vector<std::pair<uint64_t, uint64_t>> found;  // seq, bytes
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0) {  // a write torn by a crash: never renamed, never counted
      fs::remove(e.path(), ec);
      continue;
    }
    if (name.size() != 25 || name.substr(20) != ".json") continue;
    uint64_t seq = std::strtoull(name.substr(0, 20).c_str(), nullptr, 10);
    if (seq == 0) continue;
    found.emplace_back(seq, static_cast<uint64_t>(e.file_size(ec)));
  }
  if (ec) return Status::IOError("cannot list alert spool directory '" + dir + "': " + ec.message());
  std::sort(found.begin(), found.end());
  for (const auto& [seq, bytes] : found) {
    s->entries_.push_back(Entry{seq, bytes, std::nullopt});
    s->total_bytes_ += bytes;
    s->next_seq_ = seq + 1;
  }
  return s;
}

std::string Spool::PathOf(uint64_t seq) const {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%020" PRIu64 ".json", seq);
  return (fs::path(dir_) / buf).string();
}

void Spool::DropFront() {
  const Entry& e = entries_.front();
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove(PathOf(e.seq), ec);
  }
  total_bytes_ -= std::min(total_bytes_, e.bytes);
  entries_.pop_front();
}

uint64_t Spool::Push(const Alert& alert, Status* write_error) {
  Entry e;
  e.seq = next_seq_++;
  uint64_t dropped = 0;
  if (dir_.empty()) {
    e.alert = alert;
    entries_.push_back(std::move(e));
    while (entries_.size() > max_items_) {
      entries_.pop_front();
      ++dropped;
    }
    return dropped;
  }
  std::string line = AlertToJson(alert, 0) + "\n";
  e.bytes = line.size();
  std::string tmp = (fs::path(dir_) / (".tmp-" + std::to_string(e.seq))).string();
  bool ok = false;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << line;
    f.flush();
    ok = static_cast<bool>(f);
  }
  std::error_code ec;
  if (ok) fs::rename(tmp, PathOf(e.seq), ec);
  if (!ok || ec) {
    fs::remove(tmp, ec);
    if (write_error)
      *write_error = Status::IOError("cannot write to alert spool '" + dir_ +
                                     "' (disk full or not writable?); keeping the alert in memory");
    e.alert = alert;  // DropFront/PopFront remove a file that is not there: harmless
  }
  total_bytes_ += e.bytes;
  entries_.push_back(std::move(e));
  while (total_bytes_ > max_bytes_ && entries_.size() > 1) {
    DropFront();
    ++dropped;
  }
  return dropped;
}

const Alert* Spool::Front() {
  while (!entries_.empty()) {
    Entry& e = entries_.front();
    if (e.alert.has_value()) return &*e.alert;
    std::ifstream f(PathOf(e.seq), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    auto a = AlertFromJson(ss.str());
    if (f && a.ok()) {
      e.alert = std::move(a.value());
      return &*e.alert;
    }
    ++corrupt_dropped_;
    DropFront();
  }
  return nullptr;
}

void Spool::PopFront() {
  if (!entries_.empty()) DropFront();
}

}  // namespace lockstep::alerting
