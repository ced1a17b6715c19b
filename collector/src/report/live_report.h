// The report served live by `lockstep collect` on its HTTP port (next to /metrics):
//
//   GET /                          the experiments with a compared pair, one link each
//   GET /report?experiment=NAME    the report page of NAME's first pair; it fetches
//                                  /report.json?experiment=NAME every 5 s (&refresh=N:
//                                  every N s) and redraws
//   GET /report.json?experiment=NAME  the page's data (docs/report.md)
//
// The data is what `lockstep report` shows, so far: the Analyzer's PairReport (one copy
// under LiveAnalyzer's mutex, as a /metrics scrape takes), the verdict over it and what
// the ReportRecorder kept. The verdict counts only the steps compared so far.
//
// Threads: ServeLiveReport runs on the HTTP server's thread; the recorder and the
// analyzer lock themselves. Both must outlive the server.
#ifndef LOCKSTEP_COLLECTOR_REPORT_LIVE_REPORT_H_
#define LOCKSTEP_COLLECTOR_REPORT_LIVE_REPORT_H_

#include <string>
#include <string_view>

namespace lockstep::collector {

class LiveAnalyzer;
class ReportRecorder;

struct LiveReportSources {
  const ReportRecorder* recorder = nullptr;
  const LiveAnalyzer* analyzer = nullptr;
  std::string generated_by;  // e.g. "lockstep 0.9.0 collect"
  std::string settings_source;  // one phrase: the collector's detection settings
};

// Answers `target` (path and query) when it is one of the routes above: true with the
// body and its content type, false for any other path. An unknown experiment is a
// small HTML page saying so (status 200, so the live page keeps polling).
bool ServeLiveReport(const LiveReportSources& src, std::string_view target, std::string* content_type,
                     std::string* body);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_REPORT_LIVE_REPORT_H_
