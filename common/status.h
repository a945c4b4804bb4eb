// Status and Result<T>: how library code reports failure. Errors are values, never aborts; the
// service or CLI at the top decides what to do with them (print, answer the client, exit).
#pragma once

#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace litellama {

enum class StatusCode {
  kOk,
  kInvalidArgument,  // the caller's input is wrong (bad flag, bad request, bad JSON)
  kNotFound,         // a file, tensor or id does not exist
  kUnsupported,      // valid input we do not handle (architecture, dtype, shape)
  kDataLoss,         // a file is truncated or corrupt
  kResourceExhausted,
  kUnavailable,  // a peer or device is not there (yet)
  kInternal,
  kOverloaded,  // the server refuses new work for now (queue full); retrying later may succeed
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: <message>"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

#if defined(__CUDACC__)
// nvcc's front end cannot evaluate fmt's consteval format-string check with every host compiler,
// so CUDA translation units format at run time.
template <typename... Args>
Status make_error(StatusCode code, fmt::string_view f, Args&&... args) {
  return Status(code, fmt::format(fmt::runtime(f), std::forward<Args>(args)...));
}
#else
template <typename... Args>
Status make_error(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
#endif

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace litellama

// Propagate a failed Status from an expression returning Status.
#define LITELLAMA_RETURN_IF_ERROR(expr) \
  do {                                  \
    ::litellama::Status _st = (expr);   \
    if (!_st.is_ok()) return _st;       \
  } while (0)

#define LITELLAMA_CONCAT_INNER(a, b) a##b
#define LITELLAMA_CONCAT(a, b) LITELLAMA_CONCAT_INNER(a, b)
// `LITELLAMA_ASSIGN_OR_RETURN(auto x, f());` declares x from a Result or returns its Status.
#define LITELLAMA_ASSIGN_OR_RETURN(lhs, expr) \
  LITELLAMA_ASSIGN_OR_RETURN_IMPL(LITELLAMA_CONCAT(_res_, __LINE__), lhs, expr)
#define LITELLAMA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.is_ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
