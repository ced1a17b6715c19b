// RecorderCore: the host path of lockstep._recorder.Recorder, in C++. It turns
// (name, kind, tensor) from a hook into agent records at the current (step, micro step,
// execution order): the tensor's id, the repeat check (the same memory, unchanged, as
// the record just before it), the statistics kernel inline or on the host statistics
// thread, the tensors held until that thread has read them and the results settled in
// order, the first records watched for in-place changes, and the parameter gradients
// handed over once autograd has adopted them. _recorder.py's module doc says what each
// of those is for; this class does exactly that, without a line of Python bytecode per
// tensor: a recorded CPU tensor cost ~3 us of interpreted Python in the recorder alone,
// hundreds of times a step (docs/python.md "The per-tensor cost").
//
// The Python Recorder subclasses it and keeps what is rare or not on the host: the
// tensor's registration (_register: names and module types), the device path
// (_record_device), asking autograd for the end of backward (_queue_end_of_backward).
// This class calls those back on its Python self.
//
// Tensors are read through the torch bridge when one built for the running torch is
// loaded (lockstep/_torch_bridge.h: one C++ call a tensor), else through the CPython API
// (their Python attributes and methods); _core itself is built against no torch, so the
// one module serves every torch the package runs with.
//
// The agent is the real _core.Agent (its HostRecorder called directly) or any object
// with the same methods (the tests' FakeAgent, the benches' timing wrapper), called
// through Python.
//
// Threads: hooks call it under the GIL (the training thread, autograd's threads). Every
// change of its state happens with the GIL held and without calling Python in between,
// which is what Python's lock gave the Python recorder; the GIL is released only
// inside the kernel on a large tensor and while waiting for the host thread.
#ifndef LOCKSTEP_AGENT_PYTHON_PY_RECORDER_H_
#define LOCKSTEP_AGENT_PYTHON_PY_RECORDER_H_

#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "lockstep/_torch_bridge.h"
#include "lockstep/agent/host_recorder.h"
#include "py_agent.h"

namespace lockstep::python {

namespace py = pybind11;

class Facts;  // what the recorder reads of a tensor (py_recorder.cc)

// Sets the torch bridge (lockstep/_torch_bridge.h) the recorder reads tensors through:
// the capsule lockstep._torch_bridge exports, or None for Python's attributes. Raises
// ValueError for a capsule of another bridge ABI. Called with the GIL (lockstep._bridge).
void SetTorchBridge(py::object capsule);
// The torch bridge set, or nullptr (the hooks register gradient hooks through it).
const bridge::Api* TorchBridge();
// The bridge's add_grad_hook(t, fn): true when it took the hook; false when no bridge is
// set or it did not (_watch._add_hook, for the hooks the Python path registers).
bool BridgeAddGradHook(py::handle t, py::handle fn);
// What the bridge reads of `t` (a dict named as the Python attributes), or None when no
// bridge is set or it leaves `t` to Python: for tests/python/test_torch_bridge.py.
py::object BridgeFacts(py::handle t);

// The agent as the recorder calls it: a PyAgent directly, or any Python object with
// its methods (answers decoded as Python's recorder did: a float is a recorded l2 norm,
// an int a ticket, anything else an outcome).
class AgentPort {
 public:
  void Set(py::object agent);
  const py::object& object() const { return obj_; }

  HostResult Record(const RecordKey& key, uintptr_t data, uint64_t numel, int dtype);
  HostResult RecordStrided(const RecordKey& key, uintptr_t data, int dtype,
                           const std::vector<int64_t>& sizes,
                           const std::vector<int64_t>& strides);
  HostResult Repeat(const RecordKey& key);
  HostSubmit Submit(const RecordKey& key, uintptr_t data, uint64_t numel, int dtype);
  HostSubmit SubmitStrided(const RecordKey& key, uintptr_t data, int dtype,
                           const std::vector<int64_t>& sizes,
                           const std::vector<int64_t>& strides);
  uint64_t Done();
  void Kick();  // wakes the host thread for whatever waits
  void Wait(uint64_t ticket);  // releases the GIL meanwhile
  HostResult Settle(uint64_t ticket, bool keep, bool as_last);

 private:
  py::object obj_;
  PyAgent* direct_ = nullptr;  // obj_ is a _core.Agent
};

class RecorderCore {
 public:
  // `host_dtypes`: (torch dtype, wire dtype code, bytes per element) of each dtype the
  // kernel reads; `strided`: torch.strided.
  RecorderCore(py::object agent, py::iterable host_dtypes, py::object strided,
               bool force_device);

  // Recorder.record / record_param_grad / param_accumulated (_recorder.py). `self`
  // is the Python Recorder (the rare paths are its methods).
  void Record(py::handle self, py::handle name, int kind, py::handle t);
  void RecordParamGrad(py::handle self, py::handle name, py::handle t, bool fresh);
  void ParamAccumulated(py::handle self, py::handle name, py::handle grad);

  // Records the thread's finished results in order (all of them, waiting for the
  // thread, when `wait`) and ends the probes when `wait` (the step is over).
  void Settle(bool wait);
  // Settles what the thread finished, without waiting; cheap when nothing is new.
  void SettleDone();
  void NewStep(uint64_t step);
  void NewMicro();
  // Deferred parameter gradients whose post-accumulate hook never came: failed.
  void DropDeferred();
  void SetThreaded(bool on) { threaded_ = on && has_worker; }
  bool threaded() const { return threaded_; }

  AgentPort& agent() { return agent_; }

  // State the Python Recorder and Monitor read and set (plain fields: one GIL).
  uint64_t step = 0;
  uint32_t micro = 0;
  uint32_t order = 0;
  std::optional<double> t_first;  // time.perf_counter() at this step's first record
  double grad_sq = 0;             // sum of squared l2 of host param grads in this step
  uint64_t grad_count = 0;
  uint64_t records = 0;           // tensors handed on (host or device)
  uint64_t repeats = 0;           // records that reused the statistics just computed
  uint64_t skipped = 0;           // not recorded: a dtype or layout the kernel lacks
  uint64_t failed = 0;            // refused by the agent or the kernel
  uint64_t threaded_records = 0;  // records whose statistics the thread computed
  uint64_t changed_in_flight = 0; // results dropped: changed before they were read
  bool has_worker = false;
  bool end_of_backward_queued = false;
  // For the benches (kernel_timing on): seconds in the kernel calls made on this thread
  // and the bytes they read, and the bytes handed to the host thread. Off, a branch.
  bool kernel_timing = false;
  double kernel_seconds = 0;
  uint64_t kernel_bytes = 0;
  uint64_t threaded_bytes = 0;

 private:
  struct HostDType {
    PyObject* dtype;  // borrowed from dtypes_ (kept alive there)
    int code;
    uint64_t itemsize;
  };
  struct RepeatKey {
    uint64_t step;
    uint32_t micro, tid, order;
  };
  struct Pending {  // a tensor the host thread is reading
    uint64_t ticket;
    py::object tensor;  // held until settled
    int64_t version;    // its version counter when submitted
    uint32_t tid;
    unsigned long ident;  // the submitting thread
    uint64_t nbytes;
    bool pgrad;           // a parameter gradient: its l2 joins the step's grad norm
    std::vector<RepeatKey> repeats;  // recorded with the same result
  };
  struct Last {  // the last host record of an output or output gradient
    py::object tensor;
    int64_t version;
    unsigned long ident;
  };
  struct Probe {  // a name's first record, watched for in-place changes
    uint32_t tid;
    py::object tensor;
    int64_t version;
  };
  struct Deferred {  // a parameter gradient waiting for its post-accumulate hook
    uint32_t tid, order, micro;
  };

  const HostDType* FindDType(PyObject* dtype) const;
  bool LookupId(py::handle name, int kind, int64_t* tid) const;
  void StoreId(py::handle name, int kind, int64_t tid);
  void RecordFacts(py::handle self, py::handle name, int kind, Facts& f);
  void HostRecord(py::handle self, int kind, Facts& f, const HostDType& hd, uint32_t tid,
                  uint32_t order);
  bool SameAsLast(const Facts& f, PyObject* dtype) const;
  bool SubmitOutput(const Facts& f, bool contiguous, uint32_t tid, uint32_t order,
                    const HostDType& hd);
  Pending* HandOver(const Facts& f, bool contiguous, uint32_t tid, uint32_t order,
                    const HostDType& hd, uint32_t micro, bool pgrad);
  // The kernel on this thread; false (counted) when it refused the tensor.
  bool Inline(const Facts& f, bool contiguous, uint32_t tid, uint32_t order,
              const HostDType& hd, uint32_t micro, int kind);
  void SettleUpTo(uint64_t done);
  void CheckProbes(bool final);
  void QueueEndOfBackward(py::handle self);
  bool ModeAllows(uint32_t tid) const;
  RecordKey Key(uint32_t micro, uint32_t tid, uint32_t order) const {
    return RecordKey{step, micro, tid, order};
  }

  AgentPort agent_;
  py::object strided_;
  std::vector<py::object> dtypes_;  // keeps HostDType::dtype alive
  std::vector<HostDType> host_dtypes_;
  const bool force_device_;
  bool threaded_ = false;  // this step's outputs and output gradients go to the thread
  // (name -> tensor id) per kind; -1: a layout without statistics.
  std::array<py::dict, 16> ids_;
  std::optional<Last> last_;
  Pending* last_pending_ = nullptr;  // last_'s Pending while unsettled (deque refs stay)
  std::deque<Pending> pending_;      // in ticket order
  uint64_t pending_bytes_ = 0;
  std::unordered_map<uint32_t, bool> mode_;  // tid -> may go to the thread
  std::vector<Probe> probes_;
  std::unordered_map<std::string, Deferred> deferred_;
  std::unordered_map<std::string, uint32_t> probe_grad_;  // name -> tid, .grad watched
};

// Binds RecorderCore as _core.RecorderCore (bind_recorder.cc).
void BindRecorder(py::module_& m);

}  // namespace lockstep::python

#endif  // LOCKSTEP_AGENT_PYTHON_PY_RECORDER_H_
