// `compare --format msprobe-csv`: the per-tensor table in the columns of msprobe's
// statistics compare result (its CompareConst.SUMMARY_COMPARE_RESULT_HEADER, so a
// migration team's spreadsheets and scripts read it), then lockstep's own columns
// (docs/msprobe.md "Results in msprobe's terms"). NPU is the candidate, Bench the baseline.
#ifndef LOCKSTEP_CLI_MSPROBE_CSV_H_
#define LOCKSTEP_CLI_MSPROBE_CSV_H_

#include <cstdio>
#include <string>

#include "detect/analyzer.h"

namespace lockstep::cli {

// Writes the header and one row per compared tensor (its worst step), then one per
// tensor found in one run only. The shapes come from the two logs' tensor directories.
void WriteMsprobeCsv(const collector::PairReport& r, const std::string& baseline_log, const std::string& candidate_log,
                     FILE* out);

// One CSV field, quoted when it holds a comma, a quote or a line break.
std::string CsvField(const std::string& s);

}  // namespace lockstep::cli

#endif  // LOCKSTEP_CLI_MSPROBE_CSV_H_
