// ZeroMQ CURVE on the collector's ingest socket, over real loopback sockets: the real
// lockstep::Agent with the right keys gets through; a plain peer, a peer with a wrong
// collector key and an unlisted agent key are refused, counted by reason, and nothing
// of theirs reaches a run log. Plus the key files `lockstep keygen` writes.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <zmq.hpp>

#include "ingest/curve_keys.h"
#include "lockstep/agent/agent.h"
#include "lockstep/collector/collector.h"
#include "test_dir.h"
#include "wait_for.h"
#include "test_messages.h"

namespace lockstep::collector {
namespace {

using testing::At;

using testing::WaitFor;

CurveKeyPair Pair() {
  auto p = MakeCurveKeyPair();
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return *p;
}

std::unique_ptr<Collector> Make(const std::string& dir, const CurveKeyPair& server,
                                std::vector<std::string> authorized) {
  CollectorOptions o;
  o.listen = {"tcp://127.0.0.1:*"};
  o.data_dir = dir;
  o.fsync_interval_ms = 50;
  o.curve.secret_key = server.secret_key;
  o.curve.authorized_keys = std::move(authorized);
  auto c = Collector::Create(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return nullptr;
  EXPECT_TRUE((*c)->Start().ok());
  return std::move(*c);
}

// A raw PUSH peer: plain, or CURVE with the given keys.
struct Peer {
  Peer(const std::string& ep, const std::string& server_key, const CurveKeyPair* own)
      : sock(ctx, zmq::socket_type::push) {
    sock.set(zmq::sockopt::linger, 0);
    sock.set(zmq::sockopt::reconnect_ivl, 50);
    if (!server_key.empty()) {
      sock.set(zmq::sockopt::curve_serverkey, server_key);
      sock.set(zmq::sockopt::curve_publickey, own->public_key);
      sock.set(zmq::sockopt::curve_secretkey, own->secret_key);
    }
    sock.connect(ep);
    auto b = testing::Hello(At("intruder", 0, 0));
    // Queued for the connection that never completes its handshake.
    (void)sock.send(zmq::buffer(b.data(), b.size()), zmq::send_flags::dontwait);
  }
  zmq::context_t ctx;
  zmq::socket_t sock;
};

uint64_t Refused(const Collector& c, AuthRefusal r) {
  return c.counters().auth.refused_by[static_cast<size_t>(r)];
}

TEST(Curve, AuthorizedAgentIsAdmittedAndLogged) {
  testing::TempDir dir;
  CurveKeyPair server = Pair(), agent_keys = Pair();
  auto c = Make(dir.path(), server, {agent_keys.public_key});
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->curve_public_key(), server.public_key);

  AgentOptions o;
  o.endpoint = c->endpoints().front();
  o.run = "curve-run";
  o.curve_server_key = server.public_key;
  o.curve_public_key = agent_keys.public_key;
  o.curve_secret_key = agent_keys.secret_key;
  auto agent = Agent::Create(o);
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  uint32_t id = (*agent)->RegisterTensor("blocks.0", TensorKind::kAct, DType::kF32, {4}, 0);
  ASSERT_NE(id, UINT32_MAX);
  for (uint64_t step = 0; step < 5; ++step) {
    TensorStats s;
    s.numel = 4;
    s.l2 = 1.0 + static_cast<double>(step);
    EXPECT_TRUE((*agent)->RecordStats(step, 0, id, 0, s));
    EXPECT_TRUE((*agent)->EndStep(step));
  }
  EXPECT_TRUE((*agent)->Close(std::chrono::seconds(5)));
  ASSERT_TRUE(WaitFor([&] { return c->registry().Totals().records >= 5; }));
  auto n = c->counters();
  EXPECT_GE(n.auth.admitted, 1u);
  EXPECT_EQ(n.auth.refused, 0u);
  EXPECT_EQ(n.rejected, 0u);
  EXPECT_TRUE(std::filesystem::exists(dir / "curve-run.lslog"));
}

TEST(Curve, PlainPeerIsRefusedAndCounted) {
  testing::TempDir dir;
  CurveKeyPair server = Pair();
  auto c = Make(dir.path(), server, {});
  ASSERT_NE(c, nullptr);
  Peer plain(c->endpoints().front(), "", nullptr);
  // kNoCurve when the collector notices the mismatch first; kOther when the peer does
  // and hangs up (the collector then sees only EPIPE).
  EXPECT_TRUE(WaitFor([&] { return Refused(*c, AuthRefusal::kNoCurve) + Refused(*c, AuthRefusal::kOther) >= 1; }));
  EXPECT_EQ(Refused(*c, AuthRefusal::kUnauthorized) + Refused(*c, AuthRefusal::kBadServerKey), 0u);
  EXPECT_EQ(c->counters().received, 0u);
  EXPECT_FALSE(std::filesystem::exists(dir / "intruder.lslog"));
}

TEST(Curve, WrongServerKeyIsRefusedAndCounted) {
  testing::TempDir dir;
  CurveKeyPair server = Pair(), impostor = Pair(), own = Pair();
  auto c = Make(dir.path(), server, {});
  ASSERT_NE(c, nullptr);
  Peer wrong(c->endpoints().front(), impostor.public_key, &own);
  EXPECT_TRUE(WaitFor([&] { return Refused(*c, AuthRefusal::kBadServerKey) >= 1; }));
  EXPECT_EQ(c->counters().received, 0u);
}

TEST(Curve, UnlistedAgentKeyIsRefusedListedOneAdmitted) {
  testing::TempDir dir;
  CurveKeyPair server = Pair(), listed = Pair(), unlisted = Pair();
  auto c = Make(dir.path(), server, {listed.public_key});
  ASSERT_NE(c, nullptr);
  {
    Peer stranger(c->endpoints().front(), server.public_key, &unlisted);
    EXPECT_TRUE(WaitFor([&] { return Refused(*c, AuthRefusal::kUnauthorized) >= 1; }));
  }
  EXPECT_EQ(c->counters().received, 0u);
  Peer friendly(c->endpoints().front(), server.public_key, &listed);
  EXPECT_TRUE(WaitFor([&] { return c->counters().accepted >= 1; }));
  EXPECT_GE(c->counters().auth.admitted, 1u);
}

TEST(Curve, AnyAgentWithTheServerKeyIsAdmittedWithoutAList) {
  testing::TempDir dir;
  CurveKeyPair server = Pair(), own = Pair();
  auto c = Make(dir.path(), server, {});
  ASSERT_NE(c, nullptr);
  Peer p(c->endpoints().front(), server.public_key, &own);
  EXPECT_TRUE(WaitFor([&] { return c->counters().accepted >= 1; }));
  EXPECT_EQ(c->counters().auth.refused, 0u);
}

TEST(Curve, BadSecretKeyIsOneSentence) {
  testing::TempDir dir;
  CollectorOptions o;
  o.listen = {"tcp://127.0.0.1:*"};
  o.data_dir = dir.path();
  o.curve.secret_key = "not-a-key";
  auto c = Collector::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("Z85"), std::string::npos) << c.status().message();
}

TEST(CurveKeys, KeygenFilesRoundTripWithModes) {
  testing::TempDir dir;
  CurveKeyPair p = Pair();
  auto w = WriteCurveKeyFiles(dir / "col", p, false);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  struct stat st;
  ASSERT_EQ(::stat((dir / "col.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto back = ReadCurveKeyFile(dir / "col.key", true);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->public_key, p.public_key);
  EXPECT_EQ(back->secret_key, p.secret_key);
  auto pub = ReadCurveKeyFile(dir / "col.pub", false);
  ASSERT_TRUE(pub.ok());
  EXPECT_TRUE(pub->secret_key.empty());
  EXPECT_FALSE(ReadCurveKeyFile(dir / "col.pub", true).ok());  // a .pub is not a key pair
  auto again = WriteCurveKeyFiles(dir / "col", p, false);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("--force"), std::string::npos);
  EXPECT_TRUE(WriteCurveKeyFiles(dir / "col", p, true).ok());
}

TEST(CurveKeys, MismatchedPairIsRefused) {
  testing::TempDir dir;
  CurveKeyPair a = Pair(), b = Pair();
  std::ofstream(dir / "mixed.key") << "public-key = \"" << a.public_key << "\"\nsecret-key = \""
                                   << b.secret_key << "\"\n";
  auto r = ReadCurveKeyFile(dir / "mixed.key", true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not belong"), std::string::npos);
}

TEST(CurveKeys, AuthorizedKeysAcceptBareKeysPubFilesAndComments) {
  testing::TempDir dir;
  CurveKeyPair a = Pair(), b = Pair();
  // '#' is a Z85 character: a key that starts with it is still a key.
  std::string hashed = "#" + a.public_key.substr(1);
  bool hashed_valid = IsZ85Key(hashed);
  std::ofstream(dir / "auth") << "# agents of job 17\n\n"
                              << a.public_key << "  rank0 on node3\n"
                              << "public-key = \"" << b.public_key << "\"\n"
                              << (hashed_valid ? hashed + "\n" : "");
  auto keys = ReadAuthorizedKeys(dir / "auth");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  ASSERT_EQ(keys->size(), hashed_valid ? 3u : 2u);
  EXPECT_EQ((*keys)[0], a.public_key);
  EXPECT_EQ((*keys)[1], b.public_key);

  std::ofstream(dir / "empty") << "# nobody\n";
  auto empty = ReadAuthorizedKeys(dir / "empty");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("lists no key"), std::string::npos);
  std::ofstream(dir / "bad") << "hello\n";
  auto bad = ReadAuthorizedKeys(dir / "bad");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 1"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::collector
