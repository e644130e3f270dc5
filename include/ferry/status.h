// Status and Result<T>: ferry's one error vocabulary.
//
// Every fallible call returns a Status or a Result<T>. Codes say what the caller should do:
//   kUnavailable        retry the call (e.g. the peer is down or restarting)
//   kAborted            retry at a higher level (e.g. the engine shut down under the call)
//   kFailedPrecondition fix state first (e.g. a region was deregistered, a peer not added)
//   kDeadlineExceeded   the operation's deadline passed
//   kInvalidArgument    the input is malformed regardless of state
//   kOutOfRange         an offset or size lies outside a registered region
//   kResourceExhausted  back-pressure: a queue or a pool is full
//   kInProgress         asynchronous work has not finished yet
//
// Thread safety: Status and Result are values; distinct objects may be used from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace ferry {

enum class Code : uint8_t {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnsupported = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kInProgress = 16,
};

// "kOutOfRange" -> "OUT_OF_RANGE"
std::string_view CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return state_ == nullptr; }
  Code code() const { return state_ ? state_->code : Code::kOk; }
  std::string_view message() const { return state_ ? std::string_view(state_->message) : ""; }
  // "OUT_OF_RANGE: remote offset 4096 + 64 exceeds region 3 of 4096 bytes"
  std::string ToString() const;

  // Returns a copy with "context: " prepended to the message (no-op for OK).
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct State {
    Code code;
    std::string message;
  };
  std::shared_ptr<const State> state_;  // null when OK; shared so copies are cheap
};

// Shorthands: ferry::InvalidArgument("bad size %d") is not provided on purpose; callers
// format with fmt or std::string concatenation where the message is decided.
inline Status MakeStatus(Code code, std::string message) { return Status(code, std::move(message)); }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}                       // NOLINT: implicit
  Result(Status status) : status_(std::move(status)) {                // NOLINT: implicit
    if (status_.ok()) status_ = Status(Code::kInternal, "Result built from an OK status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok()
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;  // OK exactly when value_ is set
};

}  // namespace ferry

#define FERRY_CONCAT_INNER_(a, b) a##b
#define FERRY_CONCAT_(a, b) FERRY_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define FERRY_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::ferry::Status ferry_status_ = (expr);        \
    if (!ferry_status_.ok()) return ferry_status_; \
  } while (0)

// FERRY_ASSIGN_OR_RETURN(auto x, MakeX()): binds the value or returns the error.
#define FERRY_ASSIGN_OR_RETURN(lhs, expr) \
  FERRY_ASSIGN_OR_RETURN_IMPL_(FERRY_CONCAT_(ferry_result_, __LINE__), lhs, expr)
#define FERRY_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
