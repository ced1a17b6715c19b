#include "sent_journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace lockstep::alerting {
namespace {

// Tabs and newlines would break the line format; names never hold them, but be safe.
std::string Clean(std::string s) {
  for (char& c : s) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

}  // namespace

std::string InstanceKey(const Alert& a) {
  std::string k = a.id.empty() ? a.DedupKey() + "@" + std::to_string(a.step) : a.id;
  k += '|';
  for (size_t i = 0; i < a.runs.size(); ++i) k += (i ? "," : "") + a.runs[i];
  k += '|' + std::to_string(a.rank) + '|' + SeverityName(a.severity);
  return Clean(std::move(k));
}

StatusOr<std::unique_ptr<SentJournal>> SentJournal::Open(const std::string& path) {
  std::unique_ptr<SentJournal> j(new SentJournal());
  j->path_ = path;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  {
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t pos = 0;
    while (true) {
      size_t nl = all.find('\n', pos);
      if (nl == std::string::npos) break;  // a torn last line is ignored
      std::string line = all.substr(pos, nl - pos);
      pos = nl + 1;
      std::vector<std::string> f;
      std::stringstream ss(line);
      std::string part;
      while (std::getline(ss, part, '\t')) f.push_back(part);
      if (f.size() != 6) continue;
      Entry e;
      e.unix_ns = std::strtoll(f[0].c_str(), nullptr, 10);
      e.passed = f[1] == "1";
      e.severity = static_cast<Severity>(std::min(2, std::atoi(f[2].c_str())));
      e.first_seen_unix_ns = std::strtoll(f[3].c_str(), nullptr, 10);
      e.dedup_key = f[4];
      j->keys_.insert(f[5]);
      if (e.passed) j->passed_at_open_.push_back(std::move(e));
    }
  }
  j->fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (j->fd_ < 0)
    return Status::IOError("cannot open the alert journal '" + path + "': " + std::strerror(errno));
  return j;
}

SentJournal::~SentJournal() {
  if (fd_ >= 0) ::close(fd_);
}

Status SentJournal::Record(const Alert& a, bool passed, int64_t now_unix_ns) {
  std::string key = InstanceKey(a);
  std::string line = std::to_string(now_unix_ns) + '\t' + (passed ? "1" : "0") + '\t' +
                     std::to_string(static_cast<int>(a.severity)) + '\t' +
                     std::to_string(a.first_seen_unix_ns) + '\t' + Clean(a.DedupKey()) + '\t' + key +
                     '\n';
  keys_.insert(std::move(key));
  // One write() of the whole line: O_APPEND keeps lines whole; a failure may leave a
  // torn line, which Open() skips.
  const char* p = line.data();
  size_t n = line.size();
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::IOError("cannot append to the alert journal '" + path_ + "': " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

}  // namespace lockstep::alerting
