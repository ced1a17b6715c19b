#include "interop/msprobe_import.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "interop/json_stream.h"
#include "interop/msprobe_layout.h"
#include "interop/msprobe_names.h"
#include "interop/msprobe_record.h"
#include "lockstep/common/wire.h"
#include "lockstep/schema/lockstep_generated.h"
#include "runlog/log_writer.h"

namespace lockstep::collector {
namespace {

namespace fs = std::filesystem;
using msprobe::Entry;
using msprobe::EntryKind;
using msprobe::Pass;
using msprobe::Tensor;
using msprobe::Value;
using Token = JsonStream::Token;

// Records per StepStats message: well under the collector's 16 MiB message cap
// (a TensorStat is 112 bytes) and few enough messages for a large step.
constexpr size_t kBatch = 4096;
// Orders: each dump.json entry i owns [i * kSlots, (i + 1) * kSlots): the inputs of the
// modules that start at it (outermost first) in the lower half, its own records in the
// upper half. Orders need not be dense, only in execution order (docs/msprobe.md).
constexpr uint64_t kSlots = 256;

wire::Role ParseRole(const std::string& r, bool* ok) {
  *ok = true;
  if (r == "baseline") return wire::Role::Baseline;
  if (r == "candidate") return wire::Role::Candidate;
  if (r == "solo") return wire::Role::Solo;
  if (r == "unknown") return wire::Role::Unknown;
  *ok = false;
  return wire::Role::Unknown;
}

// lockstep's limit dtype (docs/statistics.md "limit_dtype"): the tensor's own
// low-precision float, fp16 for fp32/fp64, none otherwise.
wire::DType LimitDType(uint8_t code) {
  switch (code) {
    case 2: case 3: case 11: case 12: return static_cast<wire::DType>(code);
    case 1: case 4: return wire::DType::F16;
    default: return wire::DType::Unknown;
  }
}

// Full statistics rows of a tensor dump's files, computed by the agent's kernel
// (`python -m lockstep import-msprobe`, lockstep/_msprobe_rows.py): data_name -> [numel,
// min, max, mean, std, l2, absmax, nan, inf, zero, sat, subnormal, limit_dtype,
// sketch[k], hist[bins]].
struct FullRows {
  int k = 0, bins = 0;
  std::unordered_map<std::string, std::vector<double>> rows;
};

constexpr size_t kRowFields = 13;

Status ReadFullRows(const std::string& path, FullRows* out) {
  out->rows.clear();
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::OK();  // no tensor files in this folder
  auto js = JsonStream::Open(path);
  if (!js.ok()) return js.status();
  auto bad = [&]() { return Status::Corruption(path + ": not a rows file of python -m lockstep import-msprobe"); };
  Token t;
  if (Status s = (*js)->Next(&t); !s.ok()) return s;
  if (t != Token::kBeginObject) return bad();
  for (;;) {
    if (Status s = (*js)->Next(&t); !s.ok()) return s;
    if (t == Token::kEndObject) break;
    const std::string key = (*js)->text();
    if (Status s = (*js)->Next(&t); !s.ok()) return s;
    if ((key == "sketch_k" || key == "hist_bins") && t == Token::kNumber) {
      const double v = (*js)->number();
      (key == "sketch_k" ? out->k : out->bins) = v >= 0 && v <= 4096 ? static_cast<int>(v) : -1;
    } else if (key == "rows" && t == Token::kBeginObject) {
      for (;;) {
        if (Status s = (*js)->Next(&t); !s.ok()) return s;
        if (t == Token::kEndObject) break;
        std::vector<double>& row = out->rows[(*js)->text()];
        if (Status s = (*js)->Next(&t); !s.ok()) return s;
        if (t != Token::kBeginArray) return bad();
        for (;;) {
          if (Status s = (*js)->Next(&t); !s.ok()) return s;
          if (t == Token::kEndArray) break;
          if (t != Token::kNumber) return bad();
          row.push_back((*js)->number());
        }
      }
    } else if (Status s = (*js)->Skip(t); !s.ok()) {
      return s;
    }
  }
  if (out->k < 0 || out->k > kMaxSketchK || out->bins < 0 || out->bins > 255) return bad();
  for (const auto& [name, row] : out->rows) {
    if (row.size() != kRowFields + out->k + out->bins) return bad();
  }
  return Status::OK();
}

// One rank's messages: its sequence numbers, tensor ids and directory, and the batch
// of records of the step being read.
class RankStream {
 public:
  RankStream(uint32_t rank, LogWriter* log, const MsprobeImportOptions& o, wire::Role role, uint64_t world,
             uint64_t first_step, int64_t* clock)
      : rank_(rank), log_(log), opt_(o), role_(role), world_(world), first_step_(first_step), clock_(clock) {}

  Status Hello() {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<wire::TensorKind> kinds{wire::TensorKind::Act, wire::TensorKind::ActIn, wire::TensorKind::ActGrad,
                                        wire::TensorKind::ParamGrad, wire::TensorKind::Param};
    auto sampling = wire::CreateSamplingConfigDirect(fbb, 1, 0, 0, "", "", &kinds);
    auto hello = wire::CreateHelloDirect(fbb, opt_.experiment.c_str(), role_, "msprobe", "",
                                         "pytorch (msprobe dump)", static_cast<uint32_t>(world_), "", 0,
                                         "lockstep import msprobe", 0, first_step_, sampling);
    return Send(fbb, wire::Body::Hello, hello.Union());
  }

  // The id of (name, kind), sending its directory entry with the next batch if new.
  uint32_t Id(const std::string& name, wire::TensorKind kind, const Tensor& t, uint32_t order,
              const std::string& module_type) {
    // A 64-bit hash of (kind, name) rather than the name: the directory of a large
    // model holds millions of names, and a collision among them is ~1e-7 likely.
    uint64_t key = 0xCBF29CE484222325ull ^ static_cast<uint64_t>(kind);
    for (const char ch : name) key = (key ^ static_cast<unsigned char>(ch)) * 0x100000001B3ull;
    auto [it, fresh] = ids_.emplace(key, next_id_);
    if (fresh) {
      ++next_id_;
      dir_.push_back(DirEntry{it->second, name, kind, msprobe::DTypeCode(t.dtype), t.shape, order, module_type});
    }
    return it->second;
  }

  // The full rows of the tensor files of the folder being read (null: none).
  void SetFullRows(const FullRows* rows) { full_rows_ = rows; }

  Status Add(const std::string& name, wire::TensorKind kind, const Tensor& t, uint64_t order,
             const std::string& module_type) {
    const uint32_t ord = static_cast<uint32_t>(std::min<uint64_t>(order, UINT32_MAX));
    const uint32_t id = Id(name, kind, t, ord, module_type);
    if (full_rows_ != nullptr && !t.data_name.empty()) {
      const auto it = full_rows_->rows.find(t.data_name);
      if (it != full_rows_->rows.end()) return AddFull(id, ord, it->second);
    }
    const uint8_t code = msprobe::DTypeCode(t.dtype);
    // What the dump says of non-finite values: a NaN statistic means the tensor held a
    // NaN, an infinite one an Inf. The counts are lower bounds ("at least one").
    const bool nan = std::isnan(t.max) || std::isnan(t.min) || std::isnan(t.mean) || std::isnan(t.norm);
    const bool inf = !nan && (std::isinf(t.max) || std::isinf(t.min) || std::isinf(t.mean) || std::isinf(t.norm));
    const double absmax = nan || inf ? NAN : std::max(std::fabs(t.max), std::fabs(t.min));
    stats_.emplace_back(id, 0u, ord, LimitDType(code), static_cast<uint8_t>(wire::StatFlags::kStatsOnly),
                        static_cast<uint16_t>(0), t.numel(), t.min, t.max, t.mean, NAN, t.norm, absmax,
                        nan ? 1ull : 0ull, inf ? 1ull : 0ull, 0ull, 0ull, 0ull);
    ++step_records_;
    ++records_;
    if (stats_.size() >= kBatch) return Flush();
    return Status::OK();
  }

  // A row the agent's kernel computed from the tensor itself: every field, the sketch
  // and the histogram, as a live run's.
  Status AddFull(uint32_t id, uint32_t ord, const std::vector<double>& r) {
    auto u = [&](size_t i) { return r[i] >= 0 && r[i] < 1.8e19 ? static_cast<uint64_t>(r[i]) : uint64_t{0}; };
    const uint8_t limit = r[12] >= 0 && r[12] < 256 ? static_cast<uint8_t>(r[12]) : 0;
    full_.emplace_back(id, 0u, ord, static_cast<wire::DType>(limit), static_cast<uint8_t>(0),
                       static_cast<uint16_t>(0), u(0), r[1], r[2], r[3], r[4], r[5], r[6], u(7), u(8), u(9), u(10),
                       u(11));
    for (int i = 0; i < full_rows_->k; ++i) sketch_.push_back(static_cast<float>(r[kRowFields + i]));
    for (int i = 0; i < full_rows_->bins; ++i) hist_.push_back(static_cast<uint32_t>(std::min<uint64_t>(u(kRowFields + full_rows_->k + i), UINT32_MAX)));
    full_k_ = full_rows_->k;
    full_bins_ = full_rows_->bins;
    ++step_records_;
    ++records_;
    ++full_records_;
    if (full_.size() >= kBatch) return Flush();
    return Status::OK();
  }

  Status Flush() {
    if (!dir_.empty()) {
      flatbuffers::FlatBufferBuilder fbb;
      std::vector<flatbuffers::Offset<wire::TensorInfo>> infos;
      for (const auto& d : dir_) {
        infos.push_back(wire::CreateTensorInfoDirect(fbb, d.id, d.name.c_str(), d.kind, static_cast<wire::DType>(d.dtype),
                                                     &d.shape, d.order,
                                                     d.module_type.empty() ? nullptr : d.module_type.c_str()));
      }
      auto body = wire::CreateTensorDirectoryDirect(fbb, &infos);
      if (Status s = Send(fbb, wire::Body::TensorDirectory, body.Union()); !s.ok()) return s;
      dir_.clear();
    }
    if (!full_.empty()) {
      flatbuffers::FlatBufferBuilder fbb(1024 + full_.size() * sizeof(wire::TensorStat) + sketch_.size() * 4 +
                                         hist_.size() * 4);
      auto body = wire::CreateStepStatsDirect(fbb, step_, &full_, static_cast<uint16_t>(full_k_), &sketch_,
                                              static_cast<uint8_t>(full_bins_), &hist_);
      full_.clear();
      sketch_.clear();
      hist_.clear();
      if (Status s = Send(fbb, wire::Body::StepStats, body.Union()); !s.ok()) return s;
    }
    if (stats_.empty()) return Status::OK();
    flatbuffers::FlatBufferBuilder fbb(1024 + stats_.size() * sizeof(wire::TensorStat));
    auto body = wire::CreateStepStatsDirect(fbb, step_, &stats_, 0, nullptr, 0, nullptr);
    stats_.clear();
    return Send(fbb, wire::Body::StepStats, body.Union());
  }

  void BeginStep(uint64_t step) {
    step_ = step;
    step_records_ = 0;
  }

  Status EndStep() {
    if (Status s = Flush(); !s.ok()) return s;
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<uint32_t> micro{static_cast<uint32_t>(step_records_)};
    auto body = wire::CreateStepEndDirect(fbb, step_, step_records_, step_records_ ? &micro : nullptr);
    return Send(fbb, wire::Body::StepEnd, body.Union());
  }

  Status Goodbye(uint64_t last_step) {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = wire::CreateGoodbyeDirect(fbb, "import", last_step);
    return Send(fbb, wire::Body::Goodbye, body.Union());
  }

  uint64_t records() const { return records_; }
  uint64_t full_records() const { return full_records_; }

 private:
  struct DirEntry {
    uint32_t id;
    std::string name;
    wire::TensorKind kind;
    uint8_t dtype;
    std::vector<int64_t> shape;
    uint32_t order;
    std::string module_type;
  };

  Status Send(flatbuffers::FlatBufferBuilder& fbb, wire::Body type, flatbuffers::Offset<void> body) {
    auto run = fbb.CreateString(opt_.run);
    wire::EnvelopeBuilder e(fbb);
    e.add_schema_major(kSchemaMajor);
    e.add_schema_minor(kSchemaMinor);
    e.add_run_id(run);
    e.add_rank(rank_);
    e.add_seq(seq_++);
    e.add_session(session_);
    e.add_sent_unix_ns(*clock_);
    e.add_body_type(type);
    e.add_body(body);
    fbb.Finish(e.Finish(), wire::EnvelopeIdentifier());
    const int64_t t = (*clock_)++;  // receive times in the file's order
    return log_->Append(fbb.GetBufferPointer(), fbb.GetSize(), t);
  }

  uint32_t rank_;
  LogWriter* log_;
  const MsprobeImportOptions& opt_;
  wire::Role role_;
  uint64_t world_, first_step_;
  int64_t* clock_;
  uint64_t seq_ = 0, session_ = 0x6D7370726F6265ull;  // "msprobe"
  uint64_t step_ = 0, step_records_ = 0, records_ = 0;
  uint32_t next_id_ = 0;
  std::unordered_map<uint64_t, uint32_t> ids_;
  std::vector<DirEntry> dir_;
  std::vector<wire::TensorStat> stats_;
  // Full rows (StepStats with a sketch and histogram): a message of their own, since a
  // message's records share one sketch width.
  const FullRows* full_rows_ = nullptr;
  std::vector<wire::TensorStat> full_;
  std::vector<float> sketch_;
  std::vector<uint32_t> hist_;
  int full_k_ = 0, full_bins_ = 0;
  uint64_t full_records_ = 0;
};

// Reads construct.json: {entry: enclosing module's entry, or null}. Missing: empty.
Status ReadConstruct(const std::string& path, std::unordered_map<std::string, std::string>* out) {
  out->clear();
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::OK();
  auto js = JsonStream::Open(path);
  if (!js.ok()) return js.status();
  Token t;
  if (Status s = (*js)->Next(&t); !s.ok()) return s;
  if (t != Token::kBeginObject) return Status::Corruption(path + ": not msprobe's construct.json (not a JSON object)");
  for (;;) {
    if (Status s = (*js)->Next(&t); !s.ok()) return s;
    if (t == Token::kEndObject) break;
    std::string key = (*js)->text();
    if (Status s = (*js)->Next(&t); !s.ok()) return s;
    if (t == Token::kString) {
      (*out)[std::move(key)] = (*js)->text();
    } else if (Status s = (*js)->Skip(t); !s.ok()) {
      return s;
    }
  }
  return Status::OK();
}

// One dump.json (one step of one rank) into `rank`'s stream.
class StepReader {
 public:
  StepReader(RankStream* out, const std::unordered_map<std::string, std::string>* construct)
      : out_(out), construct_(construct) {}

  // The entries of the "data" object; `js` is just past its '{'.
  Status ReadData(JsonStream* js) {
    Token t;
    Value record;
    for (;;) {
      if (Status s = js->Next(&t); !s.ok()) return s;
      if (t == Token::kEndObject) return Status::OK();
      const std::string name = js->text();
      if (Status s = js->Next(&t); !s.ok()) return s;
      if (Status s = msprobe::ReadValue(js, t, &record); !s.ok()) return s;
      if (Status s = Entry(name, record); !s.ok()) return s;
      ++entries_;
    }
  }

  uint64_t entries() const { return entries_; }

 private:
  // The parent entry of `entry` in construct.json ("" if none).
  const std::string& Parent(const std::string& entry) const {
    static const std::string kNone;
    const auto it = construct_->find(entry);
    return it == construct_->end() ? kNone : it->second;
  }

  // lockstep's name of a module entry's call: its path, #n for a later call.
  static std::string ModuleBase(const msprobe::Entry& e) { return msprobe::CallName(e.path, e.n); }

  // The module (lockstep base name) an API entry ran in, from construct.json.
  std::string Container(const std::string& parent) const {
    if (parent.empty()) return msprobe::kRootName;
    if (parent == "optimizer") return msprobe::kOptimizerName;
    const msprobe::Entry p = msprobe::ParseEntry(parent);
    if (p.kind != EntryKind::kModule) return msprobe::kRootName;
    return ModuleBase(p);
  }

  // Modules enclosing a forward entry: the first entry seen inside a module is where it
  // started, which is where its inputs go in execution order.
  void NoteStart(const std::string& name, uint64_t i) {
    int guard = 0;
    for (const std::string* p = &Parent(name); !p->empty() && guard < 256; p = &Parent(*p), ++guard) {
      if (!start_.emplace(*p, i).second) break;  // its ancestors are known already
    }
  }

  int Depth(const std::string& name) const {
    int d = 0;
    for (const std::string* p = &Parent(name); !p->empty() && d < 256; p = &Parent(*p)) ++d;
    return d;
  }

  // Each tensor of an output-like value (a module's or API's outputs, the gradients of
  // them), named as lockstep's _names.output_tensors names them.
  Status Outputs(const Value* v, const std::string& base, wire::TensorKind kind, uint64_t* slot,
                 const std::string& type) {
    if (v == nullptr) return Status::OK();
    if (v->type == Value::Type::kList && v->items.size() == 1) return Walk(v->items[0].second, base, kind, slot, type, 0);
    return Walk(*v, base, kind, slot, type, 0);
  }

  Status Walk(const Value& v, const std::string& name, wire::TensorKind kind, uint64_t* slot, const std::string& type,
              int depth) {
    switch (v.type) {
      case Value::Type::kTensor:
        if (!v.tensor.has_stats) return Status::OK();  // md5 / none: nothing to compare
        if (kind != wire::TensorKind::ParamGrad && !msprobe::IsFloatDType(v.tensor.dtype)) return Status::OK();
        return out_->Add(name, kind, v.tensor, (*slot)++, type);
      case Value::Type::kList:
        if (depth >= 4) return Status::OK();
        for (size_t i = 0; i < v.items.size(); ++i) {
          if (Status s = Walk(v.items[i].second, name + "[" + std::to_string(i) + "]", kind, slot, type, depth + 1);
              !s.ok())
            return s;
        }
        return Status::OK();
      case Value::Type::kDict:
        if (depth >= 4) return Status::OK();
        for (const auto& [k, item] : v.items) {
          if (Status s = Walk(item, name + "[" + k + "]", kind, slot, type, depth + 1); !s.ok()) return s;
        }
        return Status::OK();
      default:
        return Status::OK();
    }
  }

  // What a module or op received, named as _names.input_names names it.
  Status Inputs(const Value& record, const std::string& base, uint64_t* slot, const std::string& type) {
    const Value* args = record.Find("input_args");
    const Value* kwargs = record.Find("input_kwargs");
    std::vector<std::pair<std::string, const Tensor*>> items;
    auto floating = [](const Value& v) {
      return v.type == Value::Type::kTensor && v.tensor.has_stats && msprobe::IsFloatDType(v.tensor.dtype);
    };
    auto add = [&](const std::string& label, const Value& v) {
      if (v.type == Value::Type::kTensor) {
        if (floating(v)) items.emplace_back(base + "(" + label + ")", &v.tensor);
      } else if (v.type == Value::Type::kList) {
        for (size_t j = 0; j < v.items.size(); ++j) {
          if (floating(v.items[j].second))
            items.emplace_back(base + "(" + label + ")[" + std::to_string(j) + "]", &v.items[j].second.tensor);
        }
      }
    };
    const bool no_kwargs = kwargs == nullptr || kwargs->items.empty();
    if (no_kwargs && args != nullptr && args->type == Value::Type::kList && args->items.size() == 1 &&
        args->items[0].second.type == Value::Type::kTensor) {
      if (floating(args->items[0].second)) items.emplace_back(base, &args->items[0].second.tensor);
    } else {
      if (args != nullptr && args->type == Value::Type::kList) {
        for (size_t i = 0; i < args->items.size(); ++i) add(std::to_string(i), args->items[i].second);
      }
      if (kwargs != nullptr && kwargs->type == Value::Type::kDict) {
        for (const auto& [k, v] : kwargs->items) add(k, v);
      }
      if (items.size() == 1) items[0].first = base;
    }
    for (const auto& [name, t] : items) {
      if (Status s = out_->Add(name, wire::TensorKind::ActIn, *t, (*slot)++, type); !s.ok()) return s;
    }
    return Status::OK();
  }

  Status Entry(const std::string& name, const Value& record) {
    const uint64_t i = index_++;
    const msprobe::Entry e = msprobe::ParseEntry(name);
    if (e.kind == EntryKind::kUnknown || record.type != Value::Type::kDict) return Status::OK();  // not a call
    uint64_t own = i * kSlots + kSlots / 2;
    if (e.kind == EntryKind::kModule) {
      const std::string base = ModuleBase(e);
      if (e.pass == Pass::kForward) {
        NoteStart(name, i);
        const auto st = start_.find(name);
        const uint64_t first = st == start_.end() ? i : st->second;
        if (st != start_.end()) start_.erase(st);
        calls_.erase(base);  // its calls are over
        uint64_t in_slot = first * kSlots + static_cast<uint64_t>(std::min(Depth(name), 7)) * 16;
        if (Status s = Inputs(record, base, &in_slot, e.cls); !s.ok()) return s;
        if (Status s = Outputs(record.Find("output"), base, wire::TensorKind::Act, &own, e.cls); !s.ok()) return s;
        // Parameter values at the first call (the weights this step used).
        const Value* params = record.Find("parameters");
        if (e.n == 0 && params != nullptr && params->type == Value::Type::kDict) {
          for (const auto& [p, v] : params->items) {
            if (v.type != Value::Type::kTensor || !v.tensor.has_stats) continue;
            if (Status s = out_->Add(e.path + "." + p, wire::TensorKind::Param, v.tensor, own++, e.cls); !s.ok())
              return s;
          }
        }
        return Status::OK();
      }
      if (e.pass == Pass::kBackward) {
        return Outputs(record.Find("input"), base, wire::TensorKind::ActGrad, &own, e.cls);
      }
      // parameters_grad: {name: [tensor]}
      for (const auto& [p, v] : record.items) {
        const Value* t = &v;
        if (t->type == Value::Type::kList && t->items.size() == 1) t = &t->items[0].second;
        if (t->type != Value::Type::kTensor || !t->tensor.has_stats) continue;
        if (Status s = out_->Add(e.path + "." + p, wire::TensorKind::ParamGrad, t->tensor, own++, e.cls); !s.ok())
          return s;
      }
      return Status::OK();
    }
    // An API call: an op inside its module, `module/func#k`.
    const std::string func = msprobe::FuncName(e);
    if (e.pass == Pass::kForward) {
      NoteStart(name, i);
      const std::string module = Container(Parent(name));
      const uint64_t k = calls_[module][func]++;
      std::string op = module + "/" + func + "#" + std::to_string(k);
      if (Status s = Inputs(record, op, &own, func); !s.ok()) return s;
      if (Status s = Outputs(record.Find("output"), op, wire::TensorKind::Act, &own, func); !s.ok()) return s;
      ops_[e.call] = std::move(op);
      return Status::OK();
    }
    // Its backward: the gradient of its output, under the forward's name.
    auto it = ops_.find(e.call);
    std::string op;
    if (it != ops_.end()) {
      op = std::move(it->second);
      ops_.erase(it);
    } else {
      op = std::string(msprobe::kRootName) + "/" + func + "#" + std::to_string(e.n);
    }
    return Outputs(record.Find("input"), op, wire::TensorKind::ActGrad, &own, func);
  }

  RankStream* out_;
  const std::unordered_map<std::string, std::string>* construct_;
  uint64_t index_ = 0, entries_ = 0;
  std::unordered_map<std::string, uint64_t> start_;   // module entry -> first entry inside it
  // module call -> func -> calls so far, while the module runs
  std::unordered_map<std::string, std::unordered_map<std::string, uint64_t>> calls_;
  std::unordered_map<std::string, std::string> ops_;  // API call -> its op name, until its backward
};

// A value of the file inside a message: control characters would break its one line.
std::string Printable(std::string s) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20) c = '?';
  }
  return s.size() > 64 ? s.substr(0, 64) + "..." : s;
}

// One dump.json: its header keys, then "data" through `reader`.
Status ReadDump(const std::string& path, StepReader* reader, MsprobeImportSummary* sum, uint64_t* bytes) {
  auto opened = JsonStream::Open(path);
  if (!opened.ok()) return opened.status();
  JsonStream* js = opened->get();
  Token t;
  if (Status s = js->Next(&t); !s.ok()) return s;
  if (t != Token::kBeginObject) return Status::Corruption(path + ": not msprobe's dump.json (not a JSON object)");
  bool data = false;
  std::string framework;
  for (;;) {
    if (Status s = js->Next(&t); !s.ok()) return s;
    if (t == Token::kEndObject) break;
    const std::string key = js->text();
    if (Status s = js->Next(&t); !s.ok()) return s;
    if (key == "data" && t == Token::kBeginObject) {
      if (framework == "mindspore") break;
      if (Status s = reader->ReadData(js); !s.ok()) return s;
      data = true;
    } else if (t == Token::kString && (key == "framework" || key == "task" || key == "level")) {
      (key == "framework" ? framework : key == "task" ? sum->task : sum->level) = js->text();
    } else if (Status s = js->Skip(t); !s.ok()) {
      return s;
    }
  }
  if (framework == "mindspore") {
    return Status::InvalidArgument(path + ": a MindSpore dump (framework \"mindspore\"): not supported yet; lockstep "
                                          "imports msprobe's PyTorch dumps");
  }
  if (!framework.empty() && framework != "pytorch") {
    return Status::InvalidArgument(path + ": framework \"" + Printable(framework) + "\" is not supported; lockstep imports "
                                          "msprobe's PyTorch dumps");
  }
  if (!data) return Status::Corruption(path + ": not msprobe's dump.json (no \"data\" object)");
  if (!sum->task.empty() && sum->task != "statistics" && sum->task != "tensor") {
    return Status::InvalidArgument(path + ": task \"" + Printable(sum->task) + "\" holds no statistics; lockstep imports "
                                          "msprobe's statistics and tensor dumps");
  }
  *bytes += js->offset();
  return Status::OK();
}

}  // namespace

std::string RunIdFromPath(const std::string& path) {
  std::string base = fs::path(path).lexically_normal().filename().string();
  if (base.empty() || base == "." || base == "..") base = fs::absolute(path).lexically_normal().parent_path().filename().string();
  std::string id;
  for (char c : base) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    id += ok ? c : '-';
  }
  while (!id.empty() && id.front() == '.') id.erase(0, 1);
  if (id.size() > kMaxRunIdLength) id.resize(kMaxRunIdLength);
  return id.empty() ? "msprobe" : id;
}

bool IsMsprobeDumpDir(const std::string& path) { return msprobe::LooksLikeDump(path); }

Status ImportMsprobe(const MsprobeImportOptions& options, MsprobeImportSummary* summary) {
  MsprobeImportOptions o = options;
  if (o.run.empty()) o.run = RunIdFromPath(o.dump_dir);
  if (!IsValidRunId(o.run)) {
    return Status::InvalidArgument("'" + o.run + "' is not a run id (1-128 characters of A-Z a-z 0-9 . _ -, not "
                                   "starting with '.')");
  }
  if (o.experiment.empty()) o.experiment = o.run;
  bool role_ok;
  const wire::Role role = ParseRole(o.role, &role_ok);
  if (!role_ok) return Status::InvalidArgument("role '" + o.role + "' is not one of baseline, candidate, solo, unknown");
  msprobe::Layout layout;
  if (Status s = msprobe::FindLayout(o.dump_dir, &layout); !s.ok()) return s;

  // Written under a temporary name beside the output, renamed when complete.
  const std::string tmp = o.out_path + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove(tmp, ec);
  auto log = LogWriter::Open(tmp, /*recover=*/false, 1 << 20);
  if (!log.ok()) return Status::IOError("cannot write " + o.out_path + ": " + log.status().message());
  auto fail = [&](const Status& s) {
    log->reset();
    fs::remove(tmp, ec);
    return s;
  };

  MsprobeImportSummary sum;
  sum.run = o.run;
  int64_t clock = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count();
  std::unordered_map<uint32_t, std::unique_ptr<RankStream>> ranks;
  std::unordered_map<std::string, std::string> construct;
  FullRows full;
  uint64_t last_step = 0;
  for (const auto& part : layout.parts) {
    auto& rs = ranks[part.rank];
    if (!rs) {
      rs = std::make_unique<RankStream>(part.rank, log->get(), o, role, layout.ranks, layout.parts.front().step, &clock);
      if (Status s = rs->Hello(); !s.ok()) return fail(s);
    }
    if (Status s = ReadConstruct(part.dir + "/construct.json", &construct); !s.ok()) return fail(s);
    if (!o.rows_dir.empty()) {
      const std::string rel = fs::path(part.dir).lexically_relative(o.dump_dir).string();
      if (Status s = ReadFullRows(o.rows_dir + "/" + rel + "/lockstep_rows.json", &full); !s.ok()) return fail(s);
      rs->SetFullRows(&full);
    }
    StepReader reader(rs.get(), &construct);
    rs->BeginStep(part.step);
    if (Status s = ReadDump(part.dir + "/dump.json", &reader, &sum, &sum.json_bytes); !s.ok()) return fail(s);
    if (Status s = rs->EndStep(); !s.ok()) return fail(s);
    sum.entries += reader.entries();
    last_step = std::max(last_step, part.step);
  }
  for (auto& [rank, rs] : ranks) {
    if (Status s = rs->Goodbye(last_step); !s.ok()) return fail(s);
    sum.records += rs->records();
    sum.full_records += rs->full_records();
  }
  if (Status s = (*log)->Sync(); !s.ok()) return fail(s);
  log->reset();
  fs::rename(tmp, o.out_path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return Status::IOError("cannot write " + o.out_path + ": " + ec.message());
  }
  sum.steps = layout.steps;
  sum.ranks = layout.ranks;
  *summary = std::move(sum);
  return Status::OK();
}

}  // namespace lockstep::collector
