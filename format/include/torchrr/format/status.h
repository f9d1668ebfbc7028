// Status and StatusOr for the format and the replayer: errors are values with a code and a message
// that carries the place and a searchable tag ("chunk 7 @ 0x1f400: checksum mismatch (corrupt)").
#ifndef TORCHRR_FORMAT_STATUS_H_
#define TORCHRR_FORMAT_STATUS_H_

#include <optional>
#include <string>
#include <utility>

namespace torchrr::format {

// Ordered by severity; the CLI's exit codes follow from them (ExitCodeFor).
enum class StatusCode : int {
  kOk = 0,
  kTruncated = 1,   // The file ends inside a chunk or lacks its index: every whole chunk returned.
  kCorrupt = 2,     // A chunk failed its checksum or its FlatBuffer did not verify.
  kTooNew = 3,      // Written by a newer major format than this reader knows.
  kNotATrace = 4,   // Missing or unreadable, or no torchrr magic.
  kInvalidArgument = 5,
  kIoError = 6,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design.
  StatusOr(T value) : value_(std::move(value)) {}          // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T& operator*() { return *value_; }
  T* operator->() { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

#define TORCHRR_RETURN_IF_ERROR(expr)             \
  do {                                            \
    ::torchrr::format::Status status_ = (expr);   \
    if (!status_.ok()) return status_;            \
  } while (0)

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_STATUS_H_
