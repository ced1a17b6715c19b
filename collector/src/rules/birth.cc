#include "rules/birth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace lockstep::collector {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Distances are measured against at least this fraction of the peers' typical element
// magnitude: a tensor that is noise next to them is not judged by its own scale.
constexpr double kScaleFloor = 1e-3;

// Precision rank of a float dtype (lower = coarser); -1 for the others.
int PrecisionRank(DT d) {
  switch (d) {
    case DT::kF8E5M2: return 0;
    case DT::kF8E4M3: return 1;
    case DT::kBF16: return 2;
    case DT::kF16: return 3;
    case DT::kF32: return 4;
    case DT::kF64: return 5;
    default: return -1;
  }
}

DT Coarser(DT a, DT b) {
  const int ra = PrecisionRank(a), rb = PrecisionRank(b);
  if (ra < 0) return b;
  if (rb < 0) return a;
  return ra <= rb ? a : b;
}

DT Finer(DT a, DT b) {
  const int ra = PrecisionRank(a), rb = PrecisionRank(b);
  if (ra < 0) return b;
  if (rb < 0) return a;
  return ra >= rb ? a : b;
}

}  // namespace

double BirthFinder::UnitRoundoff(DT d) {
  switch (d) {
    case DT::kF64: return std::ldexp(1.0, -53);
    case DT::kF16: return std::ldexp(1.0, -11);
    case DT::kBF16: return std::ldexp(1.0, -8);
    case DT::kF8E4M3: return std::ldexp(1.0, -4);
    case DT::kF8E5M2: return std::ldexp(1.0, -3);
    default: return std::ldexp(1.0, -24);  // fp32, and what is not a float
  }
}

double BirthFinder::RelError(const StepData& bs, const StatRow& b, const StepData& cs, const StatRow& c,
                             double scale) {
  if (b.numel != c.numel) return kNaN;
  const bool nb = b.nonfinite(), nc = c.nonfinite();
  if (nb != nc) return INFINITY;
  if (nb) return kNaN;  // both hold NaN/Inf: the nonfinite rule's, not a distance
  // |l2_c - l2_b| <= ||c - b||: a lower bound that holds without a sketch.
  double d = std::fabs(c.l2 - b.l2);
  const float* sb = bs.SketchOf(b);
  const float* sc = cs.SketchOf(c);
  if (sb != nullptr && sc != nullptr && b.sketch_k == c.sketch_k) {
    d = std::max(d, SketchDistance(sb, sc, b.sketch_k));
  } else {
    const double n = std::sqrt(static_cast<double>(b.numel));
    d = std::max(d, std::fabs(c.mean - b.mean) * n);
    // A statistics-only row has no std (docs/msprobe.md).
    if (!b.stats_only && !c.stats_only) d = std::max(d, std::fabs(c.std - b.std) * n);
  }
  const double denom = std::max(b.l2, kScaleFloor * scale * std::sqrt(static_cast<double>(b.numel)));
  if (!(denom > 0)) return d == 0 ? 0 : INFINITY;
  return d / denom;
}

double BirthFinder::Noise(DT prec, uint64_t width) const {
  const double w = static_cast<double>(std::max<uint64_t>(width, 1));
  return UnitRoundoff(prec) * (cfg_->birth_ulps + 2.0 * std::sqrt(w));
}

int64_t BirthFinder::OpOf(uint32_t name_id, Kind kind) {
  const int which = kind == Kind::kActIn ? 0 : 1;
  auto& cache = op_of_[which];
  auto& none_since = no_since_[which];
  if (name_id >= cache.size()) {
    cache.resize(name_id + 1, -2);
    none_since.resize(name_id + 1, 0);
  }
  int64_t& op = cache[name_id];
  if (op >= 0 || (op == -1 && none_since[name_id] == Known())) return op;
  std::string name = names_->Name(name_id);
  if (kind == Kind::kActIn) {
    // "blocks.0.attn(1)", "blocks.0.attn(mask)[0]": inputs of blocks.0.attn; so is
    // "blocks.0.attn[1]" in logs written before that naming. Neither "(" nor "[" occurs
    // in a module path.
    auto cut = name.find('(');
    if (cut == std::string::npos && !name.empty() && name.back() == ']') cut = name.find('[');
    if (cut != std::string::npos) {
      name.resize(cut);
      if (names_->Find(name) < 0) {
        // A module with several inputs and several outputs: no tensor has its name.
        const std::string type = names_->ModuleType(name_id);
        const uint32_t id = names_->Intern(name);
        if (!type.empty()) names_->SetModuleType(id, type);
      }
    }
  } else {
    const auto cut = name.rfind('.');  // "fc1.weight" -> "fc1"
    if (cut == std::string::npos) {
      none_since[name_id] = Known();
      return op = -1;
    }
    name.resize(cut);
  }
  op = names_->Find(name);
  if (op < 0) none_since[name_id] = Known();
  return op;
}

int64_t BirthFinder::ElementOf(uint32_t name_id) {
  auto& cache = op_of_[2];
  auto& none_since = no_since_[2];
  if (name_id >= cache.size()) {
    cache.resize(name_id + 1, -2);
    none_since.resize(name_id + 1, 0);
  }
  int64_t& op = cache[name_id];
  if (op >= 0 || (op == -1 && none_since[name_id] == Known())) return op;
  auto with_inputs = [&](const std::string& n) -> int64_t {
    const int64_t id = names_->Find(n);
    return id >= 0 && static_cast<size_t>(id) < has_inputs_.size() && has_inputs_[static_cast<size_t>(id)] ? id : -1;
  };
  // "heads.logits": a namedtuple field of heads, unless it is a module of its own (it
  // has inputs, or a module type other than heads': a field's type is its module's).
  auto field_of = [&](const std::string& n) -> int64_t {
    const auto cut = n.rfind('.');
    if (cut == std::string::npos) return -1;
    const int64_t id = with_inputs(n.substr(0, cut));
    if (id < 0 || with_inputs(n) >= 0) return -1;
    const std::string& type = names_->ModuleType(name_id);
    return !type.empty() && type == names_->ModuleType(static_cast<uint32_t>(id)) ? id : -1;
  };
  const std::string name = names_->Name(name_id);
  const auto bracket = name.find('[');  // "attn[0]", "out[logits]", "heads.out[0]"
  if (bracket != std::string::npos) {
    const std::string base = name.substr(0, bracket);
    op = with_inputs(base);
    if (op < 0) op = field_of(base);
  } else {
    op = field_of(name);
  }
  if (op < 0) none_since[name_id] = Known();
  return op;
}

const std::vector<uint32_t>& BirthFinder::Ancestors(uint32_t op) {
  if (op >= ancestors_.size()) ancestors_.resize(op + 1);
  auto& [known, ids] = ancestors_[op];
  // Looked up again when names were added since (an op interned by OpOf).
  if (known != names_->size() + 1) {
    known = names_->size() + 1;
    ids.clear();
    std::string name = names_->Name(op);
    // "blocks.1.attn/softmax#0" (a call in attn's own code, recorded by a zoom) is within
    // blocks.1.attn, which is within blocks.1.
    for (auto cut = name.find_last_of("./"); cut != std::string::npos; cut = name.find_last_of("./")) {
      name.resize(cut);
      const int64_t id = names_->Find(name);
      if (id >= 0) ids.push_back(static_cast<uint32_t>(id));
    }
  }
  return ids;
}

void BirthFinder::MarkMoved(uint32_t op, std::vector<uint8_t>* moved) {
  // The op, and every enclosing module (a container's output moves with its child's
  // weights). Once per op: its ancestors were marked with it.
  if (Moved(op) || (op < moved->size() && (*moved)[op])) return;
  auto mark = [&](uint32_t id) {
    if (id >= moved->size()) moved->resize(id + 1, 0);
    (*moved)[id] = 1;
  };
  mark(op);
  for (uint32_t up : Ancestors(op)) mark(up);
}

bool BirthFinder::IsWithin(uint32_t inner, uint32_t outer) const {
  const std::string& in = names_->Name(inner);
  const std::string& out = names_->Name(outer);
  return in.size() > out.size() && in.compare(0, out.size(), out) == 0 &&
         (in[out.size()] == '.' || in[out.size()] == '/');
}

BirthFinder::Acc& BirthFinder::Slot(uint32_t op) {
  if (op >= slot_of_.size()) {
    slot_of_.resize(op + 1, 0);
    slot_stamp_.resize(op + 1, 0);
  }
  if (slot_stamp_[op] != stamp_) {
    slot_stamp_[op] = stamp_;
    slot_of_[op] = static_cast<uint32_t>(acc_.size());
    acc_.emplace_back();
    acc_.back().op = op;
  }
  return acc_[slot_of_[op]];
}

namespace {

// The same tensor in both runs: the statistics of two rows agree exactly.
bool SameStats(const StatRow& x, const StatRow& y) {
  const bool std_equal = x.std == y.std || (x.stats_only && y.stats_only);  // no std in the dump
  return x.numel == y.numel && x.l2 == y.l2 && x.mean == y.mean && std_equal && x.min == y.min &&
         x.max == y.max;
}

// Where to look an output up by its statistics (SameStats decides).
uint64_t StatsHash(const StatRow& r) {
  uint64_t h = r.numel * 0x9E3779B97F4A7C15ull;
  for (const double x : {r.l2, r.mean, r.std}) {
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    h = (h ^ bits) * 0x100000001B3ull;
  }
  return h;
}

}  // namespace

void BirthFinder::TraceInputs(const StepData& cs, const std::vector<BirthRow>& rows) {
  fwd_.clear();
  input_orders_.clear();
  cons_.clear();
  root_.assign(rows.size(), -1);
  outputs_by_stats_.clear();
  for (size_t i = 0; i < rows.size(); ++i) {
    const uint64_t key = rows[i].c->key;
    if (KeyMicroStep(key) != 0) continue;
    const Kind k = KeyKind(key);
    if (k == Kind::kAct || k == Kind::kActIn) fwd_.emplace_back(rows[i].c->order, static_cast<uint32_t>(i));
  }
  for (const StatRow& r : cs.rows) {
    if (KeyKind(r.key) == Kind::kInput && KeyMicroStep(r.key) == 0) input_orders_.push_back(r.order);
  }
  std::sort(fwd_.begin(), fwd_.end());
  std::sort(input_orders_.begin(), input_orders_.end());
  for (size_t p = 0; p < fwd_.size(); ++p) {
    const auto [order, i] = fwd_[p];
    const BirthRow& r = rows[i];
    // The tensor recorded just before it (what a repeat repeats).
    int32_t before = -1;
    if (p > 0 && fwd_[p - 1].first + 1 == order) {
      before = root_[fwd_[p - 1].second];
    } else if (order > 0 && std::binary_search(input_orders_.begin(), input_orders_.end(), order - 1)) {
      before = -2;
    }
    const bool repeat = r.b->repeat && r.c->repeat;
    const bool fresh = !r.b->repeat && !r.c->repeat;  // otherwise the runs disagree on it
    if (KeyKind(r.c->key) == Kind::kAct) {
      root_[i] = repeat ? before : static_cast<int32_t>(i);
      if (root_[i] == static_cast<int32_t>(i)) outputs_by_stats_[StatsHash(*r.c)] = i;  // the latest
      continue;
    }
    if (repeat) {
      root_[i] = before;
    } else if (fresh) {
      // A second consumer of an output: the latest earlier output equal to it in both runs.
      const auto it = outputs_by_stats_.find(StatsHash(*r.c));
      if (it != outputs_by_stats_.end() && SameStats(*rows[it->second].b, *r.b) &&
          SameStats(*rows[it->second].c, *r.c)) {
        root_[i] = static_cast<int32_t>(it->second);
      }
    }
    if (root_[i] < 0) continue;
    const int64_t op = OpOf(KeyNameId(r.c->key), Kind::kActIn);
    if (op >= 0) cons_.emplace_back(root_[i], static_cast<uint32_t>(op));
  }
  std::sort(cons_.begin(), cons_.end());
  cons_.erase(std::unique(cons_.begin(), cons_.end()), cons_.end());
  // For ConsumersOf: every name of an output, with the outermost consumers of its tensor.
  cons_by_name_.clear();
  out_names_.clear();
  for (const auto& [order, i] : fwd_) {
    if (KeyKind(rows[i].c->key) != Kind::kAct) continue;
    const uint32_t name = KeyNameId(rows[i].c->key);
    out_names_.push_back(name);
    const int32_t root = root_[i];
    if (root < 0) continue;
    auto it = std::lower_bound(cons_.begin(), cons_.end(), std::make_pair(root, 0u));
    const auto first = it;
    auto last = first;
    while (last != cons_.end() && last->first == root) ++last;
    for (it = first; it != last; ++it) {
      bool outer = true;
      for (auto jt = first; jt != last && outer; ++jt) outer = !IsWithin(it->second, jt->second);
      if (outer) cons_by_name_.emplace_back(name, it->second);
    }
  }
  std::sort(out_names_.begin(), out_names_.end());
  std::sort(cons_by_name_.begin(), cons_by_name_.end());
}

bool BirthFinder::ConsumersOf(uint32_t name_id, std::vector<uint32_t>* out) const {
  out->clear();
  if (!std::binary_search(out_names_.begin(), out_names_.end(), name_id)) return false;
  for (auto it = std::lower_bound(cons_by_name_.begin(), cons_by_name_.end(), std::make_pair(name_id, 0u));
       it != cons_by_name_.end() && it->first == name_id; ++it) {
    out->push_back(it->second);
  }
  return true;
}

int BirthFinder::Analyze(const StepData& bs, const StepData& cs, const std::vector<BirthRow>& rows,
                         const PeerScales& peers, std::vector<OpBirth>* ops) {
  ops->clear();
  acc_.clear();
  grads_.clear();
  params_.clear();
  ++stamp_;
  // Weights that got a differing gradient last step differ from this step on.
  if (moved_.size() < moved_next_.size()) moved_.resize(moved_next_.size(), 0);
  for (size_t i = 0; i < moved_next_.size(); ++i) moved_[i] |= moved_next_[i];

  for (const BirthRow& r : rows) {
    const uint64_t key = r.c->key;
    if (KeyMicroStep(key) != 0) continue;
    const Kind kind = KeyKind(key);
    const uint32_t name = KeyNameId(key);
    const double err = RelError(bs, *r.b, cs, *r.c, peers.Of(kind));
    const DT prec = Coarser(r.b->dtype, r.c->dtype);
    switch (kind) {
      case Kind::kAct: {
        Acc& a = Slot(name);
        a.has_out = true;
        a.out_err = err;
        a.out_order = r.c->order;
        a.out_b = r.b;
        a.out_c = r.c;
        a.prec = Coarser(a.prec, prec);
        break;
      }
      case Kind::kActIn: {
        const int64_t op = OpOf(name, kind);
        if (op < 0) break;
        if (static_cast<size_t>(op) >= has_inputs_.size()) has_inputs_.resize(static_cast<size_t>(op) + 1, 0);
        if (!has_inputs_[static_cast<size_t>(op)]) {
          has_inputs_[static_cast<size_t>(op)] = 1;
          ++n_input_ops_;
        }
        Acc& a = Slot(static_cast<uint32_t>(op));
        a.in_err = a.has_in ? std::max(a.in_err, err) : err;  // NaN stays NaN
        if (std::isnan(err)) a.in_err = kNaN;
        a.has_in = true;
        a.width = std::max(a.width, names_->Width(name));
        a.prec = Coarser(a.prec, prec);
        a.in_b = Coarser(a.in_b, r.b->dtype);
        a.in_c = Coarser(a.in_c, r.c->dtype);
        break;
      }
      case Kind::kActGrad:
        grads_.push_back(GradRow{&r, err});
        break;
      case Kind::kParamGrad:
      case Kind::kParam:
        if (err != 0) params_.push_back(&r);  // NaN and Inf included; after the ops are known
        break;
      default:
        break;
    }
  }

  // A parameter recorded at this step (kind param) differs now; a gradient moves the
  // weights at this step's update. (After the act_in rows: they intern the modules
  // that have no tensor of their name.)
  for (const BirthRow* r : params_) {
    const Kind kind = KeyKind(r->c->key);
    const int64_t op = OpOf(KeyNameId(r->c->key), kind);
    if (op >= 0) MarkMoved(static_cast<uint32_t>(op), kind == Kind::kParam ? &moved_ : &moved_next_);
  }

  // A module with several outputs (tuple, dict, ...) has rows for its elements only:
  // together they are its output, the largest error among them, the first recorded's
  // order. An element that cannot be measured (NaN: both nonfinite) is left out.
  const size_t n_acc = acc_.size();
  for (size_t i = 0; i < n_acc; ++i) {
    if (!acc_[i].has_out || acc_[i].has_in) continue;
    const int64_t id = ElementOf(acc_[i].op);
    if (id < 0) continue;
    const auto op = static_cast<uint32_t>(id);
    if (op >= slot_stamp_.size() || slot_stamp_[op] != stamp_) continue;
    Acc& e = acc_[i];
    Acc& p = acc_[slot_of_[op]];
    if (!p.has_in || (p.has_out && !p.from_elements)) continue;  // its output is a tensor
    e.element = true;
    if (std::isnan(e.out_err)) continue;
    if (!p.has_out || e.out_err > p.out_err) {
      p.out_err = e.out_err;
      p.out_b = e.out_b;
      p.out_c = e.out_c;
    }
    p.out_order = p.has_out ? std::min(p.out_order, e.out_order) : e.out_order;
    p.has_out = true;
    p.from_elements = true;
    p.prec = Coarser(p.prec, e.prec);
  }

  // A container computes with its submodules: their dtypes round its output too (a
  // block whose bf16 matmuls feed an fp32 residual add), so it gets the coarsest.
  for (const Acc& a : acc_) {
    for (uint32_t up : Ancestors(a.op)) {
      if (up < slot_stamp_.size() && slot_stamp_[up] == stamp_) {
        Acc& c = acc_[slot_of_[up]];
        c.prec = Coarser(c.prec, a.prec);
      }
    }
  }

  if (moved_since_.size() < moved_.size()) moved_since_.resize(moved_.size(), -1);
  for (size_t i = 0; i < moved_.size(); ++i) {
    if (moved_[i] && moved_since_[i] < 0) moved_since_[i] = static_cast<int64_t>(cs.step);
  }

  // Forward: inputs -> output.
  for (const Acc& a : acc_) {
    if (!a.has_in || !a.has_out || std::isnan(a.in_err) || std::isnan(a.out_err) || Moved(a.op)) continue;
    OpBirth o;
    o.op = a.op;
    o.input_error = a.in_err;
    o.output_error = a.out_err;
    o.dtype_b = a.out_b->dtype;
    o.dtype_c = a.out_c->dtype;
    // An op that hands on another float dtype in one run than in the other, from
    // inputs of the same dtypes, changed the precision itself (a kernel with an fp16
    // output): judged by the finer one, so its own rounding is what it adds.
    DT prec = a.prec;
    if (o.dtype_b != o.dtype_c && PrecisionRank(o.dtype_b) >= 0 && PrecisionRank(o.dtype_c) >= 0 && a.in_b == a.in_c) {
      o.precision = true;
      prec = Coarser(a.in_b, Finer(o.dtype_b, o.dtype_c));
    }
    o.explained = cfg_->birth_gain * a.in_err + Noise(prec == DT::kUnknown ? DT::kF32 : prec, a.width);
    o.ratio = o.output_error / o.explained;
    o.order = a.out_order;
    o.out_b = a.out_b;
    o.out_c = a.out_c;
    o.born = o.ratio > 1;
    ops->push_back(o);
  }
  // A container is not the birth point when a submodule of it is: the error is the child's.
  const size_t n_fwd = ops->size();
  for (size_t i = 0; i < n_fwd; ++i) {
    if (!((*ops)[i].ratio > 1)) continue;
    for (const Acc& a : acc_) {
      if (!a.element && a.op != (*ops)[i].op && IsWithin(a.op, (*ops)[i].op)) {
        (*ops)[i].container = true;
        break;
      }
    }
    for (size_t j = 0; j < n_fwd; ++j) {
      if (j != i && (*ops)[j].ratio > 1 && IsWithin((*ops)[j].op, (*ops)[i].op)) {
        (*ops)[i].born = false;
        break;
      }
    }
    // Born in its own code: which submodule its code handed a different input (beyond
    // that submodule's rounding noise, explained - gain x input_error).
    OpBirth& c = (*ops)[i];
    if (!c.born || !c.container) continue;
    size_t fed = n_fwd;
    for (size_t j = 0; j < n_fwd; ++j) {
      const OpBirth& f = (*ops)[j];
      if (j == i || !IsWithin(f.op, c.op) || !(f.input_error > f.explained - cfg_->birth_gain * f.input_error)) {
        continue;
      }
      // The outermost (a container before the child it hands the input on to), then
      // the earliest.
      const bool better = fed == n_fwd || IsWithin((*ops)[fed].op, f.op) ||
                          (!IsWithin(f.op, (*ops)[fed].op) && f.order < (*ops)[fed].order);
      if (better) fed = j;
    }
    if (fed < n_fwd) {
      c.has_fed = true;
      c.fed = (*ops)[fed].op;
    }
  }
  const OpBirth* birth = nullptr;
  for (size_t i = 0; i < n_fwd; ++i) {
    if ((*ops)[i].born && (birth == nullptr || (*ops)[i].order < birth->order)) birth = &(*ops)[i];
  }
  bool birth_backward = false;
  uint32_t birth_op = birth != nullptr ? birth->op : 0;

  // Backward: the gradient an op received (its output's) and the one it passed on (its
  // input's producer's, when no module beside it received that input).
  for (const GradRow& g : grads_) {
    const uint32_t name = KeyNameId(g.row->c->key);
    if (name >= slot_stamp_.size() || slot_stamp_[name] != stamp_) continue;
    Acc& a = acc_[slot_of_[name]];
    a.has_grad = true;
    a.grad_err = g.err;
    a.grad = g.row;
    a.has_recv = true;
    a.recv_err = g.err;
  }
  // A module with several outputs received all their gradients.
  for (const Acc& e : acc_) {
    if (!e.element || !e.has_grad) continue;
    const int64_t id = ElementOf(e.op);
    const auto op = static_cast<size_t>(id);
    if (id < 0 || op >= slot_stamp_.size() || slot_stamp_[op] != stamp_) continue;
    Acc& p = acc_[slot_of_[op]];
    if (p.has_grad) continue;  // its own output row's gradient
    p.recv_err = p.has_recv && !(e.grad_err > p.recv_err) ? p.recv_err : e.grad_err;
    p.has_recv = true;
  }
  TraceInputs(cs, rows);
  // cons_ groups the consumers of one tensor: an op is judged by that tensor's gradient
  // when every other consumer is nested with it (one chain: a container and its child).
  for (size_t g0 = 0; g0 < cons_.size();) {
    size_t g1 = g0;
    while (g1 < cons_.size() && cons_[g1].first == cons_[g0].first) ++g1;
    const StatRow& out = *rows[static_cast<size_t>(cons_[g0].first)].c;
    const uint32_t producer = KeyNameId(out.key);
    const bool has_grad = producer < slot_stamp_.size() && slot_stamp_[producer] == stamp_ &&
                          acc_[slot_of_[producer]].has_grad;
    for (size_t x = g0; x < g1 && has_grad; ++x) {
      const uint32_t op = cons_[x].second;
      bool sole = true;
      for (size_t y = g0; y < g1 && sole; ++y) {
        const uint32_t other = cons_[y].second;
        sole = other == op || IsWithin(other, op) || IsWithin(op, other);
      }
      if (!sole || op >= slot_stamp_.size() || slot_stamp_[op] != stamp_) continue;
      const Acc& p = acc_[slot_of_[producer]];
      Acc& a = acc_[slot_of_[op]];
      if (!a.has_pass || p.grad_err > a.pass_err || (std::isnan(p.grad_err) && !std::isnan(a.pass_err))) {
        a.pass_err = p.grad_err;
        a.pass = p.grad;
      }
      a.has_pass = true;
    }
    g0 = g1;
  }
  int64_t bwd = -1;  // index in ops of the first backward birth point
  for (const Acc& a : acc_) {
    if (a.element || !a.has_recv || !a.has_pass || a.pass == nullptr || std::isnan(a.recv_err) ||
        std::isnan(a.pass_err) || Moved(a.op)) {
      continue;
    }
    const BirthRow& passed = *a.pass;
    DT prec = Coarser(a.prec, Coarser(passed.b->dtype, passed.c->dtype));
    if (a.grad != nullptr) prec = Coarser(prec, Coarser(a.grad->b->dtype, a.grad->c->dtype));
    const double noise = Noise(prec == DT::kUnknown ? DT::kF32 : prec, a.width);
    // Its own forward must agree: a forward difference changes the backward too.
    if (!a.has_out || !(a.out_err <= noise) || (a.has_in && !(a.in_err <= noise))) continue;
    OpBirth o;
    o.op = a.op;
    o.backward = true;
    o.input_error = a.recv_err;
    o.output_error = a.pass_err;
    o.explained = cfg_->birth_gain * a.recv_err + noise;
    o.ratio = o.output_error / o.explained;
    o.order = passed.c->order;
    o.out_b = passed.b;
    o.out_c = passed.c;
    o.born = o.ratio > 1;
    ops->push_back(o);
  }
  // As in the forward: a container is not the birth point when a submodule of it is.
  for (size_t i = n_fwd; i < ops->size(); ++i) {
    if (!(*ops)[i].born) continue;
    for (size_t j = n_fwd; j < ops->size(); ++j) {
      if (j != i && (*ops)[j].ratio > 1 && IsWithin((*ops)[j].op, (*ops)[i].op)) {
        (*ops)[i].container = true;
        (*ops)[i].born = false;
        break;
      }
    }
  }
  for (size_t i = n_fwd; i < ops->size(); ++i) {
    if ((*ops)[i].born && (bwd < 0 || (*ops)[i].order < (*ops)[static_cast<size_t>(bwd)].order)) {
      bwd = static_cast<int64_t>(i);
    }
  }
  if (birth == nullptr && bwd >= 0) {
    birth_backward = true;
    birth_op = (*ops)[static_cast<size_t>(bwd)].op;
  }
  const bool found = birth != nullptr || bwd >= 0;
  // Ranked: the ops that add error of their own first (a container explained by its
  // child carries the child's error, not its own), then by ratio.
  std::stable_sort(ops->begin(), ops->end(), [](const OpBirth& x, const OpBirth& y) {
    return x.born != y.born ? x.born : x.ratio > y.ratio;
  });
  if (!found) return -1;
  for (size_t i = 0; i < ops->size(); ++i) {
    if ((*ops)[i].born && (*ops)[i].backward == birth_backward && (*ops)[i].op == birth_op) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace lockstep::collector
