#include "metrics/collector_metrics.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "detect/live_analyzer.h"
#include "lockstep/alerting/dispatcher.h"
#include "lockstep/collector/collector.h"
#include "metrics/exposition.h"
#include "metrics/http_server.h"
#include "metrics/metrics_feed.h"
#include "runlog/retention.h"

namespace lockstep::collector::metrics {
namespace {

using C = MetricType;

// One renderer per source, in scrape order; each reads its source as
// collector_metrics.h says (copies and atomics, never a wait).

// Collector-wide: build info, start time, health, ingest counters by reason, CURVE
// (only when it is on), run-log errors, replay.
void RenderIngestMetrics(TextWriter& w, const Collector& collector,
                         const CollectorCounters& counters, int64_t start_unix_ns) {
  w.Family("lockstep_build_info", C::kGauge, "Always 1; the labels name this collector's version.");
  w.Sample({{"version", LOCKSTEP_COLLECTOR_VERSION}}, 1.0);
  w.Family("lockstep_collector_start_time_seconds", C::kGauge, "Unix time at which this collector started serving metrics.");
  w.Sample({}, start_unix_ns / 1e9);
  w.Family("lockstep_collector_up", C::kGauge, "1 while the ingest thread is healthy, 0 once it has failed.");
  w.Sample({}, collector.health().ok() ? 1.0 : 0.0);
  w.Family("lockstep_collector_received_messages_total", C::kCounter,
           "Frames taken off the ingest socket, good and bad.");
  w.Sample({}, counters.received);
  w.Family("lockstep_collector_messages_total", C::kCounter, "Messages that passed every check and were logged.");
  w.Sample({}, counters.accepted);
  w.Family("lockstep_collector_records_total", C::kCounter,
           "Tensor statistic and step scalar records in accepted messages.");
  w.Sample({}, counters.records);
  w.Family("lockstep_collector_logged_bytes_total", C::kCounter,
           "Bytes of accepted messages appended to the run logs.");
  w.Sample({}, counters.bytes);
  w.Family("lockstep_collector_bad_messages_total", C::kCounter,
           "Messages refused by ingest, by reason (none of them reached a run log).");
  for (size_t i = 1; i < static_cast<size_t>(Reject::kCount); ++i)
    w.Sample({{"reason", RejectName(static_cast<Reject>(i))}}, counters.rejected_by[i]);
  if (!collector.curve_public_key().empty()) {  // only when CURVE is on
    w.Family("lockstep_collector_curve_handshakes_total", C::kCounter,
             "CURVE handshakes on the ingest socket that succeeded (agents admitted).");
    w.Sample({}, counters.auth.admitted);
    w.Family("lockstep_collector_refused_connections_total", C::kCounter,
             "Connections refused by CURVE, by reason (docs/security.md).");
    for (size_t i = 0; i < static_cast<size_t>(AuthRefusal::kCount); ++i)
      w.Sample({{"reason", AuthRefusalName(static_cast<AuthRefusal>(i))}}, counters.auth.refused_by[i]);
  }
  w.Family("lockstep_collector_log_errors_total", C::kCounter,
           "Run log appends, flushes or fsyncs that failed (disk full, I/O error).");
  w.Sample({}, counters.log_errors);
  w.Family("lockstep_collector_log_lost_messages_total", C::kCounter,
           "Accepted messages that never reached the disk because of a log error.");
  w.Sample({}, counters.log_lost_records);
  w.Family("lockstep_collector_sink_errors_total", C::kCounter,
           "Exceptions thrown by message consumers (analyzer, view) and caught by ingest.");
  w.Sample({}, counters.sink_errors);
  w.Family("lockstep_collector_fsyncs_total", C::kCounter, "fdatasync calls on the run logs.");
  w.Sample({}, counters.fsyncs);
  w.Family("lockstep_collector_replayed_messages_total", C::kCounter,
           "Messages replayed from existing run logs at start-up to rebuild the registry.");
  w.Sample({}, counters.rebuilt_messages);
  // The control channel (docs/design.md "The control channel").
  w.Family("lockstep_collector_control_requests_total", C::kCounter,
           "Requests the collector made of agents (zoom, capture) on its control channel.");
  w.Sample({}, counters.control_requests);
  w.Family("lockstep_collector_control_publications_total", C::kCounter,
           "Request frames published on the control socket (each request again until answered).");
  w.Sample({}, counters.control_publications);
  w.Family("lockstep_collector_control_answers_total", C::kCounter,
           "Agents' answers to requests (ControlAck), by status.");
  for (size_t i = 0; i < kAnswerStatusCount; ++i) w.Sample({{"status", kAnswerStatusNames[i]}}, counters.control_answers_by[i]);
  w.Family("lockstep_collector_control_replays_total", C::kCounter,
           "Answers carrying a capture replayed on the job's host (a second done).");
  w.Sample({}, counters.control_replays);
}

// Runs and ranks heard from, and per (run, rank) from the registry; `now_ns` (unix)
// ages the last-seen figure.
void RenderRankMetrics(TextWriter& w, const std::vector<RankInfo>& ranks, int64_t now_ns) {
  std::vector<std::string> runs;
  for (const auto& r : ranks)
    if (runs.empty() || runs.back() != r.run) runs.push_back(r.run);
  w.Family("lockstep_runs", C::kGauge, "Runs the collector has heard from (including those replayed from logs).");
  w.Sample({}, static_cast<uint64_t>(runs.size()));
  w.Family("lockstep_ranks", C::kGauge, "(run, rank) pairs the collector has heard from.");
  w.Sample({}, static_cast<uint64_t>(ranks.size()));

  // Per (run, rank), from the registry.
  std::vector<std::string> rank_str;
  rank_str.reserve(ranks.size());
  for (const auto& r : ranks) rank_str.push_back(std::to_string(r.rank));
  auto per_rank = [&](const char* name, MetricType type, const char* help, auto value) {
    w.Family(name, type, help);
    for (size_t i = 0; i < ranks.size(); ++i) {
      const auto v = value(ranks[i]);
      // A figure the rank does not have yet (no step, no message) is left out.
      if constexpr (std::is_floating_point_v<decltype(v)>)
        if (std::isnan(v)) continue;
      w.Sample({{"run", ranks[i].run}, {"rank", rank_str[i]}}, v);
    }
  };
  w.Family("lockstep_rank_info", C::kGauge,
           "Always 1; labels carry what the agent's Hello said about the (run, rank).");
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankInfo& r = ranks[i];
    w.Sample({{"run", r.run},
              {"rank", rank_str[i]},
              {"experiment", r.experiment},
              {"role", r.role},
              {"platform", r.platform},
              {"device", r.device_name},
              {"framework", r.framework},
              {"host", r.host},
              {"agent_version", r.agent_version}},
             1.0);
  }
  per_rank("lockstep_rank_last_step", C::kGauge,
           "Highest step seen from the rank (stats, scalars, heartbeat or goodbye); absent until one is seen.",
           [](const RankInfo& r) { return r.has_step ? static_cast<double>(r.last_step) : std::nan(""); });
  per_rank("lockstep_rank_messages_total", C::kCounter, "Accepted messages from the rank (duplicates included).",
           [](const RankInfo& r) { return r.messages; });
  per_rank("lockstep_rank_records_total", C::kCounter, "Tensor statistic and step scalar records from the rank.",
           [](const RankInfo& r) { return r.records; });
  per_rank("lockstep_rank_received_bytes_total", C::kCounter, "Bytes of accepted messages from the rank.",
           [](const RankInfo& r) { return r.bytes; });
  per_rank("lockstep_rank_agent_dropped_records_total", C::kCounter,
           "Records the agent dropped (queue or socket full), as reported in its heartbeats.",
           [](const RankInfo& r) { return r.agent_records_dropped; });
  per_rank("lockstep_rank_agent_dropped_messages_total", C::kCounter,
           "Whole messages the agent's socket refused (high-water mark), as reported in its heartbeats.",
           [](const RankInfo& r) { return r.agent_messages_dropped; });
  per_rank("lockstep_rank_agent_errors_total", C::kCounter,
           "Internal errors the agent caught (never raised into training), from its heartbeats.",
           [](const RankInfo& r) { return r.agent_errors; });
  per_rank("lockstep_rank_agent_queue_depth", C::kGauge, "Records waiting in the agent's queue at its last heartbeat.",
           [](const RankInfo& r) { return static_cast<uint64_t>(r.agent_queue_depth); });
  per_rank("lockstep_rank_missing_messages", C::kGauge,
           "Sequence numbers never received (gaps); falls when a late message fills its gap.",
           [](const RankInfo& r) { return r.gaps; });
  per_rank("lockstep_rank_duplicate_messages_total", C::kCounter, "Messages whose sequence number was already seen.",
           [](const RankInfo& r) { return r.duplicates; });
  per_rank("lockstep_rank_bad_messages_total", C::kCounter,
           "Refused messages attributable to the rank (bad schema version, run id or body).",
           [](const RankInfo& r) { return r.bad_messages; });
  per_rank("lockstep_rank_agent_sessions_total", C::kCounter,
           "Agent sessions seen for the rank (1 normally; +1 each time the job restarted).",
           [](const RankInfo& r) { return r.sessions; });
  per_rank("lockstep_rank_last_seen_age_seconds", C::kGauge, "Seconds since the last accepted message from the rank.",
           [&](const RankInfo& r) {
             return r.last_recv_unix_ns > 0 ? std::max(0.0, (now_ns - r.last_recv_unix_ns) / 1e9) : std::nan("");
           });
  per_rank("lockstep_rank_finished", C::kGauge, "1 once the rank's latest agent session said goodbye, else 0.",
           [](const RankInfo& r) { return r.goodbye ? 1.0 : 0.0; });
}

// Step times per (run, rank) and alert counts, from the metrics feed.
void RenderFeedMetrics(TextWriter& w, const MetricsFeed& feed) {
  auto steps = feed.StepTimes();
  std::vector<std::string> rs;
  for (const auto& s : steps) rs.push_back(std::to_string(s.rank));
  w.Family("lockstep_rank_last_step_duration_seconds", C::kGauge,
           "Wall time of the rank's latest step, as measured by the agent.");
  for (size_t i = 0; i < steps.size(); ++i) w.Sample({{"run", steps[i].run}, {"rank", rs[i]}}, steps[i].last_s);
  w.Family("lockstep_rank_step_duration_seconds", C::kSummary,
           "Wall time of the rank's steps as measured by the agent (since this collector started).");
  for (size_t i = 0; i < steps.size(); ++i) {
    w.SampleSuffix("_sum", {{"run", steps[i].run}, {"rank", rs[i]}}, steps[i].sum_s);
    w.SampleSuffix("_count", {{"run", steps[i].run}, {"rank", rs[i]}}, static_cast<double>(steps[i].count));
  }
  w.Family("lockstep_alerts_total", C::kCounter, "Alerts fired by the detectors, by experiment, rule and severity.");
  for (const auto& a : feed.Alerts())
    w.Sample({{"experiment", a.experiment}, {"rule", a.rule}, {"severity", a.severity}}, a.count);
}

// What a scrape reads from the analyzer, copied under its mutex and rendered after.
struct PairFigures {
  std::string experiment, baseline, candidate;
  uint64_t steps_compared = 0, steps_evicted = 0, matched = 0, drifting = 0, unmatched = 0;
  double worst_score = 0;
  double loss_b = 0, loss_c = 0;
  bool diverged = false;
  uint64_t first_divergence_step = 0;
  bool setup_known = false;
  uint64_t setup_warnings = 0, setup_info = 0;
};

// One sample per (experiment, baseline, candidate) in each pair family.
void RenderPairs(TextWriter& w, const std::vector<PairFigures>& pairs) {
  auto per_pair = [&](const char* name, MetricType type, const char* help, auto value) {
    w.Family(name, type, help);
    for (const auto& p : pairs)
      w.Sample({{"experiment", p.experiment}, {"baseline", p.baseline}, {"candidate", p.candidate}}, value(p));
  };
  per_pair("lockstep_pair_compared_steps_total", C::kCounter, "(rank, step)s compared between baseline and candidate.",
           [](const PairFigures& p) { return p.steps_compared; });
  per_pair("lockstep_pair_evicted_steps_total", C::kCounter,
           "Steps dropped uncompared by the memory bound (a run too far ahead of its partner).",
           [](const PairFigures& p) { return p.steps_evicted; });
  per_pair("lockstep_pair_matched_tensors", C::kGauge, "Tensors matched between baseline and candidate.",
           [](const PairFigures& p) { return p.matched; });
  per_pair("lockstep_pair_unmatched_tensors", C::kGauge, "Tensors seen in only one of the two runs.",
           [](const PairFigures& p) { return p.unmatched; });
  per_pair("lockstep_pair_drifting_tensors", C::kGauge,
           "Matched tensors that exceeded their tolerance at some compared step (status drift, critical or nonfinite).",
           [](const PairFigures& p) { return p.drifting; });
  per_pair("lockstep_pair_worst_drift_score", C::kGauge,
           "Highest normalized drift score of any matched tensor (1 = the default tolerance).",
           [](const PairFigures& p) { return p.worst_score; });
  per_pair("lockstep_pair_baseline_loss", C::kGauge, "Baseline loss at the last compared step (NaN before one).",
           [](const PairFigures& p) { return p.loss_b; });
  per_pair("lockstep_pair_candidate_loss", C::kGauge, "Candidate loss at the last compared step (NaN before one).",
           [](const PairFigures& p) { return p.loss_c; });
  per_pair("lockstep_pair_loss_difference", C::kGauge, "Candidate minus baseline loss at the last compared step.",
           [](const PairFigures& p) { return p.loss_c - p.loss_b; });
  per_pair("lockstep_pair_loss_relative_difference", C::kGauge,
           "|candidate - baseline| / |baseline| loss at the last compared step (NaN when baseline loss is 0).",
           [](const PairFigures& p) {
             return p.loss_b != 0 ? std::fabs(p.loss_c - p.loss_b) / std::fabs(p.loss_b)
                                  : std::numeric_limits<double>::quiet_NaN();
           });
  per_pair("lockstep_pair_diverged", C::kGauge, "1 once the pair has a first divergence, else 0.",
           [](const PairFigures& p) { return p.diverged ? 1.0 : 0.0; });
  w.Family("lockstep_pair_setup_differences", C::kGauge,
           "Settings that differ between the two runs' fingerprints (rule setup), by severity: warning (a "
           "hyperparameter, seed, module setting, precision policy) or info (a library version, device name). "
           "Only for pairs whose fingerprints were compared.");
  for (const auto& p : pairs) {
    if (!p.setup_known) continue;
    for (const char* sev : {"warning", "info"}) {
      w.Sample({{"experiment", p.experiment}, {"baseline", p.baseline}, {"candidate", p.candidate}, {"severity", sev}},
               std::string(sev) == "info" ? p.setup_info : p.setup_warnings);
    }
  }
  w.Family("lockstep_pair_first_divergence_step", C::kGauge,
           "Step of the pair's first divergence (only for pairs that diverged).");
  for (const auto& p : pairs)
    if (p.diverged)
      w.Sample({{"experiment", p.experiment}, {"baseline", p.baseline}, {"candidate", p.candidate}},
               p.first_divergence_step);
}

// The analyzer's own counters, over every run.
void RenderAnalyzerCounters(TextWriter& w, const AnalyzerCounters& ac,
                            const LiveAnalyzer& analyzer) {
  w.Family("lockstep_analyzer_steps_closed_total", C::kCounter, "Steps of any run closed and checked by the per-run rules.");
  w.Sample({}, ac.steps_closed);
  w.Family("lockstep_analyzer_tensor_comparisons_total", C::kCounter, "Matched tensor pairs evaluated.");
  w.Sample({}, ac.pairs_compared);
  w.Family("lockstep_analyzer_late_records_total", C::kCounter, "Records that arrived after their step was closed.");
  w.Sample({}, ac.late_records);
  w.Family("lockstep_analyzer_steps_closed_at_step_end_total", C::kCounter,
           "Steps closed by the agent's StepEnd (agents without it: by inference, docs/runlog.md).");
  w.Sample({}, ac.closed_at_step_end);
  w.Family("lockstep_analyzer_records_missing_total", C::kCounter,
           "Records a StepEnd counted that never arrived (lost between the agent and the collector).");
  w.Sample({}, ac.records_missing);
  w.Family("lockstep_analyzer_restarts_total", C::kCounter,
           "Agent sessions whose step numbers went back (a job restarted under the same run id).");
  w.Sample({}, ac.restarts);
  w.Family("lockstep_analyzer_rewound_records_total", C::kCounter,
           "Records of step numbers a restart repeated: counted, not compared.");
  w.Sample({}, ac.rewound_records);
  w.Family("lockstep_analyzer_buffered_steps", C::kGauge, "Closed steps waiting in memory for their partner.");
  w.Sample({}, ac.buffered_steps);
  w.Family("lockstep_analyzer_buffered_bytes", C::kGauge, "Approximate memory of the waiting steps.");
  w.Sample({}, ac.buffered_bytes);
  w.Family("lockstep_analyzer_late_joins_total", C::kCounter,
           "Candidates paired after the baseline had let its first steps go: read from the baseline's log, or "
           "not comparable there (no log).");
  w.Sample({{"outcome", "read_back"}}, ac.late_joins_read_back);
  w.Sample({{"outcome", "uncompared"}}, ac.late_joins_uncompared);
  w.Family("lockstep_analyzer_errors_total", C::kCounter, "Exceptions inside the analyzer (the message stays in the log).");
  w.Sample({}, analyzer.errors());
}

// Per pair and the analyzer's counters, from one copy under the analyzer's mutex.
void RenderAnalyzerMetrics(TextWriter& w, const LiveAnalyzer& analyzer) {
  std::vector<PairFigures> pairs;
  AnalyzerCounters ac;
  analyzer.Inspect([&](const Analyzer& a) {
    ac = a.counters();
    for (const PairReport& p : a.Reports()) {
      PairFigures f{p.experiment, p.baseline, p.candidate};
      f.steps_compared = p.steps_compared;
      f.steps_evicted = p.steps_evicted;
      f.matched = p.tensors.size();
      f.unmatched = p.unmatched.size();
      for (const auto& t : p.tensors) {
        if (t.status != "ok") ++f.drifting;
        if (t.steps > 0 && std::isfinite(t.score)) f.worst_score = std::max(f.worst_score, t.score);
      }
      f.loss_b = p.loss_b;
      f.loss_c = p.loss_c;
      f.diverged = p.diverged;
      if (p.diverged) f.first_divergence_step = p.first_divergence.step;
      f.setup_known = p.setup_known;
      for (const auto& d : p.setup) (d.severity == alerting::Severity::kInfo ? f.setup_info : f.setup_warnings)++;
      pairs.push_back(std::move(f));
    }
  });
  RenderPairs(w, pairs);
  RenderAnalyzerCounters(w, ac, analyzer);
}

// Per alert sink, from the dispatcher's counters.
void RenderAlertSinkMetrics(TextWriter& w, const alerting::Dispatcher& dispatcher) {
  auto sinks = dispatcher.Counters();
  auto per_sink = [&](const char* name, MetricType type, const char* help, auto value) {
    w.Family(name, type, help);
    for (const auto& s : sinks) w.Sample({{"sink", s.name}, {"kind", s.kind}}, value(s));
  };
  using SC = alerting::SinkCounters;
  per_sink("lockstep_alert_sink_delivered_total", C::kCounter, "Alerts the sink's receiver accepted (or the file took).",
           [](const SC& s) { return s.delivered; });
  per_sink("lockstep_alert_sink_failed_total", C::kCounter, "Alerts given up on (a 4xx retrying cannot fix, a local error).",
           [](const SC& s) { return s.failed; });
  per_sink("lockstep_alert_sink_spooled_total", C::kCounter, "Alerts that outlived their first round of retries and went to the on-disk spool.",
           [](const SC& s) { return s.spooled; });
  per_sink("lockstep_alert_sink_spool_dropped_total", C::kCounter, "Oldest spooled alerts dropped to respect the spool's size cap.",
           [](const SC& s) { return s.spool_dropped; });
  per_sink("lockstep_alert_sink_retries_total", C::kCounter, "Delivery attempts after the first.",
           [](const SC& s) { return s.retried; });
  per_sink("lockstep_alert_sink_deduplicated_total", C::kCounter, "Alerts suppressed inside the dedup cooldown.",
           [](const SC& s) { return s.deduped; });
  per_sink("lockstep_alert_sink_rate_limited_total", C::kCounter, "Alerts dropped by the sink's rate limit.",
           [](const SC& s) { return s.rate_limited; });
  per_sink("lockstep_alert_sink_rate_held_total", C::kCounter,
           "Incident messages the sink's rate limit held back and merged into a later message.",
           [](const SC& s) { return s.rate_held; });
  per_sink("lockstep_alert_sink_queue_dropped_total", C::kCounter, "Alerts dropped because the sink's queue was full.",
           [](const SC& s) { return s.queue_dropped; });
  per_sink("lockstep_alert_sink_pending", C::kGauge, "Alerts queued or spooled, not yet delivered.",
           [](const SC& s) { return s.pending; });
}

// The log retention of `collect` (docs/runlog.md "Segments and retention"): what its
// passes thinned and reclaimed, and the disk the run logs use as of the last pass.
void RenderRetentionMetrics(TextWriter& w, const Retention& retention) {
  const RetentionCounters c = retention.counters();
  w.Family("lockstep_retention_log_bytes", C::kGauge,
           "Bytes of the run logs in the data dir at the end of the last retention pass.");
  w.Sample({}, c.log_bytes);
  if (retention.options().max_disk_bytes > 0) {  // only with --max-disk
    w.Family("lockstep_retention_max_disk_bytes", C::kGauge, "The --max-disk limit on the run logs.");
    w.Sample({}, retention.options().max_disk_bytes);
  }
  w.Family("lockstep_retention_over_max_disk", C::kGauge,
           "1 when the run logs were over --max-disk at the end of the last pass (every closed segment "
           "thinned: the max_disk alert), else 0.");
  w.Sample({}, c.over_max_disk ? 1.0 : 0.0);
  w.Family("lockstep_retention_pass_duration_seconds", C::kSummary,
           "Wall time of the retention passes over the data dir (scan and thinning); _count is the passes.");
  w.SampleSuffix("_sum", {}, c.pass_seconds);
  w.SampleSuffix("_count", {}, static_cast<double>(c.passes));
  w.Family("lockstep_retention_thinned_segments_total", C::kCounter, "Closed run log segments thinned.");
  w.Sample({}, c.segments_thinned);
  w.Family("lockstep_retention_hollowed_messages_total", C::kCounter,
           "Tensor statistics (StepStats) messages emptied by thinning (their step keeps its scalars).");
  w.Sample({}, c.messages_dropped);
  w.Family("lockstep_retention_reclaimed_bytes_total", C::kCounter,
           "Bytes the thinned segments gave back (their size before minus after).");
  w.Sample({}, c.bytes_reclaimed);
  w.Family("lockstep_retention_compaction_failures_total", C::kCounter,
           "Segments a pass could not thin (a full disk: the compaction_failed alert); retried later.");
  w.Sample({}, c.failures);
  w.Family("lockstep_retention_stalled_pairs", C::kGauge,
           "Pairs that stopped comparing while their runs wrote on: they no longer hold the window of "
           "their runs (as of the last pass).");
  w.Sample({}, c.stalled_pairs);
  w.Family("lockstep_retention_incident_kept_steps", C::kGauge,
           "Steps the incident neighbourhoods keep in full, by experiment (retention.keep).");
  for (const auto& [experiment, steps] : retention.IncidentSteps())
    w.Sample({{"experiment", experiment}}, steps);
}

}  // namespace

CollectorMetrics::CollectorMetrics(MetricsSources sources, const Clock* clock)
    : src_(sources), clock_(RealClockOr(clock)), start_unix_ns_(clock_->NowUnixNs()) {}

void CollectorMetrics::Tick() {
  auto c = src_.collector->counters();
  auto now = SteadyNow();
  window_.push_back({now, c.accepted, c.records, c.bytes});
  // Keep one sample at or beyond the window's start, so the rate spans the full window.
  while (window_.size() > 2 && now - window_[1].t >= kRateWindow) window_.pop_front();
}

std::string CollectorMetrics::Render() {
  TextWriter w;
  const auto counters = src_.collector->counters();
  const auto ranks = src_.collector->registry().Snapshot();
  const int64_t now_ns = clock_->NowUnixNs();
  RenderIngestMetrics(w, *src_.collector, counters, start_unix_ns_);
  RenderRates(w, counters);
  RenderRankMetrics(w, ranks, now_ns);
  if (src_.feed != nullptr) RenderFeedMetrics(w, *src_.feed);
  if (src_.analyzer != nullptr) RenderAnalyzerMetrics(w, *src_.analyzer);
  if (src_.dispatcher != nullptr) RenderAlertSinkMetrics(w, *src_.dispatcher);
  if (src_.retention != nullptr) RenderRetentionMetrics(w, *src_.retention);
  return w.Take();
}

void CollectorMetrics::RenderRates(TextWriter& w, const CollectorCounters& counters) const {
  // Rates over the last kRateWindow (up to); 0 before the first tick.
  double msg_rate = 0, rec_rate = 0, byte_rate = 0;
  if (!window_.empty()) {
    const auto& o = window_.front();
    double dt = std::chrono::duration<double>(SteadyNow() - o.t).count();
    if (dt > 0.05) {
      msg_rate = static_cast<double>(counters.accepted - o.messages) / dt;
      rec_rate = static_cast<double>(counters.records - o.records) / dt;
      byte_rate = static_cast<double>(counters.bytes - o.bytes) / dt;
    }
  }
  w.Family("lockstep_collector_messages_per_second", C::kGauge,
           "Accepted messages per second over the last 10 s (rate() of lockstep_collector_messages_total is the Prometheus way).");
  w.Sample({}, msg_rate);
  w.Family("lockstep_collector_records_per_second", C::kGauge, "Accepted records per second over the last 10 s.");
  w.Sample({}, rec_rate);
  w.Family("lockstep_collector_logged_bytes_per_second", C::kGauge, "Bytes appended to the run logs per second over the last 10 s.");
  w.Sample({}, byte_rate);
}

StatusOr<std::unique_ptr<MetricsServer>> StartCollectorMetrics(
    const std::string& listen, MetricsSources sources,
    std::function<bool(std::string_view, std::string*, std::string*)> page,
    std::function<int(std::string_view, std::string*)> action) {
  auto m = std::make_shared<CollectorMetrics>(sources);
  m->Tick();  // the rate window starts now
  MetricsServerHandlers h;
  h.render = [m] { return m->Render(); };
  h.tick = [m] { m->Tick(); };
  h.page = std::move(page);
  h.action = std::move(action);
  return MetricsServer::Start(listen, std::move(h));
}

}  // namespace lockstep::collector::metrics
