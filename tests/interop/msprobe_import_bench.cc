// Bench of `lockstep import msprobe` (collector/src/interop): how fast a large dump.json
// is read and turned into a run log, and that memory stays bounded.
//
// BENCH msprobe_import_mb_per_s: MB (1e6 bytes) of dump.json imported per second, the
// median of 3 imports of one synthetic dump of one step and one rank, about 256 MB of
// JSON written as msprobe writes it (json.dump with indent 1: one number per line),
// every entry a module call with its API call inside, their backward and parameter
// gradients; the log written to the same directory. Target >= 50 MB/s. The file is read
// once before the first import so the page cache holds it (the figure is the import's,
// not the disk's). Peak RSS (stderr) shows the memory is that of one entry, not the file.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "interop/msprobe_import.h"
#include "test_dir.h"

namespace {

std::string Tensor(const std::string& ind, const std::vector<int>& shape, double v) {
  std::string s = "{\n" + ind + " \"type\": \"torch.Tensor\",\n" + ind + " \"dtype\": \"torch.float32\",\n" + ind +
                  " \"shape\": [\n";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += ind + "  " + std::to_string(shape[i]) + (i + 1 < shape.size() ? ",\n" : "\n");
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s ],\n%s \"Max\": %.17g,\n%s \"Min\": %.17g,\n%s \"Mean\": %.17g,\n%s \"Norm\": %.17g,\n%s "
                "\"requires_grad\": true\n%s}",
                ind.c_str(), ind.c_str(), 1.5 + v, ind.c_str(), -1.25 - v, ind.c_str(), 0.001 * v, ind.c_str(),
                10.0 + v, ind.c_str(), ind.c_str());
  return s + buf;
}

// Writes `target_bytes` or a little more of dump.json and its construct.json.
void WriteDump(const std::string& dir, size_t target_bytes) {
  std::filesystem::create_directories(dir);
  std::ofstream f(dir + "/dump.json", std::ios::binary);
  std::ofstream c(dir + "/construct.json", std::ios::binary);
  f << "{\n \"task\": \"statistics\",\n \"level\": \"mix\",\n \"framework\": \"pytorch\",\n \"dump_data_dir\": "
       "null,\n \"data\": {\n";
  c << "{\n";
  size_t bytes = 0;
  for (int i = 0; bytes < target_bytes; ++i) {
    const std::string m = "Module.layers." + std::to_string(i) + ".fc.Linear.forward.0";
    const std::string api = "Functional.linear." + std::to_string(i) + ".forward";
    const std::string in = Tensor("     ", {8, 512, 1024}, i), out = Tensor("     ", {8, 512, 1024}, i + 0.5);
    const std::string w = Tensor("     ", {1024, 1024}, i + 0.25), b = Tensor("     ", {1024}, i + 0.125);
    std::string e;
    e += (i ? ",\n" : "") + std::string("  \"") + api + "\": {\n   \"input_args\": [\n    " + in + ",\n    " + w +
         ",\n    " + b + "\n   ],\n   \"input_kwargs\": {},\n   \"output\": [\n    " + out + "\n   ]\n  },\n";
    e += "  \"" + m + "\": {\n   \"input_args\": [\n    " + in + "\n   ],\n   \"input_kwargs\": {},\n   \"output\": [\n    " +
         out + "\n   ],\n   \"parameters\": {\n    \"weight\": " + w + ",\n    \"bias\": " + b + "\n   }\n  }";
    const std::string mb = "Module.layers." + std::to_string(i) + ".fc.Linear.backward.0";
    e += ",\n  \"" + mb + "\": {\n   \"input\": [\n    " + out + "\n   ],\n   \"output\": [\n    " + in + "\n   ]\n  }";
    e += ",\n  \"Module.layers." + std::to_string(i) + ".fc.Linear.parameters_grad.0\": {\n   \"weight\": [\n    " + w +
         "\n   ],\n   \"bias\": [\n    " + b + "\n   ]\n  }";
    f << e;
    bytes += e.size();
    c << (i ? ",\n" : "") << " \"" << api << "\": \"" << m << "\",\n \"" << m << "\": null,\n \"" << mb << "\": null";
  }
  f << "\n }\n}\n";
  c << "\n}\n";
}

}  // namespace

int main() {
  lockstep::testing::TempDir dir;
  const std::string root = dir / "dump";
  WriteDump(root + "/step0/rank0", size_t{256} << 20);
  {
    std::ifstream warm(root + "/step0/rank0/dump.json", std::ios::binary);
    std::vector<char> buf(1 << 20);
    while (warm.read(buf.data(), static_cast<std::streamsize>(buf.size())) || warm.gcount() > 0) {
    }
  }
  std::vector<double> rates;
  uint64_t bytes = 0, records = 0;
  for (int rep = 0; rep < 3; ++rep) {
    lockstep::collector::MsprobeImportOptions o;
    o.dump_dir = root;
    o.out_path = dir / "run.lslog";
    lockstep::collector::MsprobeImportSummary sum;
    const auto t0 = std::chrono::steady_clock::now();
    lockstep::Status s = lockstep::collector::ImportMsprobe(o, &sum);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!s.ok()) {
      std::fprintf(stderr, "import failed: %s\n", s.message().c_str());
      return 1;
    }
    bytes = sum.json_bytes;
    records = sum.records;
    rates.push_back(sum.json_bytes / 1e6 / secs);
    std::fprintf(stderr, "import %d: %.1f MB in %.2f s (%.1f MB/s), %llu records\n", rep, sum.json_bytes / 1e6, secs,
                 rates.back(), static_cast<unsigned long long>(sum.records));
  }
  std::sort(rates.begin(), rates.end());
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::fprintf(stderr, "dump.json %.1f MB, %llu records; peak RSS %.1f MB\n", bytes / 1e6,
               static_cast<unsigned long long>(records), ru.ru_maxrss / 1024.0);
  std::printf("BENCH msprobe_import_mb_per_s %.1f MB/s\n", rates[1]);
  return 0;
}
