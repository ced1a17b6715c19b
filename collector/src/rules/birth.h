// Where an error is born (docs/rules.md "Where the error is born").
//
// An operation whose inputs agree between the two runs while its output does not has
// added error of its own. Each watched module is an op: the agent records what it
// received (kind act_in, mostly repeats of the output before it, so free) and what it
// produced (act). At one compared step, for every op:
//
//   input_error   the largest relative distance ||c - b|| / ||b|| of its inputs
//   output_error  the same of its output
//   explained     birth_gain x input_error + u x (birth_ulps + 2 sqrt(width))
//
// with u the unit roundoff of the lowest-precision dtype among its inputs and output
// in either run (fp32 2^-24, bf16 2^-8, ...) and width the last dimension of its input
// (a reduction's length: a different summation order rounds differently, growing with
// it). An op whose output has another dtype in one run than in the other, from inputs
// of the same dtypes, changed the precision itself: it is judged by the finer dtype,
// so the rounding to the coarser one is the error it adds (cause "precision"). The
// gain allows an op to amplify the error it was handed (softmax, a
// normalization of a small-variance input). An op adds error of its own when
// output_error > explained; the birth point is the earliest such op in execution
// order, a container only when none of its submodules is one (the error is born in its
// own code between them, e.g. a softmax written inline). A container's dtype is the
// coarsest of its own and its submodules' (their rounding is in its output).
//
// Several outputs: a module that returns a tuple, list, dict (a transformers
// ModelOutput), namedtuple or dataclass has no output row of its own, only its
// elements' (attn[0], attn[1], out[logits], heads.logits). They are its output: its
// output_error is the largest of theirs (a change shows in some output, not always
// in the first), its order that of the first recorded, its dtype the coarsest. Its
// inputs are its act_in rows: "attn" for one, "attn(0)", "attn(key)" for several (and
// "attn[0]" in logs written before that naming: an act_in row ending in "]" is an
// input). The op is named by the module path, interned here when no tensor has that
// name (so messages say "blocks.0.attn (MultiheadAttention)"). A ".field" element is
// taken as a namedtuple field only of an op with inputs and no output row of its own,
// when the row's module type is the op's (a child module has its own type) and it has
// no inputs of its own.
//
// Backward: an op received the gradient of its output (its act_grad) and passed on the
// gradient of its input, which is the act_grad of the module that produced that input.
// Which output an op received is read from its act_in rows: a repeat is the tensor
// recorded just before it (an output, or another act_in of the same tensor: a container
// and its first child); an act_in that is no repeat is the latest earlier output with
// the same statistics (numel, l2, mean, std, min, max) in both runs (a second consumer
// of one tensor: the head called after its sibling). When several modules that are not
// nested in one another consume one tensor, its gradient is the sum of what they pass
// on: no one of them is judged by it (a sibling is never blamed for another's
// gradient). An op whose received gradient agrees while the gradient it passed on
// differs beyond what it explains is a backward birth point (a custom autograd Function
// with a different backward); a container only when none of its submodules is one.
// Judged only for an op whose own forward agrees; named only at a step whose forward
// has no birth point.
//
// Weights: an op with parameters is judged only while its weights are known to agree:
// up to the first step after one of its parameters got a differing gradient (or a
// recorded parameter differs). After that its output differs because its weights
// moved apart, which is not an op computing differently.
//
// Distances come from the count sketches (docs/statistics.md), measured against at
// least 1e-3 of the peers' typical magnitude (so a noise-level tensor's relative error
// does not count). Only micro step 0 is judged.
//
// Threads: the analyzer's thread.
#ifndef LOCKSTEP_COLLECTOR_RULES_BIRTH_H_
#define LOCKSTEP_COLLECTOR_RULES_BIRTH_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "align/names.h"
#include "align/pair_metrics.h"
#include "align/step_data.h"
#include "rules/rules_config.h"

namespace lockstep::collector {

// One matched row pair of a kind the birth rule reads (act, act_in, act_grad,
// param_grad, param), repeats included.
struct BirthRow {
  const StatRow* b = nullptr;
  const StatRow* c = nullptr;
};

// Whether the birth rule reads rows of this kind.
inline bool IsBirthKind(Kind k) {
  return k == Kind::kAct || k == Kind::kActIn || k == Kind::kActGrad || k == Kind::kParamGrad ||
         k == Kind::kParam;
}

// One op at one step.
struct OpBirth {
  uint32_t op = 0;             // the module's name id
  bool backward = false;       // false: inputs -> output; true: received -> passed-on gradient
  double input_error = 0;      // what it received
  double output_error = 0;     // what it produced (backward: the gradient it passed on)
  double explained = 0;        // gain x input_error + rounding noise
  double ratio = 0;            // output_error / explained: above 1 it adds error of its own
  uint32_t order = 0;          // execution order of its output (backward: of the passed-on gradient)
  const StatRow* out_b = nullptr;  // its output's rows (backward: the passed-on gradient's); valid this step
  const StatRow* out_c = nullptr;
  bool born = false;           // adds error of its own (and is not explained by a submodule)
  bool precision = false;      // its output's dtype differs between the runs, its inputs' do not
  bool container = false;      // has watched submodules (set for ops that add error)
  // A container born in its own code: the outermost submodule that receives a differing
  // input, the earliest (what its own code handed on differently), if any.
  bool has_fed = false;
  uint32_t fed = 0;
  DT dtype_b = DT::kUnknown, dtype_c = DT::kUnknown;  // its output's dtypes
};

// The rule's state for one (pair, rank): which ops' weights have moved apart.
class BirthFinder {
 public:
  // `names` is not const: the op of a module with several outputs is interned here.
  BirthFinder(NameTable* names, const RulesConfig* cfg) : names_(names), cfg_(cfg) {}

  // Judges one compared step. `rows`: the step's matched rows of IsBirthKind kinds.
  // Fills `ops` with every op it could judge, ranked by ratio (largest first), and
  // returns the index of the birth point in it, or -1.
  int Analyze(const StepData& bs, const StepData& cs, const std::vector<BirthRow>& rows, const PeerScales& peers,
              std::vector<OpBirth>* ops);

  // The outermost consumer of each chain of nested modules that received the output of
  // module `name_id` at the last step judged (micro step 0), into `out`. False when that
  // step had no output of that name; true with `out` empty when no watched module
  // received it (the loss, or code outside the modules, did).
  bool ConsumersOf(uint32_t name_id, std::vector<uint32_t>* out) const;

  // The step from which module `op`'s weights (or a submodule's) are known to differ,
  // or -1: its output differing since then is not the op computing differently.
  int64_t WeightsMovedSince(uint32_t op) const { return op < moved_since_.size() ? moved_since_[op] : -1; }

  // The relative distance of one row pair (docs/rules.md): NaN when not judged.
  static double RelError(const StepData& bs, const StatRow& b, const StepData& cs, const StatRow& c, double scale);
  // The unit roundoff of a dtype (fp32 2^-24); non-float and unknown dtypes as fp32.
  static double UnitRoundoff(DT d);

 private:
  struct Acc {
    uint32_t op = 0;
    bool has_in = false, has_out = false;
    bool has_grad = false;  // its output's gradient (act_grad of its name) was recorded
    bool has_recv = false, has_pass = false;  // what its backward received / passed on
    double in_err = 0, out_err = 0, grad_err = 0, recv_err = 0, pass_err = 0;
    const BirthRow* grad = nullptr;  // its act_grad row
    const BirthRow* pass = nullptr;  // the passed-on gradient with the largest error
    DT prec = DT::kUnknown;  // the coarsest float dtype seen
    DT in_b = DT::kUnknown, in_c = DT::kUnknown;  // the coarsest input dtype of each run
    uint64_t width = 0;
    uint32_t out_order = 0;
    const StatRow *out_b = nullptr, *out_c = nullptr;
    bool from_elements = false;  // out_* are its output elements' (it has no output row)
    bool element = false;        // an output element of another op (not a module)
  };
  // The op a row of `kind` belongs to: the row's own name for act / act_grad, the
  // module for act_in ("attn(0)", and "attn[0]" of older logs: "attn"; interned if
  // new), the owning module for a parameter; -1 if none.
  int64_t OpOf(uint32_t name_id, Kind kind);
  // The op whose output element the act row `name_id` is ("attn[0]" -> "attn"), or -1.
  // Only ops with inputs are candidates.
  int64_t ElementOf(uint32_t name_id);
  Acc& Slot(uint32_t op);
  void MarkMoved(uint32_t op, std::vector<uint8_t>* moved);
  // The interned modules enclosing `op`, innermost first (cached).
  const std::vector<uint32_t>& Ancestors(uint32_t op);
  bool Moved(uint32_t op) const { return op < moved_.size() && moved_[op] != 0; }
  double Noise(DT prec, uint64_t width) const;
  // inner is a submodule of outer, or a call in its code ("outer/softmax#0", a zoom's)
  bool IsWithin(uint32_t inner, uint32_t outer) const;

  NameTable* names_;
  const RulesConfig* cfg_;
  // name id -> op id: [0] for act_in, [1] for parameters, [2] for output elements;
  // -2 unknown, -1 none. A "none" is looked up again once the names or the ops with
  // inputs have grown (no_since_: the count of both then), since a module may be
  // interned or get its inputs after a row that needs it was first seen.
  std::vector<int64_t> op_of_[3];
  std::vector<uint64_t> no_since_[3];
  std::vector<uint8_t> has_inputs_;  // op id -> an act_in row was mapped to it
  uint64_t n_input_ops_ = 0;
  uint64_t Known() const { return (static_cast<uint64_t>(names_->size()) << 32) | n_input_ops_; }
  std::vector<std::pair<size_t, std::vector<uint32_t>>> ancestors_;  // op id -> (names size when found + 1, ids)
  std::vector<uint8_t> moved_;       // op id -> its weights have moved apart (judged no more)
  std::vector<uint8_t> moved_next_;  // ... from the next step on
  std::vector<int64_t> moved_since_; // op id -> the step moved_ was first set, or -1
  struct GradRow {
    const BirthRow* row;
    double err;
  };
  // op id -> index in acc_, valid where slot_stamp_ is this step's stamp_ (no clearing,
  // no allocation once the ops are known).
  std::vector<uint32_t> slot_of_;
  std::vector<uint64_t> slot_stamp_;
  uint64_t stamp_ = 0;
  std::vector<Acc> acc_;
  std::vector<GradRow> grads_;  // act_grad rows (this step)
  // Which output each act_in received (this step, micro step 0). fwd_: (order, index in
  // rows) of act / act_in rows in execution order; root_: rows index -> the rows index
  // of the output row that made the tensor (-1 unknown, -2 the model's input).
  void TraceInputs(const StepData& cs, const std::vector<BirthRow>& rows);
  std::vector<std::pair<uint32_t, uint32_t>> fwd_;
  std::vector<uint32_t> input_orders_;
  std::vector<int32_t> root_;
  std::unordered_map<uint64_t, uint32_t> outputs_by_stats_;  // StatsHash -> latest output row (this step)
  std::vector<std::pair<int32_t, uint32_t>> cons_;  // (root, consuming op), sorted
  // Last step's (output name, outermost consumer) pairs and the names with an output
  // row, sorted (ConsumersOf).
  std::vector<std::pair<uint32_t, uint32_t>> cons_by_name_;
  std::vector<uint32_t> out_names_;
  std::vector<const BirthRow*> params_;  // differing param / param_grad rows (this step)
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RULES_BIRTH_H_
