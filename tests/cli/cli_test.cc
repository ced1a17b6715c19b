// `lockstep collect` and `lockstep inspect` as a user runs them: the real binary.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "read_file.h"
#include "test_dir.h"
#include "test_messages.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using testing::At;
using testing::Bytes;
using testing::ReadFile;

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

// Starts `lockstep ARGS...` with stdout/stderr to files; returns the pid.
pid_t Spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  pid_t pid = fork();
  if (pid == 0) {
    int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(LOCKSTEP_BIN));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(LOCKSTEP_BIN, argv.data());
    _exit(127);
  }
  return pid;
}

// Waits up to 20 s for the exit code; -1 on timeout (the process is then killed).
int Wait(pid_t pid) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a child, not a sync
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

struct Result {
  int code;
  std::string out, err;
};

Result RunLockstep(const testing::TempDir& dir, const std::vector<std::string>& args) {
  std::string out = dir / "stdout", err = dir / "stderr";
  int code = Wait(Spawn(args, out, err));
  return {code, ReadFile(out), ReadFile(err)};
}

TEST(CollectCli, UnknownFlagIsOneLineAndExit2) {
  testing::TempDir dir;
  Result r = RunLockstep(dir, {"collect", "--no-such-flag"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("--no-such-flag"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST(CollectCli, MalformedEndpointIsOneLineAndExit2) {
  testing::TempDir dir;
  Result r = RunLockstep(dir, {"collect", "--listen", "tcp://127.0.0.1:nope", "--data-dir", dir / "d"});
  EXPECT_EQ(r.code, 2);
  ASSERT_EQ(Lines(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("'tcp://127.0.0.1:nope'"), std::string::npos) << r.err;
  r = RunLockstep(dir, {"collect", "--listen", "bogus", "--data-dir", dir / "d"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
}

TEST(CollectCli, UnwritableDataDirIsOneLineAndExit2) {
  testing::TempDir dir;
  { std::ofstream(dir / "plainfile") << "x"; }
  Result r = RunLockstep(dir, {"collect", "--listen", "tcp://127.0.0.1:*", "--data-dir", dir / "plainfile/d"});
  EXPECT_EQ(r.code, 2);
  ASSERT_EQ(Lines(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("data dir"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("plainfile/d"), std::string::npos) << r.err;
}

// An alert sink that cannot be set up is one sentence and exit 2, never a crash (the
// half-built sink worker once called Abort() on a null transport: exit 139).
TEST(CollectCli, AlertSinkThatCannotBeSetUpIsOneLineAndExit2) {
  testing::TempDir dir;
  { std::ofstream(dir / "plainfile") << "x"; }
  { std::ofstream(dir / "garbage.pem") << "not a certificate\n"; }
  fs::create_directories(dir / "alerts-dir");
  struct Case {
    std::vector<std::string> flags;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{"--alerts-file", dir / "alerts-dir"}, "is a directory"},
      // Below a regular file: no directory can be made there, also for root.
      {{"--alerts-file", dir / "plainfile/alerts.jsonl"}, "plainfile/alerts.jsonl"},
      {{"--alert-ca-file", dir / "garbage.pem", "--webhook", "https://127.0.0.1:9/h"}, "garbage.pem"},
      {{"--alert-ca-file", dir / "plainfile/nope.pem", "--webhook", "https://127.0.0.1:9/h"}, "nope.pem"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"collect", "--listen", "tcp://127.0.0.1:*", "--data-dir", dir / "d"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    Result r = RunLockstep(dir, args);
    EXPECT_EQ(r.code, 2) << c.flags[0] << " " << c.flags[1] << ": " << r.err;
    EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find(c.want), std::string::npos) << r.err;
  }
}

// alert-test takes the same mistakes as collect the same way: a sink that cannot be set
// up is a configuration mistake (exit 2, the sink named FAILED with the reason), not
// an alert that failed to arrive (exit 4).
TEST(AlertTestCli, SinkThatCannotBeSetUpIsExit2) {
  testing::TempDir dir;
  { std::ofstream(dir / "garbage.pem") << "not a certificate\n"; }
  fs::create_directories(dir / "alerts-dir");
  const std::vector<std::vector<std::string>> cases = {
      {"--alerts-file", dir / "alerts-dir"},
      {"--alert-ca-file", dir / "garbage.pem", "--webhook", "https://127.0.0.1:9/h"},
  };
  for (const auto& flags : cases) {
    std::vector<std::string> args = {"alert-test"};
    args.insert(args.end(), flags.begin(), flags.end());
    Result r = RunLockstep(dir, args);
    EXPECT_EQ(r.code, 2) << flags[0] << ": " << r.out << r.err;
    EXPECT_NE(r.out.find("FAILED"), std::string::npos) << r.out;
  }
  // Set up fine, nobody listening: the alert did not arrive, a runtime failure.
  Result r = RunLockstep(dir, {"alert-test", "--webhook", "http://127.0.0.1:9/h", "--alert-retries", "0"});
  EXPECT_EQ(r.code, 4) << r.out << r.err;
}

TEST(KeygenCli, WritesAKeyPairRefusesToOverwriteAndCollectReadsIt) {
  testing::TempDir dir;
  Result r = RunLockstep(dir, {"keygen", dir / "col"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("public key: "), std::string::npos) << r.out;
  EXPECT_EQ(fs::status(dir / "col.key").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  r = RunLockstep(dir, {"keygen", dir / "col"});
  EXPECT_EQ(r.code, 2);
  ASSERT_EQ(Lines(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  r = RunLockstep(dir, {"keygen"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;

  // A .pub where the key pair belongs, and an authorized list without a key pair.
  r = RunLockstep(dir, {"collect", "--listen", "tcp://127.0.0.1:*", "--data-dir", dir / "d", "--curve-key",
                        dir / "col.pub"});
  EXPECT_EQ(r.code, 2);
  ASSERT_EQ(Lines(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("no secret-key"), std::string::npos) << r.err;
  r = RunLockstep(dir, {"collect", "--listen", "tcp://127.0.0.1:*", "--data-dir", dir / "d",
                        "--curve-authorized-keys", dir / "col.pub"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("needs --curve-key"), std::string::npos) << r.err;
}

TEST(CollectCli, RecordsUntilSigtermThenInspectShowsIt) {
  testing::TempDir dir;
  std::string data = dir / "data", ready = dir / "ready.json";
  pid_t pid = Spawn({"collect", "--listen", "tcp://127.0.0.1:*", "--data-dir", data,
                     "--ready-file", ready, "--status-interval-s", "1"},
                    dir / "collect.out", dir / "collect.err");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!fs::exists(ready) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(fs::exists(ready)) << ReadFile(dir / "collect.err");
  std::string info = ReadFile(ready);
  auto start = info.find("\"listen\":[\"") + 11;
  std::string ep = info.substr(start, info.find('"', start) - start);
  EXPECT_NE(info.find("\"pid\":" + std::to_string(pid)), std::string::npos) << info;

  {
    zmq::context_t ctx;
    zmq::socket_t push(ctx, zmq::socket_type::push);
    push.set(zmq::sockopt::linger, 5000);
    push.connect(ep);
    std::vector<Bytes> msgs = {testing::Hello(At("cli-run", 2, 0), "cli-exp", wire::Role::Candidate),
                               testing::Directory(At("cli-run", 2, 1), {{0, "encoder.layer0"}}),
                               testing::Stats(At("cli-run", 2, 2), 7, 1),
                               testing::Scalars(At("cli-run", 2, 4), 7, 0.25),
                               Bytes(64, 0x5A)};
    for (const auto& m : msgs) push.send(zmq::buffer(m.data(), m.size()), zmq::send_flags::none);
  }  // linger: all sent before the context closes
  std::string log = data + "/cli-run.lslog";
  // Wait until the four good records are on disk (the collector flushes when idle).
  uint64_t want = 0;
  for (auto& m : {testing::Hello(At("cli-run", 2, 0), "cli-exp", wire::Role::Candidate),
                  testing::Directory(At("cli-run", 2, 1), {{0, "encoder.layer0"}}),
                  testing::Stats(At("cli-run", 2, 2), 7, 1), testing::Scalars(At("cli-run", 2, 4), 7, 0.25)})
    want += 16 + m.size();
  want += 16;
  while ((!fs::exists(log) || fs::file_size(log) < want) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  kill(pid, SIGTERM);
  EXPECT_EQ(Wait(pid), 0) << ReadFile(dir / "collect.err");
  std::string err = ReadFile(dir / "collect.err");
  EXPECT_NE(err.find("SIGTERM"), std::string::npos) << err;
  EXPECT_NE(err.find("file_identifier"), std::string::npos) << err;  // the garbage frame
  EXPECT_NE(err.find("access: loopback only"), std::string::npos) << err;  // says who can reach it
  EXPECT_FALSE(fs::exists(ready));

  Result r = RunLockstep(dir, {"inspect", log});
  EXPECT_EQ(r.code, 0) << r.err;
  auto lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.out;
  EXPECT_NE(lines[0].find("\"type\":\"Hello\""), std::string::npos);
  EXPECT_NE(lines[0].find("\"role\":\"candidate\""), std::string::npos);
  EXPECT_NE(lines[0].find("\"run\":\"cli-run\",\"rank\":2,\"seq\":0"), std::string::npos) << lines[0];
  // The stats record names its tensor through the directory sent before it.
  EXPECT_NE(lines[2].find("\"name\":\"encoder.layer0\",\"kind\":\"act\",\"dtype\":\"bf16\""),
            std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("\"mean\":7,"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("\"sketch\":[0,1,2,3]"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find("\"loss\":0.25"), std::string::npos) << lines[3];
  EXPECT_NE(lines[3].find("\"loss_scale\":null"), std::string::npos) << lines[3];

  r = RunLockstep(dir, {"inspect", "--summary", log});
  EXPECT_EQ(r.code, 0) << r.err;
  lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  for (const char* want_field : {"\"run\":\"cli-run\"", "\"rank\":2", "\"experiment\":\"cli-exp\"",
                                 "\"messages\":4", "\"records\":2", "\"first_seq\":0",
                                 "\"last_seq\":4", "\"gaps\":1", "\"duplicates\":0",
                                 "\"last_step\":7", "\"role\":\"candidate\""})
    EXPECT_NE(lines[0].find(want_field), std::string::npos) << want_field << " in " << lines[0];

  // A torn copy: read up to the tear, the tear reported on stderr, exit 0. The log is
  // compressed: the tear takes the last block, what one flush wrote (here the messages
  // of the last burst the collector received, one to all four).
  std::string torn = dir / "torn.lslog";
  fs::copy_file(log, torn);
  fs::resize_file(torn, fs::file_size(torn) - 3);
  r = RunLockstep(dir, {"inspect", torn});
  EXPECT_EQ(r.code, 0);
  EXPECT_LT(Lines(r.out).size(), 4u);
  EXPECT_NE(r.err.find("torn"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("torn.lslog"), std::string::npos) << r.err;
}

TEST(InspectCli, MissingFileAndNotALogAreOneLine) {
  testing::TempDir dir;
  Result r = RunLockstep(dir, {"inspect", dir / "nope.lslog"});
  EXPECT_EQ(r.code, 3);  // lockstep/common/exit_codes.h: input data error
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
  { std::ofstream(dir / "text.lslog") << "hello world, not a log"; }
  r = RunLockstep(dir, {"inspect", dir / "text.lslog"});
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("not a lockstep run log"), std::string::npos) << r.err;
  r = RunLockstep(dir, {"inspect"});
  EXPECT_EQ(r.code, 2);
}

// A directory where a run log belongs says so and names the logs it holds (it once
// read as "empty log"); exit 3, the input-data code of lockstep/common/exit_codes.h.
TEST(CollectCli, UnreadableBaselineLogIsExit3) {
  testing::TempDir dir;
  fs::create_directories(dir / "logs");
  Result r = RunLockstep(dir, {"collect", "--listen", "tcp://127.0.0.1:*", "--view-listen", "off",
                               "--metrics-listen", "off", "--data-dir", dir / "d", "--baseline", dir / "logs"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("is a directory, not a run log"), std::string::npos) << r.err;
  r = RunLockstep(dir, {"collect", "--listen", "tcp://127.0.0.1:*", "--view-listen", "off", "--metrics-listen",
                        "off", "--data-dir", dir / "d", "--baseline", dir / "missing.lslog"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("missing.lslog"), std::string::npos) << r.err;
}

TEST(CompareCli, DirectoryForALogNamesTheLogsInIt) {
  testing::TempDir dir;
  fs::create_directories(dir / "data");
  { std::ofstream(dir / "data/gpu-run.lslog") << "x"; }
  for (const std::string cmd : {"compare", "inspect"}) {
    std::vector<std::string> args = {cmd, dir / "data"};
    if (cmd == "compare") args.push_back(dir / "data");
    Result r = RunLockstep(dir, args);
    EXPECT_EQ(r.code, 3) << cmd << ": " << r.err;
    ASSERT_EQ(Lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("is a directory, not a run log"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("data/gpu-run.lslog"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("empty"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace lockstep
