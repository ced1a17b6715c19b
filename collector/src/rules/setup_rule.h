// The `setup` rule and the first divergence's cause (docs/rules.md "Setup" and
// "Causes"): what the two runs' fingerprints (wire RunFingerprint) say differs, and
// the facts of a pair that explain a divergence before any layer is blamed.
//
// Pure functions and plain structs; the analyzer's thread.
#ifndef LOCKSTEP_COLLECTOR_RULES_SETUP_RULE_H_
#define LOCKSTEP_COLLECTOR_RULES_SETUP_RULE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lockstep/alerting/alert.h"

namespace lockstep::collector {

using Fingerprint = std::map<std::string, std::string>;

// One setting that differs. "(absent)" stands for a key one run does not have.
struct SetupDiff {
  std::string key, baseline, candidate;
  // "environment" (versions, device names, rank: info, the point of a migration),
  // "precision" (autocast, parameter dtypes, TF32 / matmul precision: warning),
  // "config" (everything else: seed, hyperparameters, module settings, determinism
  // flags, environment variables, the user's config: warning).
  std::string category;
  alerting::Severity severity = alerting::Severity::kWarning;
};

// Every difference, sorted by key. Twins give none. `fingerprint.step` (the step an
// agent read its fingerprint at) is never a difference: when both runs have it and it
// differs (a run resumed under a new run id, read at its start_step), the optimizer's
// scheduled values (optim.group<i>.lr / momentum / betas, which LR schedulers move
// step by step) are not compared, `initial_lr` (the scheduler's base lr) is, and
// `*note` (if given) says so in one sentence, naming what was left out; else "".
std::vector<SetupDiff> DiffFingerprints(const Fingerprint& b, const Fingerprint& c, std::string* note = nullptr);

// "3 settings differ: a 1 vs 2; b x vs y; ... (+N more)", warnings first.
std::string DescribeSetup(const std::vector<SetupDiff>& diffs, size_t max_items = 8);

// What a pair has learned that may explain its first divergence. Filled by the
// analyzer (setup) and the scalars rule; read by first_divergence.
struct PairFacts {
  bool setup_known = false;
  std::vector<SetupDiff> setup;
  std::string setup_note;           // DiffFingerprints' note ("" when none)
  int64_t config_scalar_step = -1;  // first step lr or loss scale differ (-1: never)
  std::string config_scalar;        // its message
  int64_t samples_step = -1;        // first step the sample counts differ
  std::string samples;
  int64_t first_step = -1;          // the pair's first compared step
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RULES_SETUP_RULE_H_
