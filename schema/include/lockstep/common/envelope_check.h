// CheckEnvelope: everything the collector demands of a message before it is logged
// or shown to anyone — size cap, file identifier, schema major, flatbuffers Verifier,
// a valid run id and a body. Used by ingest (live) and LogReader::Envelope (replay).
//
// Pure function, callable from any thread. `data` must be 8-byte aligned (the
// verifier checks alignment; ingest copies misaligned frames first).
#ifndef LOCKSTEP_COMMON_ENVELOPE_CHECK_H_
#define LOCKSTEP_COMMON_ENVELOPE_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace lockstep::wire {
struct Envelope;
}

namespace lockstep::collector {

// Why a message was refused; kNone means accepted. Counters are indexed by it.
enum class Reject : uint8_t {
  kNone = 0,
  kEmpty,           // zero-length frame
  kOversized,       // larger than the size cap
  kFileIdentifier,  // not "LKS1": not a lockstep envelope at all
  kMalformed,       // flatbuffers Verifier failed (garbage, truncated), or misaligned 8-byte vector
  kSchemaMajor,     // schema_major missing or not kSchemaMajor
  kRunId,           // run id empty, too long or with characters outside [A-Za-z0-9._-]
  kNoBody,          // body union is NONE
  kTooLong,         // a tensor name or a Hello/Goodbye string over its length cap
  kRunClaimed,      // a second process under a live run id with another role (ingest/run_claims.h)
  kCount,
};

// Stable lower-case name ("oversized", "schema_major", ...) for logs and JSON.
const char* RejectName(Reject r);

struct EnvelopeCheck {
  Reject reject = Reject::kNone;
  // Set when reject == kNone, and for the verified envelopes refused as kSchemaMajor,
  // kNoBody or kTooLong, so that the refusal can be attributed to its run.
  const wire::Envelope* env = nullptr;
  // Read when the bytes were at least a verifiable table: lets a rejection be logged
  // clearly.
  uint16_t schema_major = 0;
  uint16_t schema_minor = 0;
};

EnvelopeCheck CheckEnvelope(const uint8_t* data, size_t size, size_t max_bytes);

// One sentence for a rejection, e.g. for kSchemaMajor "schema major version 2 (this
// collector reads 1.x): run an agent and collector of the same major version".
std::string DescribeReject(const EnvelopeCheck& c, size_t size, size_t max_bytes);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COMMON_ENVELOPE_CHECK_H_
