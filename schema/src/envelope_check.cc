#include "lockstep/common/envelope_check.h"

#include <cstring>

#include "lockstep/common/wire.h"
#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::collector {
namespace {

uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Reads schema_major/minor of a buffer the Verifier refused, with every offset
// bounds-checked by hand. A message from a future major may legitimately fail the
// v1 verifier; this lets it be reported as "unknown major" rather than "garbage".
bool PeekVersion(const uint8_t* d, size_t n, uint16_t* major, uint16_t* minor) {
  if (n < 8) return false;
  uint32_t table = Load32(d);
  if (table > n - 4) return false;
  int32_t soff;
  std::memcpy(&soff, d + table, 4);
  int64_t vt = static_cast<int64_t>(table) - soff;
  if (vt < 0 || static_cast<uint64_t>(vt) + 4 > n) return false;
  uint16_t vt_size = Load16(d + vt);
  if (static_cast<uint64_t>(vt) + vt_size > n) return false;
  auto field = [&](uint16_t voff) -> uint16_t {
    if (voff + 2u > vt_size) return 0;
    uint16_t fo = Load16(d + vt + voff);
    if (fo == 0 || table + fo + 2u > n) return 0;
    return Load16(d + table + fo);
  };
  *major = field(wire::Envelope::VT_SCHEMA_MAJOR);
  *minor = field(wire::Envelope::VT_SCHEMA_MINOR);
  return true;
}

bool Within(const flatbuffers::String* s, size_t cap) { return s == nullptr || s->size() <= cap; }

// Names and labels end up in memory (registry, aligner), in the view and in alert
// text: cap them so one message cannot make any of those huge (docs/security.md).
bool StringsWithinCaps(const wire::Envelope& env) {
  switch (env.body_type()) {
    case wire::Body::TensorDirectory: {
      const auto* t = env.body_as_TensorDirectory()->tensors();
      if (t == nullptr) return true;
      for (const auto* info : *t)
        if (info == nullptr || !Within(info->name(), kMaxTensorNameLength)) return false;
      return true;
    }
    case wire::Body::Hello: {
      const auto* h = env.body_as_Hello();
      if (!Within(h->experiment(), kMaxRunIdLength)) return false;
      for (const auto* s : {h->platform(), h->device_name(), h->framework(), h->host(),
                            h->agent_version()})
        if (!Within(s, kMaxLabelLength)) return false;
      if (const auto* sc = h->sampling())
        return Within(sc->include(), kMaxTensorNameLength) && Within(sc->exclude(), kMaxTensorNameLength);
      return true;
    }
    case wire::Body::Goodbye: return Within(env.body_as_Goodbye()->reason(), kMaxLabelLength);
    case wire::Body::ControlAck: {
      const auto* a = env.body_as_ControlAck();
      if (!Within(a->detail(), kMaxTensorNameLength)) return false;
      const auto* r = a->replay();
      if (r == nullptr) return true;
      for (const auto* s : {r->file(), r->row(), r->dtype(), r->coarsest(), r->settings_digest(),
                            r->inputs_digest(), r->output_digest(), r->error()})
        if (!Within(s, kMaxTensorNameLength)) return false;
      for (const auto* kv : {r->settings(), r->precision()}) {
        if (kv == nullptr) continue;
        if (kv->size() > kMaxSelfReplaySettings) return false;
        for (const auto* e : *kv)
          if (e == nullptr || !Within(e->key(), kMaxTensorNameLength) || !Within(e->value(), kMaxTensorNameLength))
            return false;
      }
      return true;
    }
    case wire::Body::Sampling: {
      const auto* sc = env.body_as_Sampling()->config();
      return sc == nullptr ||
             (Within(sc->include(), kMaxTensorNameLength) && Within(sc->exclude(), kMaxTensorNameLength));
    }
    case wire::Body::RunFingerprint: {
      const auto* es = env.body_as_RunFingerprint()->entries();
      if (es == nullptr) return true;
      if (es->size() > kMaxFingerprintEntries) return false;
      for (const auto* e : *es)
        if (e == nullptr || !Within(e->key(), kMaxTensorNameLength) || !Within(e->value(), kMaxTensorNameLength))
          return false;
      return true;
    }
    default: return true;
  }
}

// FlatBuffers 2.0.8's Verifier checks a vector's length field for 4-byte alignment
// but not its elements, so a [long] or a vector of 8-byte structs may start at 4 mod 8
// and still verify; every read of it is then a misaligned 8-byte load (undefined
// behaviour; found by fuzz_envelope). FlatBufferBuilder never writes that for a vector
// with elements, so such a message is malformed. An empty vector is not aligned by the
// builder (PreAlign skips a length of 0: a 0-d tensor's shape, such as a Hugging Face
// model's output loss) and has nothing to load, so it always passes. `data` is 8-byte
// aligned (see the header), so the address itself tells.
bool Aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7) == 0; }

// Runs before the body check: the body may be missing here.
bool WideVectorsAligned(const wire::Envelope& env) {
  switch (env.body_type()) {
    case wire::Body::TensorDirectory: {
      const auto* dir = env.body_as_TensorDirectory();
      const auto* tensors = dir ? dir->tensors() : nullptr;
      if (tensors == nullptr) return true;
      for (const wire::TensorInfo* t : *tensors) {
        const auto* shape = t->shape();
        if (shape != nullptr && shape->size() != 0 && !Aligned8(shape->data())) return false;
      }
      return true;
    }
    case wire::Body::StepStats: {
      const auto* ss = env.body_as_StepStats();
      const auto* stats = ss ? ss->stats() : nullptr;
      return stats == nullptr || stats->size() == 0 || Aligned8(stats->data());
    }
    default:
      return true;
  }
}

}  // namespace

const char* RejectName(Reject r) {
  switch (r) {
    case Reject::kNone: return "none";
    case Reject::kEmpty: return "empty";
    case Reject::kOversized: return "oversized";
    case Reject::kFileIdentifier: return "file_identifier";
    case Reject::kMalformed: return "malformed";
    case Reject::kSchemaMajor: return "schema_major";
    case Reject::kRunId: return "run_id";
    case Reject::kNoBody: return "no_body";
    case Reject::kTooLong: return "too_long";
    case Reject::kRunClaimed: return "run_claimed";
    case Reject::kCount: break;
  }
  return "unknown";
}

EnvelopeCheck CheckEnvelope(const uint8_t* data, size_t size, size_t max_bytes) {
  EnvelopeCheck c;
  if (size == 0) {
    c.reject = Reject::kEmpty;
    return c;
  }
  if (size > max_bytes) {
    c.reject = Reject::kOversized;
    return c;
  }
  if (size < 8 || !wire::EnvelopeBufferHasIdentifier(data)) {
    c.reject = Reject::kFileIdentifier;
    return c;
  }
  flatbuffers::Verifier verifier(data, size);
  if (!wire::VerifyEnvelopeBuffer(verifier)) {
    uint16_t major = 0, minor = 0;
    if (PeekVersion(data, size, &major, &minor) && major != kSchemaMajor) {
      c.schema_major = major;
      c.schema_minor = minor;
      c.reject = Reject::kSchemaMajor;
    } else {
      c.reject = Reject::kMalformed;
    }
    return c;
  }
  const wire::Envelope* env = wire::GetEnvelope(data);
  c.schema_major = env->schema_major();
  c.schema_minor = env->schema_minor();
  // A newer minor only appends fields, which the verifier above already skipped.
  if (c.schema_major != kSchemaMajor) {
    c.reject = Reject::kSchemaMajor;
    c.env = env;  // verifiable: lets the caller attribute it to its run
    return c;
  }
  if (!WideVectorsAligned(*env)) {
    c.reject = Reject::kMalformed;
    return c;
  }
  const flatbuffers::String* run = env->run_id();
  if (run == nullptr || !IsValidRunId(std::string_view(run->c_str(), run->size()))) {
    c.reject = Reject::kRunId;
    return c;
  }
  if (env->body_type() == wire::Body::NONE || env->body() == nullptr) {
    c.reject = Reject::kNoBody;
    c.env = env;
    return c;
  }
  c.env = env;
  if (!StringsWithinCaps(*env)) c.reject = Reject::kTooLong;  // env kept: attributable
  return c;
}

std::string DescribeReject(const EnvelopeCheck& c, size_t size, size_t max_bytes) {
  switch (c.reject) {
    case Reject::kNone: return "accepted";
    case Reject::kEmpty: return "an empty message";
    case Reject::kOversized:
      return "a message of " + std::to_string(size) + " bytes, over the cap of " +
             std::to_string(max_bytes) + " (raise --max-message-bytes if the agent is right)";
    case Reject::kFileIdentifier:
      return "a message of " + std::to_string(size) +
             " bytes without the lockstep identifier 'LKS1' (is something else sending to "
             "this port?)";
    case Reject::kMalformed:
      return "a malformed or truncated lockstep message of " + std::to_string(size) +
             " bytes (the FlatBuffers verifier refused it, or a vector of 8-byte values is "
             "misaligned)";
    case Reject::kSchemaMajor:
      if (c.schema_major == 0) return "a message without a schema version (agent too old?)";
      return "a message of schema version " + std::to_string(c.schema_major) + "." +
             std::to_string(c.schema_minor) + " (this collector reads " +
             std::to_string(kSchemaMajor) +
             ".x): run an agent and a collector of the same major version";
    case Reject::kRunId:
      return "a message whose run id is empty, longer than 128 characters, starts with '.' "
             "or has characters outside [A-Za-z0-9._-]";
    case Reject::kNoBody: return "a message with no body";
    case Reject::kTooLong:
      return "a message with a tensor name longer than " + std::to_string(kMaxTensorNameLength) +
             " characters, an experiment name longer than " + std::to_string(kMaxRunIdLength) +
             " or a label longer than " + std::to_string(kMaxLabelLength);
    case Reject::kRunClaimed:
      return "a message of a second process using a live run id with another role";
    case Reject::kCount: break;
  }
  return "a bad message";
}

}  // namespace lockstep::collector
