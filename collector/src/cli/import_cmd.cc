// `lockstep import msprobe DUMP_DIR -o RUN.lslog`: another tool's dump as a run log that
// every command reads (interop/msprobe_import.h, docs/msprobe.md). Parsing and output
// only; the import itself is interop/'s.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/output_flag.h"
#include "interop/msprobe_import.h"
#include "lockstep/common/flags.h"
#include "lockstep/common/wire.h"

namespace lockstep::cli {

int ImportCommand(int argc, const char* const* argv) {
  std::string output, run, role = "baseline", experiment, rows;
  FlagSet fs("import", "import msprobe DUMP_DIR -o RUN.lslog [--run ID] [--role ROLE] [--experiment NAME]",
             "Turns another tool's dump into a lockstep run log that inspect, compare, report and collect "
             "--baseline read. Today one format: msprobe (mindstudio-probe) dumps of PyTorch in statistics or "
             "tensor mode, levels L0, L1 and mix: DUMP_DIR is the dump_path of msprobe's config, holding "
             "step<N>/rank<R>/dump.json (or proc<PID>). Module outputs become act rows named by module path, "
             "their inputs act_in, their output gradients act_grad, parameter gradients param_grad, API calls "
             "ops inside their module (blocks.0.fc1/linear#0); records carry max, min, mean and norm only "
             "(statistics-only: no sketch, histogram or std). The log is written under a temporary name and "
             "renamed when complete. Exits 0 when written; 2 on a usage error; 3 when the dump is missing, "
             "not an msprobe dump, truncated or of another framework.");
  fs.String("output", &output, "the run log to write (also -o FILE)", "FILE");
  fs.String("run", &run, "the run id (default: the dump folder's name)", "ID");
  fs.String("role", &role, "the run's role: baseline (default), candidate, solo or unknown", "ROLE");
  fs.String("experiment", &experiment, "the experiment it belongs to (default: the run id)", "NAME");
  fs.String("rows", &rows,
            "tensor mode: the full rows python -m lockstep import-msprobe computed from the dumped tensors "
            "(a folder mirroring the dump's); it passes this itself",
            "DIR");
  Status st = ParseWithShortOutput(&fs, argc, argv);
  if (fs.help_requested()) {
    std::printf("%s", fs.Help().c_str());
    return kExitOk;
  }
  auto fail = [](int code, const std::string& msg) {
    std::fprintf(stderr, "lockstep import: %s\n", OneLine(msg, 1000).c_str());
    return code;
  };
  if (!st.ok()) return fail(kExitUsage, st.message());
  const auto& pos = fs.positional();
  if (pos.empty() || pos[0] != "msprobe") {
    return fail(kExitUsage, "give the format and the dump: lockstep import msprobe DUMP_DIR -o RUN.lslog "
                            "(msprobe is the one format lockstep imports today)");
  }
  if (pos.size() != 2) return fail(kExitUsage, "give one msprobe dump folder: lockstep import msprobe DUMP_DIR -o RUN.lslog");
  if (output.empty()) return fail(kExitUsage, "give the run log to write with -o FILE (e.g. -o npu-run.lslog)");
  if (!run.empty() && !IsValidRunId(run)) {
    return fail(kExitUsage, "--run '" + run + "' is not a run id (1-128 characters of A-Z a-z 0-9 . _ -, not "
                            "starting with '.')");
  }
  if (role != "baseline" && role != "candidate" && role != "solo" && role != "unknown") {
    return fail(kExitUsage, "--role '" + role + "' is not one of baseline, candidate, solo, unknown");
  }
  collector::MsprobeImportOptions o;
  o.dump_dir = pos[1];
  o.out_path = output;
  o.run = run;
  o.role = role;
  o.experiment = experiment;
  o.rows_dir = rows;
  collector::MsprobeImportSummary sum;
  st = collector::ImportMsprobe(o, &sum);
  if (!st.ok()) return fail(kExitBadInput, st.message());
  const std::string what = sum.full_records == 0 ? "statistics only"
                           : sum.full_records == sum.records
                               ? "full rows from the tensors"
                               : std::to_string(sum.full_records) + " full rows from the tensors, the rest statistics only";
  std::printf("import: %s: run %s, %llu step(s) x %llu rank(s), %llu records from %llu entries (%s %s, %.1f MB of "
              "JSON); %s\n",
              output.c_str(), sum.run.c_str(), static_cast<unsigned long long>(sum.steps),
              static_cast<unsigned long long>(sum.ranks), static_cast<unsigned long long>(sum.records),
              static_cast<unsigned long long>(sum.entries), sum.task.c_str(), sum.level.c_str(),
              sum.json_bytes / 1e6, what.c_str());
  return kExitOk;
}

}  // namespace lockstep::cli
