// fuzz_envelope: one received frame through what the collector does with it
// (Collector::Impl::Handle, collector/src/ingest/collector.cc), minus the socket and
// the disk: CheckEnvelope; for a refusal, its sentence and the attribution to a run;
// for an accepted message, the registry, the `inspect` rendering and the aligner's
// decoder. Sequences of messages are fuzz_session's job.
#include <cstdint>
#include <string>

#include "align/names.h"
#include "align/run_decoder.h"
#include "fuzz_common.h"
#include "lockstep/common/envelope_check.h"
#include "lockstep/collector/registry.h"
#include "lockstep/common/wire.h"
#include "lockstep/schema/lockstep_generated.h"
#include "cli/inspect_format.h"

namespace lockstep::fuzz {
namespace {

using collector::Reject;

// Reads every value a closed step points at, so a bad offset into its sketch or
// histogram storage is an ASan report rather than a silent wrong number.
double Touch(const collector::StepData& s) {
  double sum = 0;
  for (const auto& r : s.rows) {
    if (const float* sk = s.SketchOf(r))
      for (uint16_t i = 0; i < r.sketch_k; ++i) sum += sk[i];
    if (const uint32_t* h = s.HistOf(r))
      for (uint8_t i = 0; i < r.hist_bins; ++i) sum += h[i];
  }
  return sum;
}

void OneFrame(const uint8_t* data, size_t size) {
  AlignedBytes msg(data, size);
  collector::EnvelopeCheck c = collector::CheckEnvelope(msg.data(), msg.size(), kMaxMessageBytes);
  std::string why = collector::DescribeReject(c, size, kMaxMessageBytes);
  if (why.empty() || std::string(collector::RejectName(c.reject)) == "unknown")
    Fail("a rejection without a sentence or a name");
  collector::Registry registry;

  if (c.reject != Reject::kNone) {
    // Only a verifiable envelope may be handed back, and only for the reasons that
    // let Handle() attribute it to a run.
    if (c.env != nullptr && c.reject != Reject::kSchemaMajor && c.reject != Reject::kNoBody &&
        c.reject != Reject::kTooLong)
      Fail(std::string("env set on a '") + collector::RejectName(c.reject) + "' rejection");
    if (c.env != nullptr && c.env->run_id() != nullptr) {
      std::string_view run(c.env->run_id()->c_str(), c.env->run_id()->size());
      if (IsValidRunId(run)) registry.OnBad(run, c.env->rank());
    }
    return;
  }

  const wire::Envelope& env = *c.env;
  if (env.run_id() == nullptr || env.schema_major() != kSchemaMajor ||
      env.body_type() == wire::Body::NONE || env.body() == nullptr)
    Fail("an accepted envelope without run id, schema major or body");
  std::string_view run(env.run_id()->c_str(), env.run_id()->size());
  if (!IsValidRunId(run)) Fail("an accepted envelope with an invalid run id");

  registry.OnMessage(env, 1700000000000000000, size);
  std::string out;
  for (const auto& r : registry.Snapshot()) collector::RankSummaryJson(r, &out);

  collector::InspectFormatter fmt;
  out.clear();
  fmt.Record(env, 1700000000000000000, 16, static_cast<uint32_t>(size), &out);

  collector::NameCanonicalizer canon;
  collector::NameTable names;
  double sink = 0;
  collector::RunDecoder dec(std::string(run), &canon, &names, /*idle_close_ns=*/0,
                            [&](uint32_t, collector::StepPtr s) { sink += Touch(*s); });
  dec.Consume(env, 1700000000000000000);
  dec.CloseAll();
  (void)sink;
}

}  // namespace
}  // namespace lockstep::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  lockstep::fuzz::Quiet();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lockstep::fuzz::OneFrame(data, size);
  return 0;
}
