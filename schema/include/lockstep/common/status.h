// Status: errors as values (after leveldb's include/leveldb/status.h).
//
// A Status is either OK or carries a code and one human sentence that names the
// thing that went wrong and, where possible, what to do about it. StatusOr<T> holds
// a value or a non-OK Status. Both are cheap to move; OK carries no allocation.
// Thread-compatible: a const Status may be read from several threads.
#ifndef LOCKSTEP_COMMON_STATUS_H_
#define LOCKSTEP_COMMON_STATUS_H_

#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace lockstep {

class Status {
 public:
  enum class Code : unsigned char {
    kOk = 0,
    kInvalidArgument,  // the caller's input (flag, config, message) is wrong
    kNotFound,
    kIOError,
    kCorruption,       // stored or received bytes fail a check
    kUnavailable,      // a peer or resource is not there now; may work later
    kTimeout,
    kResourceExhausted,  // a queue, cap or disk is full
    kInternal,
  };

  Status() noexcept = default;
  static Status OK() noexcept { return Status(); }
  static Status InvalidArgument(std::string msg) { return Status(Code::kInvalidArgument, std::move(msg)); }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status IOError(std::string msg) { return Status(Code::kIOError, std::move(msg)); }
  static Status Corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }
  static Status Unavailable(std::string msg) { return Status(Code::kUnavailable, std::move(msg)); }
  static Status Timeout(std::string msg) { return Status(Code::kTimeout, std::move(msg)); }
  static Status ResourceExhausted(std::string msg) { return Status(Code::kResourceExhausted, std::move(msg)); }
  static Status Internal(std::string msg) { return Status(Code::kInternal, std::move(msg)); }

  bool ok() const noexcept { return state_ == nullptr; }
  Code code() const noexcept { return state_ ? state_->code : Code::kOk; }
  // The human sentence ("" when OK).
  const std::string& message() const noexcept {
    static const std::string kEmpty;
    return state_ ? state_->message : kEmpty;
  }
  // "OK" or "<code name>: <message>".
  std::string ToString() const;

  bool IsInvalidArgument() const noexcept { return code() == Code::kInvalidArgument; }
  bool IsNotFound() const noexcept { return code() == Code::kNotFound; }
  bool IsCorruption() const noexcept { return code() == Code::kCorruption; }
  bool IsTimeout() const noexcept { return code() == Code::kTimeout; }

  Status(const Status& o) : state_(o.state_ ? std::make_unique<State>(*o.state_) : nullptr) {}
  Status& operator=(const Status& o) {
    if (this != &o) state_ = o.state_ ? std::make_unique<State>(*o.state_) : nullptr;
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

 private:
  struct State {
    Code code;
    std::string message;
  };
  Status(Code code, std::string msg) : state_(std::make_unique<State>(State{code, std::move(msg)})) {}
  std::unique_ptr<State> state_;
};

inline const char* CodeName(Status::Code c) {
  switch (c) {
    case Status::Code::kOk: return "OK";
    case Status::Code::kInvalidArgument: return "invalid argument";
    case Status::Code::kNotFound: return "not found";
    case Status::Code::kIOError: return "I/O error";
    case Status::Code::kCorruption: return "corruption";
    case Status::Code::kUnavailable: return "unavailable";
    case Status::Code::kTimeout: return "timeout";
    case Status::Code::kResourceExhausted: return "resource exhausted";
    case Status::Code::kInternal: return "internal error";
  }
  return "unknown";
}

inline std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code())) + ": " + message();
}

// Holds a T or a non-OK Status. Access value() only when ok().
template <typename T>
class StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "StatusOr from an OK status needs a value");
    if (status_.ok()) status_ = Status::Internal("StatusOr built from OK without a value");
  }
  bool ok() const noexcept { return status_.ok(); }
  const Status& status() const noexcept { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace lockstep

#define LOCKSTEP_RETURN_IF_ERROR(expr)     \
  do {                                     \
    ::lockstep::Status _st = (expr);       \
    if (!_st.ok()) return _st;             \
  } while (0)

#endif  // LOCKSTEP_COMMON_STATUS_H_
