#include "ingest/curve_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace lockstep::collector {
namespace {

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// `name = "value"` (quotes optional) -> true with *key, *value set.
bool SplitAssignment(const std::string& line, std::string* key, std::string* value) {
  size_t eq = line.find('=');
  if (eq == std::string::npos) return false;
  *key = Trim(line.substr(0, eq));
  std::string v = Trim(line.substr(eq + 1));
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
  *value = v;
  return true;
}

Status WriteFile(const std::string& path, const std::string& text, mode_t mode, bool overwrite) {
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL);
  int fd = ::open(path.c_str(), flags, mode);
  if (fd < 0) {
    if (errno == EEXIST)
      return Status::InvalidArgument("'" + path + "' exists; pick another name or pass --force");
    return Status::IOError("cannot write '" + path + "': " + std::strerror(errno));
  }
  // O_CREAT's mode is masked by the umask and ignored for an existing file: set it.
  bool ok = ::fchmod(fd, mode) == 0;
  size_t off = 0;
  while (ok && off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) off += static_cast<size_t>(n);
  }
  int err = errno;
  ::close(fd);
  if (!ok) return Status::IOError("cannot write '" + path + "': " + std::strerror(err));
  return Status::OK();
}

}  // namespace

bool IsZ85Key(const std::string& key) {
  if (key.size() != 40) return false;
  uint8_t raw[32];
  return zmq_z85_decode(raw, key.c_str()) != nullptr;
}

StatusOr<CurveKeyPair> MakeCurveKeyPair() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0)
    return Status::Internal("cannot make a CURVE key pair: this ZeroMQ was built without CURVE");
  return CurveKeyPair{std::string(pub, 40), std::string(sec, 40)};
}

StatusOr<CurveKeyPair> ReadCurveKeyFile(const std::string& path, bool need_secret) {
  std::ifstream f(path);
  if (!f) return Status::InvalidArgument("cannot read the CURVE key file '" + path + "': " + std::strerror(errno));
  CurveKeyPair pair;
  std::string line;
  for (int no = 1; std::getline(f, line); ++no) {
    line = Trim(line);
    if (line.empty() || line[0] == '#') continue;
    std::string key, value;
    if (!SplitAssignment(line, &key, &value) || (key != "public-key" && key != "secret-key"))
      return Status::InvalidArgument("CURVE key file '" + path + "' line " + std::to_string(no) +
                                     ": expected public-key = \"...\" or secret-key = \"...\"");
    if (!IsZ85Key(value))
      return Status::InvalidArgument("CURVE key file '" + path + "' line " + std::to_string(no) + ": the " +
                                     key + " is not a 40-character Z85 key");
    (key == "public-key" ? pair.public_key : pair.secret_key) = value;
  }
  if (need_secret && pair.secret_key.empty())
    return Status::InvalidArgument("CURVE key file '" + path +
                                   "' has no secret-key (give the .key file from 'lockstep keygen', not the .pub)");
  if (!pair.secret_key.empty()) {
    char derived[41];
    if (zmq_curve_public(derived, pair.secret_key.c_str()) != 0)
      return Status::Internal("cannot derive a CURVE public key: this ZeroMQ was built without CURVE");
    if (pair.public_key.empty()) pair.public_key.assign(derived, 40);
    if (pair.public_key != std::string(derived, 40))
      return Status::InvalidArgument("CURVE key file '" + path + "': the public-key does not belong to the secret-key");
  }
  if (pair.public_key.empty())
    return Status::InvalidArgument("CURVE key file '" + path + "' holds no key");
  return pair;
}

StatusOr<std::vector<std::string>> ReadAuthorizedKeys(const std::string& path) {
  std::ifstream f(path);
  if (!f)
    return Status::InvalidArgument("cannot read the authorized-keys file '" + path + "': " + std::strerror(errno));
  std::vector<std::string> keys;
  std::string line;
  for (int no = 1; std::getline(f, line); ++no) {
    line = Trim(line);
    if (line.empty()) continue;
    std::string key, value;
    std::string first = line.substr(0, line.find_first_of(" \t"));
    // '#' is a Z85 character too: a line that is a key is a key, even if it starts with '#'.
    if (line[0] == '#' && !IsZ85Key(first)) continue;
    if (IsZ85Key(first)) {
      value = first;
    } else if (SplitAssignment(line, &key, &value)) {
      if (key == "secret-key")
        return Status::InvalidArgument("authorized-keys file '" + path + "' line " + std::to_string(no) +
                                       " holds a secret key: list only public keys (the .pub files)");
      if (key != "public-key")
        return Status::InvalidArgument("authorized-keys file '" + path + "' line " + std::to_string(no) +
                                       ": expected a Z85 public key or public-key = \"...\"");
    }
    if (!IsZ85Key(value))
      return Status::InvalidArgument("authorized-keys file '" + path + "' line " + std::to_string(no) +
                                     ": not a 40-character Z85 public key");
    keys.push_back(value);
  }
  if (keys.empty())
    return Status::InvalidArgument("authorized-keys file '" + path +
                                   "' lists no key, so every agent would be refused");
  return keys;
}

StatusOr<std::vector<std::string>> WriteCurveKeyFiles(const std::string& prefix, const CurveKeyPair& pair,
                                                      bool overwrite) {
  std::string key_path = prefix + ".key", pub_path = prefix + ".pub";
  if (!overwrite) {
    for (const auto& p : {key_path, pub_path}) {
      struct stat st;
      if (::stat(p.c_str(), &st) == 0)
        return Status::InvalidArgument("'" + p + "' exists; pick another name or pass --force");
    }
  }
  std::string pub = "public-key = \"" + pair.public_key + "\"\n";
  LOCKSTEP_RETURN_IF_ERROR(WriteFile(
      key_path,
      "# lockstep CURVE key pair (ZeroMQ Z85), made by 'lockstep keygen'. Keep it secret: whoever\n"
      "# holds it can pose as this collector or agent. docs/security.md\n" +
          pub + "secret-key = \"" + pair.secret_key + "\"\n",
      0600, overwrite));
  LOCKSTEP_RETURN_IF_ERROR(WriteFile(
      pub_path,
      "# lockstep CURVE public key (ZeroMQ Z85), made by 'lockstep keygen'. Safe to share:\n"
      "# a collector's goes to its agents, an agent's into the collector's --curve-authorized-keys.\n" +
          pub,
      0644, overwrite));
  return std::vector<std::string>{key_path, pub_path};
}

std::string KeyFingerprint(const std::string& z85) { return z85.substr(0, 8) + "…"; }

}  // namespace lockstep::collector
