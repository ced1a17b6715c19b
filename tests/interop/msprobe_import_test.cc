// `lockstep import msprobe` on small dumps written here in msprobe's format (the layout
// and records tests/interop/test_msprobe_dump.py asserts of real ones): names and kinds,
// statistics-only records, orders, steps and ranks, and the errors, which leave no file.
#include "interop/msprobe_import.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_reader.h"
#include "test_dir.h"

namespace lockstep::collector {
namespace {

namespace fs = std::filesystem;

std::string T(const std::string& shape, double max, double min, double mean, double norm,
              const std::string& dtype = "torch.float32") {
  auto num = [](double x) {
    if (std::isnan(x)) return std::string("NaN");
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", x);
    return std::string(buf);
  };
  return R"({"type": "torch.Tensor", "dtype": ")" + dtype + R"(", "shape": )" + shape + R"(, "Max": )" + num(max) +
         R"(, "Min": )" + num(min) + R"(, "Mean": )" + num(mean) + R"(, "Norm": )" + num(norm) +
         R"(, "requires_grad": true})";
}

// One step of one rank: a Linear `fc` called twice (its functional linear inside the
// first call), its backward and parameter gradients, and a root-level add holding a NaN.
std::string DumpJson(double scale, const std::string& framework = "pytorch") {
  const std::string x = T("[2, 4]", 1 * scale, -1, 0.1, 2);
  const std::string y = T("[2, 3]", 2 * scale, -2, 0.2, 3);
  return std::string(R"({"task": "statistics", "level": "mix", "framework": ")") + framework +
         R"(", "dump_data_dir": null, "data": {
  "Functional.linear.0.forward": {"input_args": [)" + x + ", " + T("[3, 4]", 0.5, -0.5, 0, 1) + ", " +
         T("[3]", 0.1, -0.1, 0, 0.2) + R"(], "input_kwargs": {}, "output": [)" + y + R"(]},
  "Module.fc.Linear.forward.0": {"input_args": [)" + x + R"(], "input_kwargs": {}, "output": [)" + y +
         R"(], "parameters": {"weight": )" + T("[3, 4]", 0.5, -0.5, 0, 1) + R"(, "bias": )" +
         T("[3]", 0.1, -0.1, 0, 0.2) + R"(}},
  "Module.fc.Linear.forward.1": {"input_args": [)" + y + R"(, {"type": "int", "value": 3}], "input_kwargs": {"mask": )" +
         T("[2, 3]", 1, 0, 0.5, 1, "torch.bool") + R"(}, "output": [)" + x + R"(]},
  "Tensor.__add__.0.forward": {"input_args": [)" + x + ", " + x + R"(], "input_kwargs": {}, "output": [)" +
         T("[2, 4]", NAN, NAN, NAN, NAN) + R"(]},
  "Functional.linear.0.backward": {"input": [)" + y + R"(], "output": [)" + x + R"(]},
  "Module.fc.Linear.backward.0": {"input": [)" + y + R"(], "output": [)" + x + R"(]},
  "Module.fc.Linear.parameters_grad.0": {"weight": [)" + T("[3, 4]", 0.3, -0.3, 0, 0.7) + R"(], "bias": [)" +
         T("[3]", 0.2, -0.2, 0, 0.3) + R"(]}
}})";
}

const char* kConstruct = R"({"Functional.linear.0.forward": "Module.fc.Linear.forward.0",
  "Module.fc.Linear.forward.0": null, "Module.fc.Linear.forward.1": null, "Tensor.__add__.0.forward": null,
  "Functional.linear.0.backward": "Module.fc.Linear.backward.0", "Module.fc.Linear.backward.0": null})";

void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// A dump of `steps` x `ranks` under dir/dump.
std::string MakeDump(const testing::TempDir& dir, int steps, int ranks) {
  const std::string root = dir / "dump";
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < ranks; ++r) {
      const std::string d = root + "/step" + std::to_string(s) + "/rank" + std::to_string(r);
      Write(d + "/dump.json", DumpJson(1 + s + 10 * r));
      Write(d + "/construct.json", kConstruct);
      Write(d + "/stack.json", "{}");
    }
  }
  return root;
}

struct Row {
  std::string name, kind;
  uint32_t order = 0;
  uint64_t step = 0, numel = 0;
  uint32_t rank = 0;
  double max = 0, min = 0, mean = 0, l2 = 0, std = 0, absmax = 0;
  uint64_t nan = 0;
  bool stats_only = false;
};

// Every StepStats record of the log, resolved through its rank's directory; and the
// Hello's, StepEnd's and Goodbye's counts.
std::vector<Row> ReadRows(const std::string& path, std::map<std::string, int>* bodies = nullptr,
                          bool stats_only = true) {
  auto r = LogReader::Open(path);
  EXPECT_TRUE(r.ok()) << r.status().message();
  std::vector<Row> rows;
  std::map<std::pair<uint32_t, uint32_t>, std::pair<std::string, std::string>> dir;
  LogReader::Record rec;
  while ((*r)->Next(&rec) == LogReader::Result::kRecord) {
    auto env = LogReader::Envelope(rec);
    EXPECT_TRUE(env.ok());
    const wire::Envelope* e = *env;
    if (bodies) ++(*bodies)[wire::EnumNameBody(e->body_type())];
    if (const auto* d = e->body_as_TensorDirectory()) {
      for (const auto* t : *d->tensors()) {
        dir[{e->rank(), t->id()}] = {t->name()->str(), wire::EnumNameTensorKind(t->kind())};
      }
    }
    if (const auto* st = e->body_as_StepStats()) {
      if (stats_only) {
        EXPECT_EQ(st->sketch_k(), 0);
        EXPECT_EQ(st->hist_bins(), 0);
      }
      for (const auto* s : *st->stats()) {
        Row row;
        std::tie(row.name, row.kind) = dir.at({e->rank(), s->tensor_id()});
        row.order = s->order();
        row.step = st->step();
        row.rank = e->rank();
        row.numel = s->numel();
        row.max = s->max(), row.min = s->min(), row.mean = s->mean(), row.l2 = s->l2();
        row.std = s->std(), row.absmax = s->absmax(), row.nan = s->nan_count();
        row.stats_only = (s->flags() & static_cast<uint8_t>(wire::StatFlags::kStatsOnly)) != 0;
        rows.push_back(row);
      }
    }
  }
  return rows;
}

std::vector<Row> ReadRowsAnyK(const std::string& path) { return ReadRows(path, nullptr, false); }

const Row* Find(const std::vector<Row>& rows, const std::string& name, const std::string& kind, uint64_t step = 0,
                uint32_t rank = 0) {
  for (const Row& r : rows) {
    if (r.name == name && r.kind == kind && r.step == step && r.rank == rank) return &r;
  }
  return nullptr;
}

TEST(MsprobeImport, NamesKindsAndStatistics) {
  testing::TempDir dir;
  MsprobeImportOptions o;
  o.dump_dir = MakeDump(dir, 1, 1);
  o.out_path = dir / "run.lslog";
  MsprobeImportSummary sum;
  Status s = ImportMsprobe(o, &sum);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(sum.run, "dump");
  EXPECT_EQ(sum.steps, 1u);
  EXPECT_EQ(sum.ranks, 1u);
  EXPECT_EQ(sum.entries, 7u);
  EXPECT_EQ(sum.task, "statistics");
  const auto rows = ReadRows(o.out_path);
  std::vector<std::string> got;
  for (const Row& r : rows) got.push_back(r.kind + " " + r.name);
  std::sort(got.begin(), got.end());
  const std::vector<std::string> want = {
      "Act <root>/add#0", "Act fc", "Act fc#1", "Act fc/linear#0",
      "ActGrad fc", "ActGrad fc/linear#0",
      "ActIn <root>/add#0(0)", "ActIn <root>/add#0(1)", "ActIn fc", "ActIn fc#1",
      "ActIn fc/linear#0(0)", "ActIn fc/linear#0(1)", "ActIn fc/linear#0(2)",
      "Param fc.bias", "Param fc.weight", "ParamGrad fc.bias", "ParamGrad fc.weight"};
  EXPECT_EQ(got, want);
  // The statistics as the dump has them, marked statistics-only: std unknown (NaN),
  // absmax from max and min, numel from the shape.
  const Row* act = Find(rows, "fc", "Act");
  ASSERT_NE(act, nullptr);
  EXPECT_TRUE(act->stats_only);
  EXPECT_EQ(act->numel, 6u);
  EXPECT_EQ(act->max, 2);
  EXPECT_EQ(act->min, -2);
  EXPECT_EQ(act->mean, 0.2);
  EXPECT_EQ(act->l2, 3);
  EXPECT_EQ(act->absmax, 2);
  EXPECT_TRUE(std::isnan(act->std));
  // A NaN statistic: the tensor held at least one NaN.
  const Row* add = Find(rows, "<root>/add#0", "Act");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->nan, 1u);
  EXPECT_EQ(Find(rows, "fc", "Act")->nan, 0u);
  // Execution order: the module's input before the call inside it, before its output;
  // the second call's int argument and bool keyword are not floating-point inputs, so
  // its one input is named like the call.
  EXPECT_LT(Find(rows, "fc", "ActIn")->order, Find(rows, "fc/linear#0(0)", "ActIn")->order);
  EXPECT_LT(Find(rows, "fc/linear#0", "Act")->order, Find(rows, "fc", "Act")->order);
  EXPECT_LT(Find(rows, "fc", "Act")->order, Find(rows, "fc#1", "ActIn")->order);
  EXPECT_EQ(Find(rows, "fc#1", "ActIn")->numel, 6u);
  EXPECT_LT(Find(rows, "fc/linear#0", "ActGrad")->order, Find(rows, "fc", "ActGrad")->order);
}

TEST(MsprobeImport, StepsAndRanks) {
  testing::TempDir dir;
  MsprobeImportOptions o;
  o.dump_dir = MakeDump(dir, 2, 2);
  o.out_path = dir / "run.lslog";
  o.run = "npu-run";
  o.role = "candidate";
  o.experiment = "glm";
  MsprobeImportSummary sum;
  ASSERT_TRUE(ImportMsprobe(o, &sum).ok());
  EXPECT_EQ(sum.steps, 2u);
  EXPECT_EQ(sum.ranks, 2u);
  std::map<std::string, int> bodies;
  const auto rows = ReadRows(o.out_path, &bodies);
  EXPECT_EQ(bodies["Hello"], 2);
  EXPECT_EQ(bodies["StepEnd"], 4);
  EXPECT_EQ(bodies["Goodbye"], 2);
  // Each (step, rank) its own values: step s rank r scaled 1 + s + 10 r.
  EXPECT_EQ(Find(rows, "fc", "Act", 1, 1)->max, 2 * 12);
  EXPECT_EQ(Find(rows, "fc", "Act", 0, 1)->max, 2 * 11);
  EXPECT_EQ(Find(rows, "fc", "Act", 1, 0)->max, 2 * 2);
  auto r = LogReader::Open(o.out_path);
  LogReader::Record rec;
  ASSERT_EQ((*r)->Next(&rec), LogReader::Result::kRecord);
  auto env = LogReader::Envelope(rec);
  ASSERT_TRUE(env.ok());
  const auto* hello = (*env)->body_as_Hello();
  ASSERT_NE(hello, nullptr);
  EXPECT_EQ((*env)->run_id()->str(), "npu-run");
  EXPECT_EQ(hello->experiment()->str(), "glm");
  EXPECT_EQ(hello->role(), wire::Role::Candidate);
  EXPECT_EQ(hello->world_size(), 2u);
}

// Errors: one sentence naming the file, and no output (nor temporary) file left.
void ExpectError(const testing::TempDir& dir, const std::string& dump, const std::string& want) {
  MsprobeImportOptions o;
  o.dump_dir = dump;
  o.out_path = dir / "out.lslog";
  MsprobeImportSummary sum;
  Status s = ImportMsprobe(o, &sum);
  ASSERT_FALSE(s.ok()) << want;
  EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().rfind("out.lslog", 0), std::string::npos) << e.path();
  }
}

TEST(MsprobeImport, NotADump) {
  testing::TempDir dir;
  fs::create_directories(dir / "empty");
  ExpectError(dir, dir / "empty", dir / "empty" + ": not an msprobe dump");
  ExpectError(dir, dir / "missing", "missing: no such directory");
  fs::create_directories(dir / "steps/step0/other");
  ExpectError(dir, dir / "steps", "not an msprobe dump");
}

TEST(MsprobeImport, TruncatedDumpJson) {
  testing::TempDir dir;
  const std::string root = MakeDump(dir, 2, 1);
  const std::string json = DumpJson(1);
  Write(root + "/step1/rank0/dump.json", json.substr(0, json.size() / 2));
  ExpectError(dir, root, root + "/step1/rank0/dump.json: truncated at byte");
}

TEST(MsprobeImport, MindSporeIsNotSupportedYet) {
  testing::TempDir dir;
  const std::string root = MakeDump(dir, 1, 1);
  Write(root + "/step0/rank0/dump.json", DumpJson(1, "mindspore"));
  ExpectError(dir, root, root + "/step0/rank0/dump.json: a MindSpore dump (framework \"mindspore\"): not supported yet");
}

TEST(MsprobeImport, ARankMissingFromAStep) {
  testing::TempDir dir;
  const std::string root = MakeDump(dir, 2, 2);
  fs::remove_all(root + "/step1/rank1");
  ExpectError(dir, root, root + "/step1/rank1: missing");
}

// Tensor mode: rows computed from the tensor files (python -m lockstep import-msprobe)
// replace dump.json's statistics, whole: sketch, histogram, std and counts.
TEST(MsprobeImport, FullRowsFromTheRowsFolder) {
  testing::TempDir dir;
  const std::string root = dir / "dump";
  std::string x = T("[2, 4]", 1, -1, 0.1, 2);
  x.insert(x.size() - 1, R"(, "data_name": "Module.fc.Linear.forward.0.output.0.pt")");
  Write(root + "/step0/rank0/dump.json",
        R"({"task": "tensor", "level": "L0", "framework": "pytorch", "data": {"Module.fc.Linear.forward.0": )"
        R"({"input_args": [)" + T("[2, 4]", 1, -1, 0.1, 2) + R"(], "input_kwargs": {}, "output": [)" + x + "]}}}");
  // numel, min, max, mean, std, l2, absmax, nan, inf, zero, sat, subnormal, limit, sketch[2], hist[3]
  Write(dir / "rows/step0/rank0/lockstep_rows.json",
        R"({"sketch_k": 2, "hist_bins": 3, "rows": {"Module.fc.Linear.forward.0.output.0.pt": )"
        R"([8, -1, 1, 0.1, 0.7, 2, 1, 0, 0, 1, 0, 0, 2, 0.5, -0.25, 1, 2, 5]}})");
  MsprobeImportOptions o;
  o.dump_dir = root;
  o.out_path = dir / "run.lslog";
  o.rows_dir = dir / "rows";
  MsprobeImportSummary sum;
  Status s = ImportMsprobe(o, &sum);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(sum.records, 2u);
  EXPECT_EQ(sum.full_records, 1u);
  const auto rows = ReadRowsAnyK(o.out_path);
  const Row* out = Find(rows, "fc", "Act");
  const Row* in = Find(rows, "fc", "ActIn");
  ASSERT_NE(out, nullptr);
  ASSERT_NE(in, nullptr);
  EXPECT_FALSE(out->stats_only);
  EXPECT_EQ(out->std, 0.7);
  EXPECT_EQ(out->numel, 8u);
  EXPECT_TRUE(in->stats_only);  // no file: dump.json's statistics
  // A bad rows file is an error naming it.
  Write(dir / "rows/step0/rank0/lockstep_rows.json", R"({"sketch_k": 2, "hist_bins": 3, "rows": {"a": [1, 2]}})");
  s = ImportMsprobe(o, &sum);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lockstep_rows.json: not a rows file"), std::string::npos) << s.message();
}

TEST(MsprobeImport, LooksLikeADump) {
  testing::TempDir dir;
  const std::string root = MakeDump(dir, 1, 1);
  EXPECT_TRUE(IsMsprobeDumpDir(root));
  EXPECT_TRUE(IsMsprobeDumpDir(root + "/step0/rank0"));
  EXPECT_FALSE(IsMsprobeDumpDir(dir.path()));
  EXPECT_FALSE(IsMsprobeDumpDir(root + "/step0/rank0/dump.json"));
  EXPECT_EQ(RunIdFromPath("/a/b/msprobe dump+x/"), "msprobe-dump-x");
}

}  // namespace
}  // namespace lockstep::collector
