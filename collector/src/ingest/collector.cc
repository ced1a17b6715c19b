#include "lockstep/collector/collector.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "ingest/control_requests.h"
#include "ingest/curve_guard.h"
#include "ingest/run_claims.h"
#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_format.h"
#include "runlog/segments.h"
#include "runlog/log_writer.h"
#include "lockstep/common/control_endpoint.h"
#include "lockstep/common/thread_name.h"

namespace lockstep::collector {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Single writer (the ingest thread), many readers: a relaxed load+store is enough and
// avoids a locked instruction per message.
inline void Bump(std::atomic<uint64_t>& a, uint64_t n = 1) {
  a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// One log line per key per second; the next line says how many were held back.
class RateLimiter {
 public:
  // Returns true when a line may be written now; *suppressed = lines held back since.
  bool Allow(size_t key, uint64_t* suppressed) {
    auto now = Clock::now();
    Slot& s = slots_[key % kSlots];
    if (now - s.last < std::chrono::seconds(1) && s.last != Clock::time_point{}) {
      ++s.suppressed;
      return false;
    }
    *suppressed = s.suppressed;
    s.suppressed = 0;
    s.last = now;
    return true;
  }

 private:
  static constexpr size_t kSlots = 16;
  struct Slot {
    Clock::time_point last{};
    uint64_t suppressed = 0;
  };
  Slot slots_[kSlots];
};

enum LogKey : size_t { kKeyLogError = static_cast<size_t>(Reject::kCount), kKeySinkError, kKeyControlError };

uint64_t RecordsIn(const wire::Envelope& env) {
  switch (env.body_type()) {
    case wire::Body::StepStats: {
      const auto* s = env.body_as_StepStats()->stats();
      return s ? s->size() : 0;
    }
    case wire::Body::StepScalars: return 1;
    default: return 0;
  }
}

}  // namespace

bool IsLoopbackEndpoint(const std::string& ep) {
  if (ep.rfind("ipc://", 0) == 0 || ep.rfind("inproc://", 0) == 0) return true;
  if (ep.rfind("tcp://", 0) != 0) return false;
  std::string host = ep.substr(6);
  // "tcp://iface;host:port" binds are not meant for us; take the part after ';'.
  if (auto semi = host.find(';'); semi != std::string::npos) host = host.substr(semi + 1);
  auto colon = host.rfind(':');
  if (colon != std::string::npos) host = host.substr(0, colon);
  return host == "localhost" || host == "[::1]" || host == "::1" || host.rfind("127.", 0) == 0;
}

class Collector::Impl {
 public:
  explicit Impl(CollectorOptions o)
      : opts(std::move(o)), clock(RealClockOr(opts.clock)), ctx(1), socket(ctx, zmq::socket_type::pull) {}
  ~Impl() {
    if (lock_fd >= 0) ::close(lock_fd);  // releases the data dir's lock
  }

  Status Init();
  Status Rebuild();
  void Run();  // ingest thread entry
  size_t DrainBurst(size_t max);
  void Handle(const zmq::message_t& msg);
  LogWriter* WriterFor(std::string_view run);
  void FlushAll();
  void SyncAll();
  void LogIoError(const Status& s);
  void LogWriteOk();
  Status BindControl();
  void PublishControl();

  CollectorOptions opts;
  const lockstep::Clock* clock;  // opts.clock or the real one (Clock here is steady_clock)
  int lock_fd = -1;
  zmq::context_t ctx;
  zmq::socket_t socket;
  std::unique_ptr<CurveGuard> guard;  // after ctx and socket: closed before them
  zmq::socket_t control;              // the control XPUB, or empty (ingest thread after Start)
  std::string control_endpoint;
  std::unique_ptr<ControlRequests> requests;  // null without a control socket
  std::vector<std::string> endpoints;
  std::vector<MessageSink*> sinks;
  Registry registry;
  RunClaims claims;  // ingest thread
  std::thread thread;
  bool started = false, stopped = false;
  std::atomic<bool> stop{false};
  Clock::time_point drain_deadline{};
  bool drain_timed_out = false;

  mutable std::mutex health_mu;
  Status health;

  // Ingest-thread state.
  std::unordered_map<std::string, std::unique_ptr<LogWriter>, StringHash, std::equal_to<>> writers;
  std::vector<LogWriter*> unflushed;  // writers with buffered records
  std::unordered_map<std::string, bool, StringHash, std::equal_to<>> recovered;  // at start-up
  std::vector<uint8_t> scratch;       // aligned copy of a misaligned frame
  zmq::message_t msg;
  RateLimiter limiter;
  // Log-write health (disk full): one error line and on_log_health(true) when writes
  // start failing; one info line and on_log_health(false) once writes have worked for
  // opts.log_recover_quiet_ms with no failure. A nearly full disk lets small writes
  // through between failures: without that quiet period the two lines would alternate.
  // Repeats in between: one line a minute.
  bool log_failing = false;
  Clock::time_point failing_since{}, last_failing_line{}, last_failure{};
  uint64_t lost_at_failure = 0;
  uint64_t round_failures = 0;  // failures since the last FlushAll round

  struct {
    std::atomic<uint64_t> received{0}, accepted{0}, records{0}, bytes{0}, rejected{0};
    std::atomic<uint64_t> rejected_by[static_cast<size_t>(Reject::kCount)] = {};
    std::atomic<uint64_t> log_errors{0}, log_lost{0}, sink_errors{0}, fsyncs{0}, rebuilt{0};
    std::atomic<uint64_t> control_requests{0}, control_publications{0}, control_replays{0};
    std::atomic<uint64_t> control_answers_by[kAnswerStatusCount] = {};
  } n;
};

Status Collector::Impl::Init() {
  if (opts.listen.empty())
    return Status::InvalidArgument("no endpoint to listen on: give --listen at least once");
  if (opts.max_message_bytes == 0 || opts.max_message_bytes > runlog::kMaxRecordBytes)
    return Status::InvalidArgument("--max-message-bytes must be between 1 and " +
                                   std::to_string(runlog::kMaxRecordBytes));
  // The data dir: created, and proven writable with a probe file (whose leading dot
  // cannot collide with a run id).
  std::error_code ec;
  fs::create_directories(opts.data_dir, ec);
  if (ec)
    return Status::IOError("cannot create the data dir '" + opts.data_dir + "': " + ec.message() +
                           "; pass --data-dir a directory you can write");
  // One collector per data dir: two would interleave appends and cut each other's
  // "torn" tails. flock() is released by the kernel however the holder dies.
  std::string lock_path = opts.data_dir + "/.lockstep-collect.lock";
  lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0)
    return Status::IOError("cannot write to the data dir '" + opts.data_dir + "': " +
                           std::strerror(errno) + "; pass --data-dir a directory you can write");
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0)
    return Status::Unavailable("the data dir '" + opts.data_dir +
                               "' is in use by another 'lockstep collect'; give each collector "
                               "its own --data-dir");
  std::string probe = opts.data_dir + "/.lockstep-write-test";
  {
    std::ofstream f(probe);
    if (!f || !(f << "x") || !(f.flush())) {
      return Status::IOError("cannot write to the data dir '" + opts.data_dir + "': " +
                             std::strerror(errno) + "; pass --data-dir a directory you can write");
    }
  }
  fs::remove(probe, ec);

  try {
    socket.set(zmq::sockopt::rcvhwm, opts.receive_hwm);
    socket.set(zmq::sockopt::linger, 0);
    // Far beyond the cap ZeroMQ drops the connection instead of buffering the frame:
    // bounded memory against a runaway peer. Between 1x and 4x the cap a message is
    // received, counted as oversized and logged.
    socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(opts.max_message_bytes) * 4);
  } catch (const zmq::error_t& e) {
    return Status::Internal(std::string("cannot configure the ZeroMQ socket: ") + e.what());
  }
  if (!opts.curve.secret_key.empty()) {
    auto g = CurveGuard::Create(ctx, socket, opts.curve);
    if (!g.ok()) return g.status();
    guard = std::move(*g);
  }
  for (const auto& ep : opts.listen) {
    try {
      socket.bind(ep);
    } catch (const zmq::error_t& e) {
      if (e.num() == EADDRINUSE)
        return Status::Unavailable("cannot listen on '" + ep +
                                   "': the address is in use (another collector?); pick another "
                                   "port with --listen");
      return Status::InvalidArgument("cannot listen on '" + ep + "': " + e.what() +
                                     "; an endpoint looks like tcp://127.0.0.1:6200");
    }
    std::string bound = socket.get(zmq::sockopt::last_endpoint);
    endpoints.push_back(bound);
    if (!IsLoopbackEndpoint(bound) && guard == nullptr)
      spdlog::warn(
          "listening on {} which other hosts can reach: anyone who can connect can write run "
          "logs here (no --curve-key: no authentication); bind tcp://127.0.0.1:PORT or turn on "
          "CURVE (docs/security.md)",
          bound);
    else if (!IsLoopbackEndpoint(bound) && !guard->restricts_agents())
      spdlog::warn(
          "listening on {} with CURVE but no --curve-authorized-keys: any agent that holds the "
          "collector's public key may write run logs here",
          bound);
  }
  LOCKSTEP_RETURN_IF_ERROR(BindControl());
  if (opts.rebuild_from_logs) LOCKSTEP_RETURN_IF_ERROR(Rebuild());
  return Status::OK();
}

Status Collector::Impl::BindControl() {
  std::string ep = opts.control_listen;
  if (ep == "auto") ep = endpoints.empty() ? std::string() : ControlEndpointFor(endpoints.front());
  if (ep.empty() || ep == "off") return Status::OK();
  try {
    control = zmq::socket_t(ctx, zmq::socket_type::xpub);
    control.set(zmq::sockopt::linger, 0);
    control.set(zmq::sockopt::sndhwm, 64);
    control.set(zmq::sockopt::xpub_verbose, 1);  // every subscription: a late agent gets the open requests at once
    if (guard != nullptr) {
      // The ingest socket's ZAP handler serves this context: the same agents are let in.
      control.set(zmq::sockopt::curve_server, true);
      control.set(zmq::sockopt::curve_secretkey, opts.curve.secret_key);
      control.set(zmq::sockopt::zap_domain, "lockstep");
    }
    control.bind(ep);
    control_endpoint = control.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    control = zmq::socket_t();
    if (opts.control_listen == "auto") {
      // The derived address is a convenience: taken (another collector's), the
      // collector runs without a control channel, and says so.
      spdlog::warn("no control channel: cannot serve it on '{}' ({}); agents get no zoom or capture "
                   "requests (give --control-listen another address)",
                   ep, e.what());
      return Status::OK();
    }
    if (e.num() == EADDRINUSE)
      return Status::Unavailable("cannot serve the control channel on '" + ep +
                                 "': the address is in use (another collector?); pick another with "
                                 "--control-listen, or --control-listen off");
    return Status::InvalidArgument("cannot serve the control channel on '" + ep + "': " + e.what() +
                                   " (--control-listen expects e.g. tcp://127.0.0.1:6202, or off)");
  }
  if (!IsLoopbackEndpoint(control_endpoint) && guard == nullptr)
    spdlog::warn("the control channel listens on {} which other hosts can reach, without CURVE: anyone "
                 "who connects can read the requests sent to agents (module names)",
                 control_endpoint);
  requests = std::make_unique<ControlRequests>(
      opts.control_republish_ms * 1000000, opts.control_expire_ms * 1000000, [this](const std::string& run) {
        uint32_t world = 0;
        for (const RankInfo& r : registry.Snapshot())
          if (r.run == run) world = std::max(world, r.world_size);
        return world;
      });
  return Status::OK();
}

void Collector::Impl::PublishControl() {
  if (requests == nullptr) return;
  // XPUB hands up each subscription (first byte 1) and unsubscription (0).
  bool subscribed = false;
  zmq::message_t sub;
  try {
    while (control.recv(sub, zmq::recv_flags::dontwait)) {
      if (sub.size() > 0 && static_cast<const uint8_t*>(sub.data())[0] == 1) subscribed = true;
    }
    for (const std::string& frame : requests->Due(clock->NowUnixNs(), subscribed)) {
      control.send(zmq::buffer(frame), zmq::send_flags::dontwait);  // a full agent queue drops: sent again later
      Bump(n.control_publications);
    }
  } catch (const zmq::error_t& e) {
    // A signal (EINTR) or a failing control socket must not stop ingest: what was not
    // published goes out at a later turn (requests are published until answered).
    if (e.num() != EINTR) {
      uint64_t held = 0;
      if (limiter.Allow(kKeyControlError, &held)) spdlog::warn("the control channel: {}", e.what());
    }
  }
}

Status Collector::Impl::Rebuild() {
  std::error_code ec;
  uint64_t files = 0, messages = 0, skipped = 0;
  if (!fs::is_directory(opts.data_dir, ec))
    return Status::IOError("cannot list the data dir '" + opts.data_dir + "': " +
                           (ec ? ec.message() : std::string("not a directory")));
  for (const std::string& run : runlog::ListRunLogs(opts.data_dir)) {
    const std::string head = runlog::LogPathFor(opts.data_dir, run);
    auto count = [&](const LogReader::Record& r) {
      EnvelopeCheck c = CheckEnvelope(r.data, r.size, runlog::kMaxRecordBytes);
      if (c.reject != Reject::kNone) {
        ++skipped;
        return;
      }
      registry.OnMessage(*c.env, r.recv_unix_ns, r.size);
      ++messages;
    };
    // Closed segments first (complete: never cut), then the open file, whose torn tail
    // is cut. A collector killed while it rotated left no open file: a new one is made.
    for (const auto& seg : runlog::ListSegments(head)) {
      auto sr = LogReader::OpenFile(seg.path);
      if (!sr.ok()) {
        spdlog::error("{} (skipped)", sr.status().message());
        continue;
      }
      LogReader::Record r;
      while ((*sr)->Next(&r) == LogReader::Result::kRecord) count(r);
    }
    if (!fs::exists(head, ec)) {
      auto w = LogWriter::Open(head, /*recover=*/false, 4096, opts.compress_logs);
      if (!w.ok()) spdlog::error("{} (skipped)", w.status().message());
    }
    auto rec = LogWriter::Recover(head, count);
    if (!rec.ok()) {
      // Not fatal: this run's new messages will fail to open the same file and be
      // counted as log errors, the other runs go on.
      spdlog::error("{} (skipped)", rec.status().message());
      continue;
    }
    recovered.emplace(run, true);
    ++files;
  }
  n.rebuilt.store(messages, std::memory_order_relaxed);
  if (files > 0)
    spdlog::info("rebuilt the registry from {} run logs in {} ({} messages{})", files,
                 opts.data_dir, messages,
                 skipped ? ", " + std::to_string(skipped) + " unreadable records skipped" : "");
  return Status::OK();
}

LogWriter* Collector::Impl::WriterFor(std::string_view run) {
  auto it = writers.find(run);
  if (it != writers.end()) return it->second.get();
  std::string path = runlog::LogPathFor(opts.data_dir, run);
  bool known = recovered.find(run) != recovered.end();
  auto w = LogWriter::Open(path, /*recover=*/!known, opts.write_buffer_bytes, opts.compress_logs);
  if (!w.ok()) {
    LogIoError(w.status());
    return nullptr;
  }
  (*w)->SetSegmentBytes(opts.segment_bytes);
  return writers.emplace(std::string(run), std::move(*w)).first->second.get();
}

void Collector::Impl::LogIoError(const Status& s) {
  Bump(n.log_errors);
  ++round_failures;
  const auto now = Clock::now();
  last_failure = now;
  if (!log_failing) {
    log_failing = true;
    failing_since = last_failing_line = now;
    lost_at_failure = n.log_lost.load(std::memory_order_relaxed);
    std::string msg = fmt::format(
        "cannot write the run logs in {}: {}; ingest goes on (messages are still verified, "
        "counted and analyzed; those not written are counted as log_lost_records) and "
        "writing resumes when space returns",
        opts.data_dir, s.message());
    spdlog::error("{}", msg);
    if (opts.on_log_health) opts.on_log_health(true, msg);
    return;
  }
  if (now - last_failing_line >= std::chrono::minutes(1)) {
    last_failing_line = now;
    spdlog::error("still cannot write the run logs in {} ({:.0f} s): {}; {} messages not recorded so far",
                  opts.data_dir, std::chrono::duration<double>(now - failing_since).count(), s.message(),
                  n.log_lost.load(std::memory_order_relaxed) - lost_at_failure);
  }
}

void Collector::Impl::LogWriteOk() {
  if (!log_failing || round_failures != 0 ||
      Clock::now() - last_failure < std::chrono::milliseconds(opts.log_recover_quiet_ms))
    return;
  log_failing = false;
  std::string msg = fmt::format(
      "writing the run logs in {} again after {:.1f} s; {} messages were not recorded meanwhile "
      "(gaps in their logs' sequence numbers)",
      opts.data_dir, std::chrono::duration<double>(Clock::now() - failing_since).count(),
      n.log_lost.load(std::memory_order_relaxed) - lost_at_failure);
  spdlog::info("{}", msg);
  if (opts.on_log_health) opts.on_log_health(false, msg);
}

void Collector::Impl::Handle(const zmq::message_t& m) {
  Bump(n.received);
  const auto* data = static_cast<const uint8_t*>(m.data());
  size_t size = m.size();
  // ZeroMQ may hand out a frame at any offset of its receive buffer; the verifier
  // (and flatbuffers' accessors) want 8-byte alignment. Copy into a reused buffer.
  if ((reinterpret_cast<uintptr_t>(data) & 7) != 0 && size <= opts.max_message_bytes) {
    if (scratch.size() < size) scratch.resize(size);
    std::memcpy(scratch.data(), data, size);
    data = scratch.data();
  }
  EnvelopeCheck c = CheckEnvelope(data, size, opts.max_message_bytes);
  int64_t now = clock->NowUnixNs();
  if (c.reject != Reject::kNone) {
    Bump(n.rejected);
    Bump(n.rejected_by[static_cast<size_t>(c.reject)]);
    std::string who;
    if (c.env != nullptr && c.env->run_id() != nullptr) {
      std::string_view run(c.env->run_id()->c_str(), c.env->run_id()->size());
      if (IsValidRunId(run)) {
        registry.OnBad(run, c.env->rank());
        who = fmt::format(" from run '{}' rank {}", run, c.env->rank());
      }
    }
    uint64_t held = 0;
    if (limiter.Allow(static_cast<size_t>(c.reject), &held))
      spdlog::warn("refused a message{}: {} ({}: {} so far{})", who,
                   DescribeReject(c, size, opts.max_message_bytes), RejectName(c.reject),
                   n.rejected_by[static_cast<size_t>(c.reject)].load(std::memory_order_relaxed),
                   held ? fmt::format(", {} not logged", held) : "");
    return;
  }
  const wire::Envelope& env = *c.env;
  std::string_view run(env.run_id()->c_str(), env.run_id()->size());
  // A second job under a live run id with another role: its data stays out.
  std::string claim_error;
  if (claims.Refuse(env, now, &claim_error)) {
    Bump(n.rejected);
    Bump(n.rejected_by[static_cast<size_t>(Reject::kRunClaimed)]);
    if (!claim_error.empty()) spdlog::error("{}", claim_error);
    return;
  }
  // The log first: it is the truth that restarts and replays rebuild from.
  if (LogWriter* w = WriterFor(run)) {
    bool was_empty = !w->has_buffered();
    uint64_t lost_before = w->lost_records();
    Status s = w->Append(data, static_cast<uint32_t>(size), now);
    if (!s.ok()) LogIoError(s);
    if (w->lost_records() != lost_before) Bump(n.log_lost, w->lost_records() - lost_before);
    if (was_empty && w->has_buffered()) unflushed.push_back(w);
  } else {
    Bump(n.log_lost);
  }
  registry.OnMessage(env, now, size);
  if (env.body_type() == wire::Body::ControlAck) {
    const auto* ack = env.body_as_ControlAck();
    Bump(n.control_answers_by[std::min<size_t>(static_cast<size_t>(ack->status()), kAnswerStatusCount - 1)]);
    if (ack->replay() != nullptr) Bump(n.control_replays);
  }
  if (env.body_type() == wire::Body::ControlAck && requests != nullptr) {
    ControlRequestState now_state;
    const std::string run_id(run);
    if (requests->OnAnswer(run_id, env.rank(), *env.body_as_ControlAck(), &now_state, env.schema_minor()) &&
        opts.on_control_answer)
      opts.on_control_answer(run_id, now_state);
  }
  Bump(n.accepted);
  Bump(n.records, RecordsIn(env));
  Bump(n.bytes, size);
  for (MessageSink* sink : sinks) {
    try {
      sink->OnMessage(env, now);
    } catch (const std::exception& e) {
      Bump(n.sink_errors);
      uint64_t held = 0;
      if (limiter.Allow(kKeySinkError, &held)) spdlog::error("a message sink failed: {}", e.what());
    } catch (...) {
      Bump(n.sink_errors);
    }
  }
}

size_t Collector::Impl::DrainBurst(size_t max) {
  size_t got = 0;
  while (got < max) {
    try {
      if (!socket.recv(msg, zmq::recv_flags::dontwait)) break;  // EAGAIN: ran dry
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) break;  // a signal; the loop comes back
      throw;
    }
    Handle(msg);
    ++got;
  }
  return got;
}

void Collector::Impl::FlushAll() {
  if (unflushed.empty()) return;
  bool wrote = false;
  for (LogWriter* w : unflushed) {
    uint64_t lost_before = w->lost_records();
    Status s = w->Flush();
    if (!s.ok()) LogIoError(s);
    wrote |= s.ok();
    if (w->lost_records() != lost_before) Bump(n.log_lost, w->lost_records() - lost_before);
  }
  unflushed.clear();
  if (wrote) LogWriteOk();
  round_failures = 0;  // failures since the last round (appends, opens, flushes)
}

void Collector::Impl::SyncAll() {
  FlushAll();
  for (auto& [run, w] : writers) {
    if (!w->dirty()) continue;
    Status s = w->Sync();
    if (!s.ok()) LogIoError(s);
    Bump(n.fsyncs);
  }
}

void Collector::Impl::Run() {
  constexpr size_t kBurst = 4096;
  try {
    zmq::pollitem_t items[2] = {{socket.handle(), 0, ZMQ_POLLIN, 0}, {control.handle(), 0, ZMQ_POLLIN, 0}};
    const int polled = requests != nullptr ? 2 : 1;
    const auto period = std::chrono::milliseconds(opts.fsync_interval_ms);
    auto next_sync = Clock::now() + period;
    while (!stop.load(std::memory_order_acquire)) {
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_sync - Clock::now());
      // Bounded so a stop request is seen within 50 ms.
      wait = std::clamp(wait, std::chrono::milliseconds(0), std::chrono::milliseconds(50));
      try {
        zmq::poll(items, polled, wait);
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) throw;
      }
      size_t got = DrainBurst(kBurst);
      PublishControl();
      // A full burst means more is waiting: keep the buffers filling. Otherwise the
      // socket ran dry and the kernel gets what we have.
      if (got < kBurst) FlushAll();
      if (Clock::now() >= next_sync || (opts.fsync_interval_ms == 0 && got > 0)) {
        SyncAll();
        next_sync = Clock::now() + period;
      }
    }
    // Shutdown: take what is already queued, within the deadline.
    while (DrainBurst(kBurst) == kBurst) {
      if (Clock::now() >= drain_deadline) {
        drain_timed_out = true;
        break;
      }
    }
    SyncAll();
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(health_mu);
    health = Status::Internal(std::string("the ingest thread stopped: ") + e.what());
    spdlog::error("{}", health.message());
  }
  try {
    SyncAll();
    writers.clear();  // closes the files
    socket.close();
    if (requests != nullptr) control.close();
  } catch (...) {
  }
}

StatusOr<std::unique_ptr<Collector>> Collector::Create(CollectorOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  Status s = impl->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<Collector>(new Collector(std::move(impl)));
}

Collector::Collector(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Collector::~Collector() {
  Status s = Shutdown(std::chrono::seconds(5));
  if (!s.ok()) spdlog::warn("collector shutdown: {}", s.message());
}

Status Collector::AddSink(MessageSink* sink) {
  if (impl_->started) return Status::InvalidArgument("AddSink() after Start()");
  if (sink != nullptr) impl_->sinks.push_back(sink);
  return Status::OK();
}

Status Collector::Start() {
  if (impl_->started) return Status::InvalidArgument("Start() called twice");
  impl_->started = true;
  if (impl_->guard) impl_->guard->Start();
  // The socket was bound on this thread; std::thread's start is the full memory
  // barrier ZeroMQ asks for when a socket changes threads.
  impl_->thread = std::thread([this] {
    SetCurrentThreadName("ls-ingest");
    impl_->Run();
  });
  return Status::OK();
}

Status Collector::Shutdown(std::chrono::milliseconds timeout) {
  if (impl_->stopped) return health();
  impl_->stopped = true;
  if (!impl_->started) {
    impl_->socket.close();
    if (impl_->requests != nullptr) impl_->control.close();
    if (impl_->guard) impl_->guard->Stop();
    return Status::OK();
  }
  impl_->drain_deadline = Clock::now() + timeout;
  impl_->stop.store(true, std::memory_order_release);
  impl_->thread.join();
  if (impl_->guard) impl_->guard->Stop();
  Status h = health();
  if (!h.ok()) return h;
  if (impl_->drain_timed_out)
    return Status::Timeout("messages were still queued when the shutdown deadline passed");
  return Status::OK();
}

CollectorCounters Collector::counters() const {
  auto& n = impl_->n;
  CollectorCounters c;
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  c.received = ld(n.received);
  c.accepted = ld(n.accepted);
  c.records = ld(n.records);
  c.bytes = ld(n.bytes);
  c.rejected = ld(n.rejected);
  for (size_t i = 0; i < static_cast<size_t>(Reject::kCount); ++i) c.rejected_by[i] = ld(n.rejected_by[i]);
  c.log_errors = ld(n.log_errors);
  c.log_lost_records = ld(n.log_lost);
  c.sink_errors = ld(n.sink_errors);
  c.fsyncs = ld(n.fsyncs);
  c.rebuilt_messages = ld(n.rebuilt);
  c.control_requests = ld(n.control_requests);
  c.control_publications = ld(n.control_publications);
  c.control_replays = ld(n.control_replays);
  for (size_t i = 0; i < kAnswerStatusCount; ++i) c.control_answers_by[i] = ld(n.control_answers_by[i]);
  if (impl_->guard) c.auth = impl_->guard->counters();
  return c;
}

const Registry& Collector::registry() const { return impl_->registry; }
const std::vector<std::string>& Collector::endpoints() const { return impl_->endpoints; }
std::string Collector::curve_public_key() const {
  return impl_->guard ? impl_->guard->public_key() : std::string();
}
const CollectorOptions& Collector::options() const { return impl_->opts; }
uint64_t Collector::Request(ControlRequestSpec spec) {
  if (!impl_->requests) return 0;
  Bump(impl_->n.control_requests);
  return impl_->requests->Add(std::move(spec), impl_->clock->NowUnixNs());
}
std::vector<ControlRequestState> Collector::requests() const {
  return impl_->requests ? impl_->requests->Snapshot() : std::vector<ControlRequestState>();
}
const std::string& Collector::control_endpoint() const { return impl_->control_endpoint; }
Status Collector::health() const {
  std::lock_guard<std::mutex> lock(impl_->health_mu);
  return impl_->health;
}

}  // namespace lockstep::collector
