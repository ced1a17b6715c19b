#include "cli/dump_inputs.h"

#include <stdlib.h>

#include <filesystem>
#include <system_error>

#include "interop/msprobe_import.h"

namespace lockstep::cli {

DumpInputs::~DumpInputs() {
  if (dir_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

Status DumpInputs::Resolve(std::string* baseline, std::string* candidate) {
  const bool db = collector::IsMsprobeDumpDir(*baseline), dc = collector::IsMsprobeDumpDir(*candidate);
  if (!db && !dc) return Status::OK();
  std::error_code ec;
  std::string tmpl = (std::filesystem::temp_directory_path(ec) / "lockstep-msprobe-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return Status::IOError("cannot make a temporary folder for the dumps' imports");
  dir_ = tmpl;
  std::string id_b = collector::RunIdFromPath(*baseline), id_c = collector::RunIdFromPath(*candidate);
  if (db && dc && id_b == id_c) {  // two dumps of one folder name: compare needs two run ids
    id_b += "-baseline";
    id_c += "-candidate";
  }
  const struct {
    bool dump;
    std::string* path;
    const std::string& id;
    const char* role;
  } sides[] = {{db, baseline, id_b, "baseline"}, {dc, candidate, id_c, "candidate"}};
  for (const auto& s : sides) {
    if (!s.dump) continue;
    collector::MsprobeImportOptions o;
    o.dump_dir = *s.path;
    o.out_path = dir_ + "/" + s.role + ".lslog";
    o.run = s.id;
    o.role = s.role;
    collector::MsprobeImportSummary sum;
    if (Status st = collector::ImportMsprobe(o, &sum); !st.ok()) return st;
    *s.path = o.out_path;
  }
  return Status::OK();
}

}  // namespace lockstep::cli
