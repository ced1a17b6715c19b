// RecorderCore (py_recorder.h): the host path of the Python Recorder, statement for
// statement what _recorder.py did before it moved here.
#include "py_recorder.h"

#include <Python.h>
#include <pybind11/stl.h>
#include <pythread.h>
#include <time.h>

#include <utility>

#include "gil.h"
#include "lockstep/schema/lockstep_generated.h"

namespace lockstep::python {
namespace {

constexpr int kAct = static_cast<int>(wire::TensorKind::Act);
constexpr int kActGrad = static_cast<int>(wire::TensorKind::ActGrad);
constexpr int kParamGrad = static_cast<int>(wire::TensorKind::ParamGrad);
constexpr int kActIn = static_cast<int>(wire::TensorKind::ActIn);

// Bytes of tensors held for the host statistics thread; above it, records run inline
// (bounds the memory the thread can keep alive when it falls behind).
constexpr uint64_t kMaxPendingBytes = uint64_t{256} << 20;

// The attribute and method names the recorder reads, interned once (a lookup by an
// interned string is a pointer compare in the type's dict).
struct Names {
  PyObject* is_cpu;
  PyObject* dtype;
  PyObject* version;
  PyObject* data_ptr;
  PyObject* numel;
  PyObject* is_contiguous;
  PyObject* shape;
  PyObject* stride;
  PyObject* layout;
  PyObject* contiguous;
  // The Python Recorder's methods that RecorderCore calls back.
  PyObject* register_;
  PyObject* record_device;
  PyObject* queue_end_of_backward;
};

const Names& N() {
  static const Names names = [] {
    auto s = [](const char* n) { return PyUnicode_InternFromString(n); };
    return Names{s("is_cpu"), s("dtype"),  s("_version"), s("data_ptr"),
                 s("numel"),  s("is_contiguous"), s("shape"), s("stride"),
                 s("layout"), s("contiguous"), s("_register"), s("_record_device"),
                 s("_queue_end_of_backward")};
  }();
  return names;
}

py::object Attr(py::handle o, PyObject* name) {
  PyObject* r = PyObject_GetAttr(o.ptr(), name);
  if (r == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}

py::object Call0(py::handle o, PyObject* name) {
  PyObject* r = PyObject_CallMethodNoArgs(o.ptr(), name);
  if (r == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}

bool Truth(const py::object& o) {
  int r = PyObject_IsTrue(o.ptr());
  if (r < 0) throw py::error_already_set();
  return r != 0;
}

uint64_t AsU64(const py::object& o) {
  unsigned long long v = PyLong_AsUnsignedLongLong(o.ptr());
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    throw py::error_already_set();
  }
  return v;
}

// t._version; false when the tensor has none (inference tensors raise RuntimeError).
bool PyVersion(py::handle t, int64_t* v) {
  PyObject* r = PyObject_GetAttr(t.ptr(), N().version);
  if (r == nullptr) {
    if (PyErr_ExceptionMatches(PyExc_RuntimeError)) {
      PyErr_Clear();
      return false;
    }
    throw py::error_already_set();
  }
  long long x = PyLong_AsLongLong(r);
  Py_DECREF(r);
  if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
  *v = x;
  return true;
}

std::vector<int64_t> Ints(const py::object& seq) {
  py::tuple tup = py::reinterpret_borrow<py::tuple>(seq);  // torch.Size is a tuple
  if (!PyTuple_Check(seq.ptr())) tup = py::tuple(seq);
  std::vector<int64_t> out(static_cast<size_t>(PyTuple_GET_SIZE(tup.ptr())));
  for (size_t i = 0; i < out.size(); ++i) {
    long long x = PyLong_AsLongLong(PyTuple_GET_ITEM(tup.ptr(), static_cast<Py_ssize_t>(i)));
    if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
    out[i] = x;
  }
  return out;
}

bool Equal(const py::object& a, const py::object& b) {
  int r = PyObject_RichCompareBool(a.ptr(), b.ptr(), Py_EQ);
  if (r < 0) throw py::error_already_set();
  return r != 0;
}

// The torch bridge's table (SetTorchBridge), or nullptr: tensors are read through Python.
const bridge::Api* g_bridge = nullptr;

// t._version of a tensor the recorder holds: through the bridge when it takes it.
bool VersionOf(py::handle t, int64_t* v) {
  if (g_bridge != nullptr && g_bridge->version(t.ptr(), v) == 1) return true;
  return PyVersion(t, v);
}

}  // namespace

// What the recorder reads of one tensor (bridge::TensorFacts), read once: by the torch
// bridge in one C++ call when one is loaded and it takes the tensor, else from the
// tensor's Python attributes, each when first asked (a record that stops early reads
// no more than it did). The same values either way. Lives for one call, under the GIL.
class Facts {
 public:
  explicit Facts(py::handle t) : t_(t) {
    bridged_ = g_bridge != nullptr && g_bridge->read(t.ptr(), &f_) == 1;
  }
  py::handle obj() const { return t_; }
  bool IsCpu() const { return bridged_ ? f_.is_cpu != 0 : Truth(Attr(t_, N().is_cpu)); }
  PyObject* DType() {
    if (bridged_) return f_.dtype;
    if (!dtype_) dtype_ = Attr(t_, N().dtype);
    return dtype_.ptr();
  }
  // The rest only of a tensor on the CPU (the bridge reads no more of others).
  bool Contiguous() const {
    return host() ? f_.contiguous != 0 : Truth(Call0(t_, N().is_contiguous));
  }
  uintptr_t Data() const {
    return host() ? f_.data : static_cast<uintptr_t>(AsU64(Call0(t_, N().data_ptr)));
  }
  uint64_t Numel() const { return host() ? f_.numel : AsU64(Call0(t_, N().numel)); }
  // t._version; false when the tensor has none (inference tensors raise RuntimeError).
  bool Version(int64_t* v) const {
    if (!host()) return PyVersion(t_, v);
    *v = f_.version;
    return f_.has_version != 0;
  }
  // t.layout is `strided` (torch.strided); the bridge takes no other layout.
  bool Strided(const py::object& strided) const {
    return host() || Equal(Attr(t_, N().layout), strided);
  }
  std::vector<int64_t> Sizes() const {
    return host() ? std::vector<int64_t>(f_.sizes, f_.sizes + f_.ndim) : Ints(Attr(t_, N().shape));
  }
  std::vector<int64_t> Strides() const {
    return host() ? std::vector<int64_t>(f_.strides, f_.strides + f_.ndim)
                  : Ints(Call0(t_, N().stride));
  }

 private:
  bool host() const { return bridged_ && f_.is_cpu != 0; }

  py::handle t_;
  bool bridged_;
  bridge::TensorFacts f_;
  py::object dtype_;  // Python's answer, alive while DType()'s pointer is used
};

namespace {

unsigned long Ident() { return PyThread_get_thread_ident(); }

// time.perf_counter()'s clock (CLOCK_MONOTONIC on Linux), which the tuner compares it to.
double Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// A Python agent's answer to a record: a float is the recorded l2 norm.
HostResult ResultOf(const py::object& r) {
  if (PyFloat_CheckExact(r.ptr())) return HostResult{HostOutcome::kRecorded, PyFloat_AS_DOUBLE(r.ptr())};
  try {
    return HostResult{r.cast<HostOutcome>(), 0.0};
  } catch (const py::cast_error&) {
    return HostResult{HostOutcome::kRefused, 0.0};
  }
}

// ... and to a submit: an int is the ticket.
HostSubmit SubmitOf(const py::object& r) {
  if (PyLong_CheckExact(r.ptr())) return HostSubmit{HostOutcome::kQueued, AsU64(r)};
  return HostSubmit{HostOutcome::kFull, 0};
}

}  // namespace

// ---- AgentPort -----------------------------------------------------------------------

void AgentPort::Set(py::object agent) {
  direct_ = py::isinstance<PyAgent>(agent) ? &agent.cast<PyAgent&>() : nullptr;
  obj_ = std::move(agent);
}

HostResult AgentPort::Record(const RecordKey& k, uintptr_t data, uint64_t numel, int dtype) {
  if (direct_ != nullptr) {
    MaybeReleaseGil release(numel >= kReleaseGilElems);
    return direct_->host().Record(k, reinterpret_cast<const void*>(data), numel,
                                  static_cast<DType>(dtype));
  }
  return ResultOf(obj_.attr("record_host_tensor")(k.step, k.micro, k.id, k.order, data,
                                                  numel, dtype));
}

HostResult AgentPort::RecordStrided(const RecordKey& k, uintptr_t data, int dtype,
                                    const std::vector<int64_t>& sizes,
                                    const std::vector<int64_t>& strides) {
  if (direct_ != nullptr) {
    MaybeReleaseGil release(NumelOf(sizes) >= kReleaseGilElems);
    return direct_->host().RecordStrided(k, reinterpret_cast<const void*>(data),
                                         static_cast<DType>(dtype), sizes.data(),
                                         strides.data(), static_cast<int>(sizes.size()));
  }
  py::tuple sz = py::cast(sizes), st = py::cast(strides);
  return ResultOf(obj_.attr("record_host_tensor_strided")(k.step, k.micro, k.id, k.order,
                                                          data, dtype, sz, st));
}

HostResult AgentPort::Repeat(const RecordKey& k) {
  if (direct_ != nullptr) return direct_->host().Repeat(k);
  return ResultOf(obj_.attr("record_repeat")(k.step, k.micro, k.id, k.order));
}

HostSubmit AgentPort::Submit(const RecordKey& k, uintptr_t data, uint64_t numel, int dtype) {
  if (direct_ != nullptr) {
    return direct_->host().Submit(k, reinterpret_cast<const void*>(data), numel,
                                  static_cast<DType>(dtype));
  }
  return SubmitOf(obj_.attr("submit_host_tensor")(k.step, k.micro, k.id, k.order, data,
                                                  numel, dtype));
}

HostSubmit AgentPort::SubmitStrided(const RecordKey& k, uintptr_t data, int dtype,
                                    const std::vector<int64_t>& sizes,
                                    const std::vector<int64_t>& strides) {
  if (direct_ != nullptr) {
    return direct_->host().SubmitStrided(k, reinterpret_cast<const void*>(data),
                                         static_cast<DType>(dtype), sizes.data(),
                                         strides.data(), static_cast<int>(sizes.size()));
  }
  py::tuple sz = py::cast(sizes), st = py::cast(strides);
  return SubmitOf(obj_.attr("submit_host_tensor_strided")(k.step, k.micro, k.id, k.order,
                                                          data, dtype, sz, st));
}

uint64_t AgentPort::Done() {
  if (direct_ != nullptr) return direct_->host().Done();
  return AsU64(obj_.attr("host_done")());
}

void AgentPort::Kick() {
  if (direct_ != nullptr) {
    direct_->host().Kick();
    return;
  }
  obj_.attr("host_kick")();
}

void AgentPort::Wait(uint64_t ticket) {
  if (direct_ != nullptr) {
    py::gil_scoped_release release;
    direct_->host().Wait(ticket);
    return;
  }
  obj_.attr("host_wait")(ticket);
}

HostResult AgentPort::Settle(uint64_t ticket, bool keep, bool as_last) {
  if (direct_ != nullptr) return direct_->host().Settle(ticket, keep, as_last);
  return ResultOf(obj_.attr("host_settle")(ticket, keep, as_last));
}

// ---- RecorderCore --------------------------------------------------------------------

RecorderCore::RecorderCore(py::object agent, py::iterable host_dtypes, py::object strided,
                           bool force_device)
    : strided_(std::move(strided)), force_device_(force_device) {
  agent_.Set(std::move(agent));
  for (py::handle item : host_dtypes) {
    py::tuple t = py::reinterpret_borrow<py::tuple>(item);
    dtypes_.push_back(py::reinterpret_borrow<py::object>(t[0]));
    host_dtypes_.push_back(HostDType{dtypes_.back().ptr(), t[1].cast<int>(),
                                     t[2].cast<uint64_t>()});
  }
}

const RecorderCore::HostDType* RecorderCore::FindDType(PyObject* dtype) const {
  for (const HostDType& d : host_dtypes_) {
    if (d.dtype == dtype) return &d;  // torch dtypes are singletons
  }
  return nullptr;
}

bool RecorderCore::LookupId(py::handle name, int kind, int64_t* tid) const {
  if (kind < 0 || kind >= static_cast<int>(ids_.size())) return false;
  PyObject* v = PyDict_GetItemWithError(ids_[kind].ptr(), name.ptr());
  if (v == nullptr) {
    if (PyErr_Occurred()) throw py::error_already_set();
    return false;
  }
  *tid = PyLong_AsLongLong(v);
  return true;
}

void RecorderCore::StoreId(py::handle name, int kind, int64_t tid) {
  if (kind < 0 || kind >= static_cast<int>(ids_.size())) return;
  ids_[kind][name] = py::int_(tid);
}

bool RecorderCore::ModeAllows(uint32_t tid) const {
  auto it = mode_.find(tid);
  return it != mode_.end() && it->second;
}

void RecorderCore::Record(py::handle self, py::handle name, int kind, py::handle t) {
  Facts f(t);
  RecordFacts(self, name, kind, f);
}

void RecorderCore::RecordFacts(py::handle self, py::handle name, int kind, Facts& f) {
  py::handle t = f.obj();
  uint32_t ord = order++;
  if (!t_first) t_first = Now();
  int64_t tid;
  if (!LookupId(name, kind, &tid)) {
    py::object r = self.attr(py::handle(N().register_))(name, kind, t, ord);
    if (r.is_none()) {  // the agent refused (counted there); tried again next time
      ++failed;
      return;
    }
    tid = r.cast<int64_t>();
    StoreId(name, kind, tid);
  }
  if (tid < 0) {
    ++skipped;
    return;
  }
  if (force_device_ || !f.IsCpu()) {
    self.attr(py::handle(N().record_device))(name, kind, t, tid, ord);
    return;
  }
  const HostDType* hd = FindDType(f.DType());
  if (hd == nullptr) {
    ++skipped;
    return;
  }
  HostRecord(self, kind, f, *hd, static_cast<uint32_t>(tid), ord);
}

void RecorderCore::HostRecord(py::handle self, int kind, Facts& f, const HostDType& hd,
                              uint32_t tid, uint32_t ord) {
  bool repeatable = kind == kAct || kind == kActGrad || kind == kActIn;
  if (!pending_.empty() || !probes_.empty()) SettleDone();
  if (repeatable && last_ && SameAsLast(f, hd.dtype)) {
    if (last_pending_ != nullptr) {  // its statistics are still being computed
      last_pending_->repeats.push_back(RepeatKey{step, micro, tid, ord});
      ++records;
      ++repeats;
      return;
    }
    if (agent_.Repeat(Key(micro, tid, ord)).recorded()) {  // else computed below
      ++records;
      ++repeats;
      return;
    }
  }
  last_.reset();
  last_pending_ = nullptr;
  bool contiguous = f.Contiguous();
  ++records;
  if (repeatable && threaded_ && SubmitOutput(f, contiguous, tid, ord, hd)) {
    // The thread is woken for batches of tensors (host_stats_worker.cc). A backward's
    // first output gradient ends the forward: the thread is woken for the forward's
    // outputs, to read them while the backward runs, and the end of backward wakes it
    // for the rest, so they are done while the optimizer steps.
    if (kind == kActGrad && !end_of_backward_queued) {
      agent_.Kick();
      QueueEndOfBackward(self);
    }
    return;
  }
  if (!Inline(f, contiguous, tid, ord, hd, micro, kind) || !repeatable) return;
  int64_t v;
  if (!f.Version(&v)) return;  // inference tensors have no version counter
  last_ = Last{py::reinterpret_borrow<py::object>(f.obj()), v, Ident()};
  if (threaded_ && mode_.find(tid) == mode_.end()) {
    probes_.push_back(Probe{tid, py::reinterpret_borrow<py::object>(f.obj()), v});
  }
}

bool RecorderCore::SameAsLast(const Facts& f, PyObject* dtype) const {
  const Last& last = *last_;
  if (last.ident != Ident()) return false;
  try {
    int64_t v;
    if (!f.Version(&v) || v != last.version) return false;
    if (f.obj().ptr() == last.tensor.ptr()) return true;
    Facts l(last.tensor);  // another view of the same memory?
    return f.Data() == l.Data() && l.DType() == dtype && f.Sizes() == l.Sizes() &&
           f.Strides() == l.Strides();
  } catch (py::error_already_set& e) {
    if (e.matches(PyExc_RuntimeError)) return false;  // no storage, no version counter
    throw;
  }
}

bool RecorderCore::SubmitOutput(const Facts& f, bool contiguous, uint32_t tid, uint32_t ord,
                                const HostDType& hd) {
  if (!ModeAllows(tid)) return false;  // first record (probed inline) or changed before
  Pending* pend = HandOver(f, contiguous, tid, ord, hd, micro, false);
  if (pend == nullptr) return false;
  last_ = Last{py::reinterpret_borrow<py::object>(f.obj()), pend->version, pend->ident};
  last_pending_ = pend;
  return true;
}

RecorderCore::Pending* RecorderCore::HandOver(const Facts& f, bool contiguous, uint32_t tid,
                                              uint32_t ord, const HostDType& hd,
                                              uint32_t mic, bool pgrad) {
  int64_t version;
  if (!f.Version(&version)) return nullptr;  // nothing to check a result against
  uint64_t numel = f.Numel();
  uint64_t nbytes = numel * hd.itemsize;
  if (pending_bytes_ + nbytes > kMaxPendingBytes) return nullptr;
  RecordKey key = Key(mic, tid, ord);
  HostSubmit s = contiguous
                     ? agent_.Submit(key, f.Data(), numel, hd.code)
                     : agent_.SubmitStrided(key, f.Data(), hd.code, f.Sizes(), f.Strides());
  if (!s.queued()) return nullptr;  // full, or a layout it cannot read: inline
  pending_.push_back(Pending{s.ticket, py::reinterpret_borrow<py::object>(f.obj()), version, tid,
                             Ident(), nbytes, pgrad, {}});
  pending_bytes_ += nbytes;
  ++threaded_records;
  if (kernel_timing) threaded_bytes += nbytes;
  return &pending_.back();
}

bool RecorderCore::Inline(const Facts& f, bool contiguous, uint32_t tid, uint32_t ord,
                          const HostDType& hd, uint32_t mic, int kind) {
  RecordKey key = Key(mic, tid, ord);
  double t0 = kernel_timing ? Now() : 0;
  HostResult r;
  if (contiguous) {
    r = agent_.Record(key, f.Data(), f.Numel(), hd.code);
  } else {
    // A transposed or sliced view (attention's outputs): read in place, in flat order.
    r = agent_.RecordStrided(key, f.Data(), hd.code, f.Sizes(), f.Strides());
    if (r.outcome == HostOutcome::kBadLayout) {  // one the kernel cannot read: a copy
      py::object copy = Call0(f.obj(), N().contiguous);
      Facts src(copy);
      r = agent_.Record(key, src.Data(), src.Numel(), hd.code);
    }
  }
  if (kernel_timing) {
    kernel_seconds += Now() - t0;
    kernel_bytes += f.Numel() * hd.itemsize;
  }
  if (!r.recorded()) {  // the kernel refused the tensor
    ++failed;
    return false;
  }
  if (kind == kParamGrad) {
    grad_sq += r.l2 * r.l2;  // NaN l2 (no finite value) makes the norm NaN
    ++grad_count;
  }
  return true;
}

// Parameter gradients. One cannot be held by the gradient hook (autograd would then copy
// it into .grad instead of adopting it). But when .grad was None before this backward
// (`fresh`), the tensor autograd adopts as .grad *is* this backward's gradient: the
// post-accumulate hook (torch >= 2.1, ParamAccumulated) hands that to the thread, which
// computes its statistics during the rest of the backward and the optimizer step. Its
// first record is computed inline and .grad watched until the end of the step, as for
// outputs (a gradient clipped, unscaled or zeroed in place after backward keeps its name
// inline). A .grad that was not None (accumulation, zero_grad(set_to_none=False)) would
// be the sum: computed inline in the hook.
void RecorderCore::RecordParamGrad(py::handle self, py::handle name, py::handle t,
                                   bool fresh) {
  Facts f(t);
  if (fresh && threaded_ && !force_device_ && f.IsCpu()) {
    int64_t tid;
    bool known = LookupId(name, kParamGrad, &tid) && tid >= 0;
    if (known && ModeAllows(static_cast<uint32_t>(tid)) && FindDType(f.DType()) != nullptr) {
      uint32_t ord = order++;
      if (!t_first) t_first = Now();
      ++records;
      deferred_[py::cast<std::string>(name)] =
          Deferred{static_cast<uint32_t>(tid), ord, micro};
      return;
    }
    if (known && mode_.find(static_cast<uint32_t>(tid)) == mode_.end()) {
      probe_grad_[py::cast<std::string>(name)] = static_cast<uint32_t>(tid);
    }
  }
  RecordFacts(self, name, kParamGrad, f);
}

void RecorderCore::ParamAccumulated(py::handle self, py::handle name, py::handle grad) {
  std::string key = py::cast<std::string>(name);
  bool has_grad = !grad.is_none();
  auto pg = probe_grad_.find(key);
  if (pg != probe_grad_.end()) {
    uint32_t tid = pg->second;
    probe_grad_.erase(pg);
    int64_t v;
    if (has_grad && VersionOf(grad, &v)) {
      probes_.push_back(Probe{tid, py::reinterpret_borrow<py::object>(grad), v});
    }
  }
  auto it = deferred_.find(key);
  if (it == deferred_.end()) return;
  Deferred d = it->second;
  deferred_.erase(it);
  if (!has_grad) {
    ++failed;  // .grad went away in between
    return;
  }
  Facts g(grad);
  const HostDType* hd = FindDType(g.DType());
  if (hd == nullptr || !g.Strided(strided_)) {
    ++failed;  // .grad changed type in between
    return;
  }
  bool contiguous = g.Contiguous();
  if (!pending_.empty() || !probes_.empty()) SettleDone();
  if (HandOver(g, contiguous, d.tid, d.order, *hd, d.micro, true) == nullptr) {
    Inline(g, contiguous, d.tid, d.order, *hd, d.micro, kParamGrad);
  } else if (!end_of_backward_queued) {
    QueueEndOfBackward(self);  // wakes the thread for what is left
  }
}

void RecorderCore::DropDeferred() {
  failed += deferred_.size();
  deferred_.clear();
  probe_grad_.clear();
}

void RecorderCore::SettleDone() {
  if (!probes_.empty()) CheckProbes(false);
  if (pending_.empty()) return;
  uint64_t done = agent_.Done();
  if (!pending_.empty() && pending_.front().ticket < done) SettleUpTo(done);
}

void RecorderCore::Settle(bool wait) {
  if (pending_.empty() && probes_.empty()) return;
  CheckProbes(wait);
  if (wait && !pending_.empty()) agent_.Wait(pending_.back().ticket);
  if (!pending_.empty()) SettleUpTo(agent_.Done());
}

void RecorderCore::SettleUpTo(uint64_t done) {
  while (!pending_.empty() && pending_.front().ticket < done) {
    bool is_last = &pending_.front() == last_pending_;
    Pending pend = std::move(pending_.front());
    pending_.pop_front();
    if (is_last) last_pending_ = nullptr;
    pending_bytes_ -= pend.nbytes;
    int64_t v;
    bool keep = VersionOf(pend.tensor, &v) && v == pend.version;
    HostResult r = agent_.Settle(pend.ticket, keep, keep && (is_last || !pend.repeats.empty()));
    uint64_t n = 1 + pend.repeats.size();
    if (!keep) {
      // Changed in place while in flight: what the thread read may not be what the hook
      // saw. Dropped, and the name stays inline from now on.
      changed_in_flight += n;
      mode_[pend.tid] = false;
    } else if (!r.recorded()) {  // the kernel refused the tensor
      failed += n;
    } else if (pend.pgrad) {
      grad_sq += r.l2 * r.l2;
      ++grad_count;
    } else {
      for (const RepeatKey& k : pend.repeats) {
        agent_.Repeat(RecordKey{k.step, k.micro, k.tid, k.order});
      }
    }
    if (is_last && (!keep || pend.ident != Ident())) {
      last_.reset();  // record_repeat repeats this thread's last result; that is not it
    }
  }
}

void RecorderCore::CheckProbes(bool final) {
  size_t kept = 0;
  for (size_t i = 0; i < probes_.size(); ++i) {
    Probe& p = probes_[i];
    int64_t v;
    bool changed = !VersionOf(p.tensor, &v) || v != p.version;
    if (changed) {
      mode_[p.tid] = false;
    } else if (final) {
      mode_.emplace(p.tid, true);  // unless an earlier probe of it saw a change
    } else {
      if (kept != i) probes_[kept] = std::move(p);
      ++kept;
    }
  }
  probes_.resize(kept);
}

void RecorderCore::NewStep(uint64_t s) {
  Settle(true);
  DropDeferred();
  t_first.reset();
  last_.reset();
  last_pending_ = nullptr;
  step = s;
  micro = 0;
  order = 0;
  grad_sq = 0;
  grad_count = 0;
}

void RecorderCore::NewMicro() {
  DropDeferred();
  last_.reset();
  last_pending_ = nullptr;
  ++micro;  // order goes on counting: execution order spans the step's micro steps
}

void SetTorchBridge(py::object capsule) {
  static PyObject* held = nullptr;  // the capsule in use (never freed: the bridge's
                                    // module stays loaded for the process's life)
  if (capsule.is_none()) {
    g_bridge = nullptr;
    return;
  }
  auto* api = static_cast<const bridge::Api*>(
      PyCapsule_GetPointer(capsule.ptr(), bridge::kCapsuleName));
  if (api == nullptr) throw py::error_already_set();
  if (api->abi != bridge::kAbi || api->size < sizeof(bridge::Api)) {
    throw py::value_error("the torch bridge speaks ABI " + std::to_string(api->abi) +
                          ", this lockstep._core " + std::to_string(bridge::kAbi) +
                          " (rebuild it: python -m lockstep build-bridge)");
  }
  Py_INCREF(capsule.ptr());
  Py_XDECREF(held);
  held = capsule.ptr();
  g_bridge = api;
}

const bridge::Api* TorchBridge() { return g_bridge; }

bool BridgeAddGradHook(py::handle t, py::handle fn) {
  return g_bridge != nullptr && g_bridge->add_grad_hook(t.ptr(), fn.ptr()) == 1;
}

py::object BridgeFacts(py::handle t) {
  bridge::TensorFacts f;
  if (g_bridge == nullptr || g_bridge->read(t.ptr(), &f) != 1) return py::none();
  py::dict d;
  d["is_cpu"] = f.is_cpu != 0;
  d["dtype"] = py::reinterpret_borrow<py::object>(f.dtype);
  if (f.is_cpu != 0) {
    d["data_ptr"] = f.data;
    d["numel"] = f.numel;
    d["version"] = f.has_version != 0 ? py::object(py::int_(f.version)) : py::none();
    d["is_contiguous"] = f.contiguous != 0;
    d["strided"] = f.strided != 0;
    py::tuple sizes(f.ndim), strides(f.ndim);
    for (int i = 0; i < f.ndim; ++i) {
      sizes[i] = f.sizes[i];
      strides[i] = f.strides[i];
    }
    d["shape"] = sizes;
    d["stride"] = strides;
  }
  return std::move(d);
}

void RecorderCore::QueueEndOfBackward(py::handle self) {
  Call0(self, N().queue_end_of_backward);
}

}  // namespace lockstep::python
