// The files of one run's log once it is split into segments (log_format.h "Segments"):
// listing the closed segments of a log and the runs of a data dir.
//
// Threads: plain functions; they only read the directory.
#ifndef LOCKSTEP_COLLECTOR_RUNLOG_SEGMENTS_H_
#define LOCKSTEP_COLLECTOR_RUNLOG_SEGMENTS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::collector::runlog {

struct Segment {
  uint64_t number = 0;
  std::string path;
};

// The closed segments of the log at `log_path` ("<log_path>.<digits>"), oldest first,
// those numbered above `after` only. A directory that cannot be listed has none.
std::vector<Segment> ListSegments(const std::string& log_path, uint64_t after = 0);

// The run ids of `data_dir` that have a log: an open "<run>.lslog", closed segments, or
// both (a collector killed while it rotated leaves only segments), sorted.
std::vector<std::string> ListRunLogs(const std::string& data_dir);

}  // namespace lockstep::collector::runlog

#endif  // LOCKSTEP_COLLECTOR_RUNLOG_SEGMENTS_H_
