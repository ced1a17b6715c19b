// Collector: the ingest side of `lockstep collect`, usable in-process by tests and
// benches.
//
//   auto c = Collector::Create(options);      // makes the data dir, rebuilds the
//   if (!c.ok()) ...;                         // registry from its logs, binds sockets
//   (*c)->AddSink(&aligner);                  // optional, before Start()
//   (*c)->Start();                            // starts the ingest thread
//   ... (*c)->counters(), (*c)->registry().Snapshot(), (*c)->endpoints() ...
//   (*c)->Shutdown(std::chrono::seconds(5));  // drain, flush, fsync, join
//
// One ingest thread owns the ZeroMQ PULL socket (bound in Create() on the caller's
// thread, handed over at Start()). For each message it checks size, file identifier,
// schema major, flatbuffers Verifier and run id (lockstep/common/envelope_check.h); a bad one is
// counted by reason, logged rate-limited (one line per reason per second) and never
// stops ingest. With CURVE (options.curve) only agents that pass the handshake get this
// far (src/ingest/curve_guard.h). A good one is appended to `<data_dir>/<run>.lslog` (runlog/), counted
// in the registry (lockstep/collector/registry.h), then given to every MessageSink in the order
// they were added — on the ingest thread, so a sink must not block. A second process
// claiming a live run id with another role is refused first (ingest/run_claims.h).
//
// Log writes are buffered and handed to the kernel whenever the socket runs dry; an
// fdatasync follows every `fsync_interval_ms` and at shutdown.
//
// Thread-safety: Create/AddSink/Start/Shutdown from one controlling thread;
// counters(), registry(), endpoints(), health(), Request(), requests() from any thread.
//
// The same thread owns the control socket (an XPUB, --control-listen): it publishes
// the open requests (ingest/control_requests.h) between bursts, and an agent's answer
// (wire ControlAck) arrives on the ingest socket like any message, logged first.
#ifndef LOCKSTEP_COLLECTOR_COLLECTOR_H_
#define LOCKSTEP_COLLECTOR_COLLECTOR_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/collector/control.h"
#include "lockstep/collector/curve_options.h"
#include "lockstep/collector/message_sink.h"
#include "lockstep/collector/registry.h"
#include "lockstep/common/envelope_check.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/status.h"
#include "lockstep/common/wire.h"

namespace lockstep::collector {

struct CollectorOptions {
  // ZeroMQ endpoints to bind, e.g. "tcp://127.0.0.1:6200", "tcp://127.0.0.1:*" (an
  // ephemeral port: read endpoints()), "ipc:///tmp/ls.sock". Non-loopback TCP binds
  // are allowed with a warning.
  std::vector<std::string> listen{"tcp://127.0.0.1:6200"};
  std::string data_dir = "./lockstep-data";  // created if missing
  size_t max_message_bytes = kMaxMessageBytes;
  // fdatasync period for the logs; 0 = after every burst of messages.
  int64_t fsync_interval_ms = 1000;
  size_t write_buffer_bytes = 256 << 10;  // per run log
  // New run logs in zstd blocks (docs/runlog.md); false: plain records (format 1).
  bool compress_logs = true;
  // A run's log is closed into a segment once it holds this many bytes, so that
  // retention can thin the closed ones (docs/runlog.md "Segments and retention");
  // 0 = one file per run.
  uint64_t segment_bytes = 0;
  int receive_hwm = 100000;               // ZMQ_RCVHWM, messages
  bool rebuild_from_logs = true;          // replay existing logs into the registry
  // ZeroMQ CURVE on the ingest socket (docs/security.md): off while secret_key is empty.
  CurveServerOptions curve;
  // Called on the ingest thread when writing the run logs starts failing (failing =
  // true, with the error: disk full...) and when a write works again (false, with a
  // summary). Ingest goes on either way; must not block (e.g. Dispatcher::Submit).
  std::function<void(bool failing, const std::string& message)> on_log_health;
  // Writing counts as working again after this long without a failure (a nearly full
  // disk lets small writes through between failures).
  int64_t log_recover_quiet_ms = 5000;
  // The control socket (docs/design.md "The control channel"): an XPUB agents connect
  // to for requests (zoom, capture), with the ingest socket's CURVE settings. "auto":
  // derived from the first --listen endpoint (lockstep/common/control_endpoint.h:
  // tcp port + 2, ipc path + ".control"); "" : none.
  std::string control_listen = "auto";
  int64_t control_republish_ms = 1000;  // an unanswered request goes out again this often
  int64_t control_expire_ms = 120000;   // and is given up after this long
  // Called on the ingest thread with a request as it stands after each answer an agent
  // gave it (`run` answered). Must not block.
  std::function<void(const std::string& run, const ControlRequestState& request)> on_control_answer;
  // Stamps each message's receive time (NowUnixNs); null: the real clock. A test's
  // FakeClock must outlive the collector.
  const Clock* clock = nullptr;
};

struct CollectorCounters {
  uint64_t received = 0;   // frames taken off the socket
  uint64_t accepted = 0;   // passed every check
  uint64_t records = 0;    // tensor stat + step scalar records in accepted messages
  uint64_t bytes = 0;      // bytes of accepted messages
  uint64_t rejected = 0;   // sum of rejected_by
  uint64_t rejected_by[static_cast<size_t>(Reject::kCount)] = {};
  uint64_t log_errors = 0;        // appends/flushes/fsyncs that failed (disk full...)
  uint64_t log_lost_records = 0;  // accepted messages that never reached the disk
  uint64_t sink_errors = 0;       // exceptions thrown by sinks (caught)
  uint64_t fsyncs = 0;
  uint64_t rebuilt_messages = 0;  // replayed from logs at start-up
  AuthCounters auth;              // CURVE handshakes (all zero when CURVE is off)
  // The control channel: requests made (Request()), frames published (each request is
  // published again until answered), agents' answers by status (kAnswerStatusNames)
  // and those carrying a capture's own replay.
  uint64_t control_requests = 0, control_publications = 0, control_replays = 0;
  uint64_t control_answers_by[kAnswerStatusCount] = {};
};

class Collector {
 public:
  // InvalidArgument for a malformed endpoint, Unavailable when it is in use or when
  // another Collector holds the data dir (an flock on <data_dir>/.lockstep-collect.lock,
  // held until destruction), IOError when the data dir cannot be created or written. Each with one sentence that names
  // the endpoint or directory.
  static StatusOr<std::unique_ptr<Collector>> Create(CollectorOptions options);
  ~Collector();  // Shutdown(5 s) if still running
  Collector(const Collector&) = delete;
  Collector& operator=(const Collector&) = delete;

  // Not owned; must outlive Shutdown(). Only before Start().
  Status AddSink(MessageSink* sink);
  Status Start();
  // Stops taking new work, drains what is already queued in the socket (until
  // `timeout`), flushes and fsyncs every log, joins the thread. Idempotent. Timeout
  // when messages were still queued at the deadline; the ingest thread's failure
  // otherwise.
  Status Shutdown(std::chrono::milliseconds timeout);

  CollectorCounters counters() const;
  const Registry& registry() const;
  // The bound endpoints, with ephemeral ports resolved ("tcp://127.0.0.1:41234").
  const std::vector<std::string>& endpoints() const;
  // The collector's CURVE public key (Z85) when CURVE is on, else empty.
  std::string curve_public_key() const;
  const CollectorOptions& options() const;

  // The control channel. Request() queues a request to agents (any thread; published
  // by the ingest thread within ~50 ms) and returns its id, or 0 when there is no
  // control socket. requests(): every request of this session and its answers.
  // control_endpoint(): the bound address ("" when none).
  uint64_t Request(ControlRequestSpec spec);
  std::vector<ControlRequestState> requests() const;
  const std::string& control_endpoint() const;
  // OK while the ingest thread is healthy; its error once it died (e.g. an
  // unexpected ZeroMQ error).
  Status health() const;

  class Impl;

 private:
  explicit Collector(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// True for "tcp://127.x.x.x:P", "tcp://localhost:P", "tcp://[::1]:P", ipc:// and
// inproc://; false for anything reachable from other hosts ("tcp://*:P",
// "tcp://0.0.0.0:P", a LAN address).
bool IsLoopbackEndpoint(const std::string& endpoint);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_COLLECTOR_H_
