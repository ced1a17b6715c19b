// Wire-level constants and checks shared by the agent and the collector.
// Header-only; no flatbuffers types appear here (the agent's public headers include it).
#ifndef LOCKSTEP_COMMON_WIRE_H_
#define LOCKSTEP_COMMON_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace lockstep {

inline constexpr uint16_t kSchemaMajor = 1;
// 1: StepScalars.given, Envelope.session, TensorInfo.module_type;
// 2: TensorKind.Input, RunFingerprint (a Body member)
// 3: StepEnd and Sampling (Body members); a rank whose Hello says 3 or more ends each
//    step with a StepEnd
// 4: TensorKind.ActIn (a module's inputs)
// 5: ControlAck (a Body member): an agent answers the collector's ControlRequest
// 6: ControlAck.replay (SelfReplay): a capture replayed by the run that made it, in a
//    second Done answer to the capture request; StatFlags.kStatsOnly: a statistics-only
//    record (an import of an msprobe dump, docs/msprobe.md)
// 7: TensorKind.GradReduced (the replica check, docs/rules.md "replicas");
//    StatFlags.kDevice: a record of the agent's batched device path
inline constexpr uint16_t kSchemaMinor = 7;
// The first minor whose agents send StepEnd.
inline constexpr uint16_t kStepEndMinor = 3;
// The first minor whose agents replay their own captures (ControlAck.replay).
inline constexpr uint16_t kSelfReplayMinor = 6;
// Micro steps counted one by one in StepEnd.micro_records.
inline constexpr uint32_t kMaxCountedMicroSteps = 4096;

// Whether a StepScalars field was given, from the message's `given` mask (the schema's
// ScalarGiven bits; bit 7 = the mask is authoritative) and the field's value. Messages
// of older agents carry no mask: there a NaN field means "not given".
inline constexpr bool ScalarIsGiven(uint8_t given_mask, uint8_t bit, double value) {
  return (given_mask & 0x80u) ? (given_mask & bit) != 0 : value == value;
}

// Largest message the collector accepts (and the agent builds): 16 MiB.
inline constexpr size_t kMaxMessageBytes = 16u << 20;
// Longest run id / experiment name, and longest tensor name.
inline constexpr size_t kMaxRunIdLength = 128;
inline constexpr size_t kMaxTensorNameLength = 1024;
// Longest free-text label of a Hello or Goodbye (platform, host, framework, reason...).
inline constexpr size_t kMaxLabelLength = 256;
// Entries of one RunFingerprint message (the agent sends at most 20001).
inline constexpr size_t kMaxFingerprintEntries = 65536;
// Entries of each of a SelfReplay's settings and precision lists (the agent cuts to it).
inline constexpr size_t kMaxSelfReplaySettings = 256;
// Largest count-sketch width an agent may send.
inline constexpr int kMaxSketchK = 256;
inline constexpr int kDefaultSketchK = 32;
inline constexpr int kHistBins = 16;

// A run id names a file in the collector's data dir, so it must not be able to
// escape it: 1..128 of [A-Za-z0-9._-], not starting with '.'.
inline bool IsValidRunId(std::string_view id) noexcept {
  if (id.empty() || id.size() > kMaxRunIdLength || id.front() == '.') return false;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_WIRE_H_
