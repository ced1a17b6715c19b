// CURVE key files (docs/security.md): what `lockstep keygen` writes and what
// `lockstep collect --curve-key / --curve-authorized-keys` and the Python agent read.
//
//   NAME.key  (mode 0600)                      NAME.pub
//   # lockstep CURVE key pair ...              # lockstep CURVE public key ...
//   public-key = "<40 Z85 characters>"         public-key = "<40 Z85 characters>"
//   secret-key = "<40 Z85 characters>"
//
// An authorized-keys file lists agent public keys, one per line: either a bare Z85 key
// (anything after whitespace is a comment) or a `public-key = "..."` line, so that
// `cat agent-*.pub > authorized` works. '#' starts a comment line (unless the line is
// a key: '#' is also a Z85 character).
#ifndef LOCKSTEP_COLLECTOR_INGEST_CURVE_KEYS_H_
#define LOCKSTEP_COLLECTOR_INGEST_CURVE_KEYS_H_

#include <string>
#include <vector>

#include "lockstep/common/status.h"

namespace lockstep::collector {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters; empty when read from a .pub file
};

// True for 40 characters that decode as Z85 to 32 bytes.
bool IsZ85Key(const std::string& key);

// A fresh key pair (zmq_curve_keypair). Internal error when ZeroMQ lacks CURVE.
StatusOr<CurveKeyPair> MakeCurveKeyPair();

// Reads a .key file (both keys; the public key is checked against the secret one) or,
// with `need_secret` false, also a .pub file. Errors name the file and the line.
StatusOr<CurveKeyPair> ReadCurveKeyFile(const std::string& path, bool need_secret);

// Reads an authorized-keys file; an empty file is an error (it would refuse everyone).
StatusOr<std::vector<std::string>> ReadAuthorizedKeys(const std::string& path);

// Writes `<prefix>.key` (0600) and `<prefix>.pub`; refuses to overwrite either unless
// `overwrite`. Returns the two paths written.
StatusOr<std::vector<std::string>> WriteCurveKeyFiles(const std::string& prefix,
                                                      const CurveKeyPair& pair, bool overwrite);

// "Ab3x…" — the first 8 characters, enough to tell keys apart in a log line without
// printing a whole key.
std::string KeyFingerprint(const std::string& z85);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_INGEST_CURVE_KEYS_H_
