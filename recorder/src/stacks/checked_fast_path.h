// CheckedFastPath: a fast way to capture a stack, checked against the slow reference it replaces.
//
// The native stack unwinder (libunwind against Boost.Stacktrace) and the Python stack walker
// (CPython 3.11's frames against its API) each use one: every capture on the first `verify_first`,
// then one in `verify_every`, also takes the reference and compares; the first disagreement turns
// the fast path off for the rest of the process. Thread-safe.
#ifndef TORCHRR_RECORDER_CHECKED_FAST_PATH_H_
#define TORCHRR_RECORDER_CHECKED_FAST_PATH_H_

#include <atomic>
#include <cstdint>

namespace torchrr::recorder {

class CheckedFastPath {
 public:
  CheckedFastPath(bool enabled, uint64_t verify_first, uint64_t verify_every)
      : enabled_(enabled), verify_first_(verify_first), verify_every_(verify_every) {}

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Counts a capture on the fast path; true when this one must also be checked.
  bool NextCaptureIsChecked() {
    uint64_t capture = captures_.fetch_add(1, std::memory_order_relaxed);
    return capture < verify_first_ || capture % verify_every_ == 0;
  }
  void Disable() { enabled_.store(false, std::memory_order_relaxed); }  // For good.

 private:
  std::atomic<bool> enabled_;
  std::atomic<uint64_t> captures_{0};
  const uint64_t verify_first_;
  const uint64_t verify_every_;
};

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_CHECKED_FAST_PATH_H_
