// `lockstep import msprobe`: a PyTorch msprobe (mindstudio-probe) dump as a lockstep run
// log (docs/msprobe.md). The dump's layout is DUMP/step<N>/<rank<R>|proc<PID>>/
// {dump.json, construct.json, stack.json}; each dump.json is read as a stream
// (interop/json_stream.h), so memory grows with the number of calls in one step (their
// names), not with the size of the file.
//
// Each (step, rank) becomes that rank's StepStats (statistics-only records:
// StatFlags.kStatsOnly, no sketch or histogram) and a StepEnd, after one Hello per rank
// and the tensor directory; names and kinds as interop/msprobe_names.h maps them.
// The log is written under a temporary name beside OUT and renamed at the end: an
// error leaves nothing behind.
//
// Threads: one call, one thread.
#ifndef LOCKSTEP_COLLECTOR_INTEROP_MSPROBE_IMPORT_H_
#define LOCKSTEP_COLLECTOR_INTEROP_MSPROBE_IMPORT_H_

#include <cstdint>
#include <string>

#include "lockstep/common/status.h"

namespace lockstep::collector {

struct MsprobeImportOptions {
  std::string dump_dir;
  std::string out_path;         // the run log to write (replaced if it exists)
  std::string run;              // run id; "" = from the dump folder's name
  std::string role = "baseline";  // baseline, candidate, solo, unknown
  std::string experiment;       // "" = the run id
  // Tensor mode: a folder mirroring the dump's (step<N>/<rank>/lockstep_rows.json) with
  // the full rows `python -m lockstep import-msprobe` computed from the dumped tensors
  // (data_name -> row); a tensor with a row there is imported whole, not statistics-only.
  std::string rows_dir;
};

struct MsprobeImportSummary {
  std::string run;
  uint64_t steps = 0, ranks = 0, entries = 0, records = 0, json_bytes = 0;
  uint64_t full_records = 0;  // of `records`, those with full rows (rows_dir)
  std::string task, level;
};

// Writes the run log. InvalidArgument / NotFound / Corruption / IOError with one
// sentence naming the file and what is wrong (not an msprobe dump, a truncated
// dump.json, a MindSpore dump, a rank missing from a step).
Status ImportMsprobe(const MsprobeImportOptions& options, MsprobeImportSummary* summary);

// Whether `path` is a directory laid out as an msprobe dump (step<N>/<rank>/dump.json,
// or a <rank> folder with dump.json): what compare and report use to tell a dump from a
// run log.
bool IsMsprobeDumpDir(const std::string& path);

// A run id made from a dump folder's name ([A-Za-z0-9._-], other characters as '-').
std::string RunIdFromPath(const std::string& path);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_INTEROP_MSPROBE_IMPORT_H_
