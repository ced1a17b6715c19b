// The Collector over real ZeroMQ sockets on loopback, in-process.
#include "lockstep/collector/collector.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <fstream>
#include <thread>
#include <zmq.hpp>

#include "runlog/log_format.h"
#include "runlog/log_reader.h"
#include "file_size_limit.h"
#include "test_dir.h"
#include "test_messages.h"

namespace lockstep::collector {
namespace {

using testing::At;
using testing::Bytes;

// Waits until `pred` holds or 10 s pass: no fixed sleeps.
template <typename Pred>
bool WaitFor(Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

class RecordingSink : public MessageSink {
 public:
  void OnMessage(const wire::Envelope& env, int64_t recv) override {
    seqs.push_back(env.seq());
    last_recv = recv;
  }
  std::vector<uint64_t> seqs;
  int64_t last_recv = 0;
};

class ThrowingSink : public MessageSink {
 public:
  void OnMessage(const wire::Envelope&, int64_t) override { throw std::runtime_error("boom"); }
};

struct Pusher {
  explicit Pusher(const std::string& ep) : sock(ctx, zmq::socket_type::push) {
    sock.set(zmq::sockopt::linger, 5000);
    sock.connect(ep);
  }
  void Send(const Bytes& b) { sock.send(zmq::buffer(b.data(), b.size()), zmq::send_flags::none); }
  zmq::context_t ctx;
  zmq::socket_t sock;
};

std::unique_ptr<Collector> Make(const std::string& dir, RecordingSink* sink = nullptr,
                                MessageSink* sink2 = nullptr, const Clock* clock = nullptr) {
  CollectorOptions o;
  o.listen = {"tcp://127.0.0.1:*"};
  o.data_dir = dir;
  o.fsync_interval_ms = 50;
  o.clock = clock;
  auto c = Collector::Create(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return nullptr;
  if (sink) {
    EXPECT_TRUE((*c)->AddSink(sink).ok());
  }
  if (sink2) {
    EXPECT_TRUE((*c)->AddSink(sink2).ok());
  }
  EXPECT_TRUE((*c)->Start().ok());
  return std::move(*c);
}

std::vector<Bytes> ReadLog(const std::string& path) {
  std::vector<Bytes> out;
  auto r = LogReader::Open(path);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return out;
  LogReader::Record rec;
  LogReader::Result res;
  while ((res = (*r)->Next(&rec)) == LogReader::Result::kRecord) out.emplace_back(rec.data, rec.data + rec.size);
  EXPECT_EQ(res, LogReader::Result::kEnd);
  return out;
}

TEST(Collector, LogsGoodMessagesAndCountsBadOnes) {
  testing::TempDir dir;
  RecordingSink sink;
  ThrowingSink thrower;
  auto c = Make(dir.path(), &sink, &thrower);
  ASSERT_TRUE(c);
  ASSERT_EQ(c->endpoints().size(), 1u);
  EXPECT_NE(c->endpoints()[0].find("tcp://127.0.0.1:"), std::string::npos);
  EXPECT_EQ(c->endpoints()[0].find('*'), std::string::npos);

  Pusher p(c->endpoints()[0]);
  std::vector<Bytes> good = {testing::Hello(At("run-a", 0, 0)),
                             testing::Directory(At("run-a", 0, 1), {{0, "l0"}, {1, "l1"}}),
                             testing::Stats(At("run-a", 0, 2), 0, 2),
                             testing::Scalars(At("run-a", 0, 3), 0, 0.5),
                             testing::Stats(At("run-b", 1, 0), 0, 5)};
  auto major2 = At("run-a", 0, 4);
  major2.major = 2;
  auto wrong_id = At("run-a", 0, 4);
  wrong_id.identifier = "NOPE";
  Bytes truncated = testing::Stats(At("run-a", 0, 4), 1, 3);
  truncated.resize(truncated.size() / 2);
  Bytes garbage(100, 0xAB);
  std::vector<Bytes> bad = {testing::Hello(major2), testing::Hello(wrong_id), truncated, garbage,
                            testing::Hello(At("../evil", 0, 0))};
  // Interleaved: bad messages must not disturb the good ones around them.
  for (size_t i = 0; i < good.size(); ++i) {
    p.Send(good[i]);
    if (i < bad.size()) p.Send(bad[i]);
  }
  ASSERT_TRUE(WaitFor([&] { return c->counters().received == 10; }));
  ASSERT_TRUE(c->Shutdown(std::chrono::seconds(5)).ok());

  auto n = c->counters();
  EXPECT_EQ(n.accepted, 5u);
  EXPECT_EQ(n.records, 2u + 1u + 5u);
  EXPECT_EQ(n.rejected, 5u);
  EXPECT_EQ(n.rejected_by[static_cast<size_t>(Reject::kSchemaMajor)], 1u);
  EXPECT_EQ(n.rejected_by[static_cast<size_t>(Reject::kFileIdentifier)], 2u);  // + garbage
  EXPECT_EQ(n.rejected_by[static_cast<size_t>(Reject::kMalformed)], 1u);
  EXPECT_EQ(n.rejected_by[static_cast<size_t>(Reject::kRunId)], 1u);
  EXPECT_EQ(n.sink_errors, 5u);  // the throwing sink, caught each time
  EXPECT_GE(n.fsyncs, 1u);
  EXPECT_EQ(sink.seqs, (std::vector<uint64_t>{0, 1, 2, 3, 0}));

  // The logs hold exactly the good bytes, per run; nothing for the evil run id.
  EXPECT_EQ(ReadLog(runlog::LogPathFor(dir.path(), "run-a")),
            std::vector<Bytes>(good.begin(), good.begin() + 4));
  EXPECT_EQ(ReadLog(runlog::LogPathFor(dir.path(), "run-b")), std::vector<Bytes>{good[4]});
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 3);  // run-a, run-b and the data dir's lock file

  RankInfo a;
  ASSERT_TRUE(c->registry().Get("run-a", 0, &a));
  EXPECT_EQ(a.messages, 4u);
  EXPECT_EQ(a.gaps, 0u);
  EXPECT_EQ(a.bad_messages, 1u);  // the major-2 one was attributable
  EXPECT_TRUE(c->health().ok());
}

// The receive time handed to sinks and kept in the registry is the injected clock's.
TEST(Collector, StampsReceiveTimesWithTheInjectedClock) {
  testing::TempDir dir;
  RecordingSink sink;
  FakeClock clock(/*unix_ns=*/1'234'000'000'000'000'000);
  auto c = Make(dir.path(), &sink, nullptr, &clock);
  ASSERT_TRUE(c);
  Pusher p(c->endpoints()[0]);
  p.Send(testing::Hello(At("run-a", 0, 0)));
  ASSERT_TRUE(WaitFor([&] { return c->counters().received == 1; }));
  ASSERT_TRUE(c->Shutdown(std::chrono::seconds(5)).ok());
  EXPECT_EQ(sink.last_recv, 1'234'000'000'000'000'000);
  RankInfo a;
  ASSERT_TRUE(c->registry().Get("run-a", 0, &a));
  EXPECT_EQ(a.last_recv_unix_ns, 1'234'000'000'000'000'000);
}

TEST(Collector, RestartRebuildsAndCountsTheGapExactly) {
  testing::TempDir dir;
  {
    auto c = Make(dir.path());
    ASSERT_TRUE(c);
    Pusher p(c->endpoints()[0]);
    p.Send(testing::Hello(At("run-r", 0, 0)));
    for (uint64_t s = 1; s < 10; ++s) p.Send(testing::Stats(At("run-r", 0, s), s, 4));
    ASSERT_TRUE(WaitFor([&] { return c->counters().accepted == 10; }));
    ASSERT_TRUE(c->Shutdown(std::chrono::seconds(5)).ok());
  }
  auto c = Make(dir.path());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->counters().rebuilt_messages, 10u);
  Pusher p(c->endpoints()[0]);
  // 10..14 were sent while no collector listened and are lost.
  for (uint64_t s = 15; s < 20; ++s) p.Send(testing::Stats(At("run-r", 0, s), s, 4));
  ASSERT_TRUE(WaitFor([&] { return c->counters().accepted == 5; }));
  ASSERT_TRUE(c->Shutdown(std::chrono::seconds(5)).ok());
  RankInfo r;
  ASSERT_TRUE(c->registry().Get("run-r", 0, &r));
  EXPECT_EQ(r.messages, 15u);
  EXPECT_EQ(r.records, 9u * 4 + 5u * 4);
  EXPECT_EQ(r.gaps, 5u);
  EXPECT_EQ(r.last_seq, 19u);
  EXPECT_EQ(ReadLog(runlog::LogPathFor(dir.path(), "run-r")).size(), 15u);
}

TEST(Collector, AFullDiskIsReportedOnceCountedExactlyAndRecoveryToo) {
  testing::TempDir dir;
  std::mutex mu;
  std::vector<std::pair<bool, std::string>> events;
  CollectorOptions o;
  o.listen = {"tcp://127.0.0.1:*"};
  o.data_dir = dir.path();
  o.log_recover_quiet_ms = 0;
  o.on_log_health = [&](bool failing, const std::string& msg) {
    std::lock_guard<std::mutex> l(mu);
    events.emplace_back(failing, msg);
  };
  auto cr = Collector::Create(o);
  ASSERT_TRUE(cr.ok());
  RecordingSink sink;
  ASSERT_TRUE((*cr)->AddSink(&sink).ok());
  auto& c = *cr;
  ASSERT_TRUE(c->Start().ok());
  const std::string log = runlog::LogPathFor(dir.path(), "run-f");
  Pusher p(c->endpoints()[0]);
  p.Send(testing::Hello(At("run-f", 0, 0)));
  for (uint64_t s = 1; s < 5; ++s) p.Send(testing::Stats(At("run-f", 0, s), s, 4));
  auto logged = [&] {  // whole records in the log now (a write may be in progress)
    auto r = LogReader::Open(log);
    size_t n = 0;
    LogReader::Record rec;
    while (r.ok() && (*r)->Next(&rec) == LogReader::Result::kRecord) ++n;
    return n;
  };
  ASSERT_TRUE(WaitFor([&] { return logged() == 5; }));
  {
    testing::FileSizeLimit full(std::filesystem::file_size(log));
    for (uint64_t s = 5; s < 10; ++s) p.Send(testing::Stats(At("run-f", 0, s), s, 4));
    ASSERT_TRUE(WaitFor([&] { return c->counters().log_lost_records == 5; }));
    EXPECT_GE(c->counters().log_errors, 1u);
    EXPECT_EQ(c->counters().accepted, 10u);  // ingest went on
  }
  for (uint64_t s = 10; s < 15; ++s) p.Send(testing::Stats(At("run-f", 0, s), s, 4));
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> l(mu);
    return events.size() == 2;
  }));
  // Recovery shows at the first good write; the rest may still be on the wire, and
  // Shutdown drains only what has reached the socket.
  ASSERT_TRUE(WaitFor([&] { return c->counters().accepted == 15; }));
  ASSERT_TRUE(c->Shutdown(std::chrono::seconds(5)).ok());
  EXPECT_TRUE(events[0].first);
  EXPECT_NE(events[0].second.find("cannot write the run logs in " + dir.path()), std::string::npos)
      << events[0].second;
  EXPECT_FALSE(events[1].first);
  EXPECT_NE(events[1].second.find("5 messages were not recorded"), std::string::npos) << events[1].second;
  EXPECT_EQ(c->counters().log_lost_records, 5u);
  auto got = ReadLog(log);
  ASSERT_EQ(got.size(), 10u);  // 0..4 and 10..14: what was written before is intact
  std::vector<uint64_t> seqs;
  for (auto& b : got) seqs.push_back(wire::GetEnvelope(b.data())->seq());
  EXPECT_EQ(seqs, (std::vector<uint64_t>{0, 1, 2, 3, 4, 10, 11, 12, 13, 14}));
}

TEST(Collector, ManyMessagesArriveIntactAndInOrder) {
  testing::TempDir dir;
  RecordingSink sink;
  auto c = Make(dir.path(), &sink);
  ASSERT_TRUE(c);
  Pusher p(c->endpoints()[0]);
  constexpr uint64_t kN = 5000;
  for (uint64_t s = 0; s < kN; ++s) p.Send(testing::Stats(At("bulk", 0, s), s, 8));
  ASSERT_TRUE(WaitFor([&] { return c->counters().accepted == kN; }));
  ASSERT_TRUE(c->Shutdown(std::chrono::seconds(5)).ok());
  EXPECT_EQ(c->counters().records, kN * 8);
  ASSERT_EQ(sink.seqs.size(), kN);
  for (uint64_t s = 0; s < kN; ++s) ASSERT_EQ(sink.seqs[s], s);
  auto log = ReadLog(runlog::LogPathFor(dir.path(), "bulk"));
  EXPECT_EQ(log.size(), kN);
}

TEST(Collector, BadEndpointAndUnwritableDirAreClearErrors) {
  testing::TempDir dir;
  CollectorOptions o;
  o.data_dir = dir.path();
  o.listen = {"tcp://127.0.0.1:notaport"};
  auto c = Collector::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().IsInvalidArgument());
  EXPECT_NE(c.status().message().find("tcp://127.0.0.1:notaport"), std::string::npos);

  { std::ofstream(dir / "file") << "x"; }
  o.listen = {"tcp://127.0.0.1:*"};
  o.data_dir = dir / "file/sub";
  c = Collector::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Status::Code::kIOError);
  EXPECT_NE(c.status().message().find("file/sub"), std::string::npos);
}

TEST(Collector, SecondCollectorOnTheSameDataDirIsRefused) {
  testing::TempDir dir;
  auto first = Make(dir.path());
  ASSERT_TRUE(first);
  CollectorOptions o;
  o.listen = {"tcp://127.0.0.1:*"};
  o.data_dir = dir.path();
  auto second = Collector::Create(o);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("in use by another"), std::string::npos);
  ASSERT_TRUE(first->Shutdown(std::chrono::seconds(5)).ok());
  first.reset();  // releases the dir
  EXPECT_TRUE(Collector::Create(o).ok());
}

TEST(Collector, LoopbackEndpointsAreRecognized) {
  EXPECT_TRUE(IsLoopbackEndpoint("tcp://127.0.0.1:6200"));
  EXPECT_TRUE(IsLoopbackEndpoint("tcp://localhost:6200"));
  EXPECT_TRUE(IsLoopbackEndpoint("tcp://[::1]:6200"));
  EXPECT_TRUE(IsLoopbackEndpoint("ipc:///tmp/x"));
  EXPECT_FALSE(IsLoopbackEndpoint("tcp://*:6200"));
  EXPECT_FALSE(IsLoopbackEndpoint("tcp://0.0.0.0:6200"));
  EXPECT_FALSE(IsLoopbackEndpoint("tcp://10.1.2.3:6200"));
}

}  // namespace
}  // namespace lockstep::collector
