// What the Python nodes library's parts share: whether Python can be called, and starting or
// stopping what a part follows.
#ifndef TORCHRR_RECORDER_PYTHON_UTIL_H_
#define TORCHRR_RECORDER_PYTHON_UTIL_H_

#include <Python.h>

#include <atomic>

namespace torchrr::recorder::python {

// The interpreter is up and not finalizing.
bool PythonUsable();

// Holds the GIL and sets Python's error state aside for its lifetime: what the code under it
// raises is cleared, and the error that was set before (a raising op's) is set again. Only where
// PythonUsable().
class GilAndErrorGuard {
 public:
  GilAndErrorGuard() : gil_(PyGILState_Ensure()) { PyErr_Fetch(&type_, &value_, &trace_); }
  ~GilAndErrorGuard() {
    PyErr_Clear();
    PyErr_Restore(type_, value_, trace_);
    PyGILState_Release(gil_);
  }
  GilAndErrorGuard(const GilAndErrorGuard&) = delete;
  GilAndErrorGuard& operator=(const GilAndErrorGuard&) = delete;

 private:
  PyGILState_STATE gil_;
  PyObject* type_ = nullptr;
  PyObject* value_ = nullptr;
  PyObject* trace_ = nullptr;
};

// Starts following, wrapping what `wrap` wraps the first time (under the GIL), or stops (taking
// neither the GIL nor a lock). `following` says whether the wrap is in place and followed.
void SetFollowing(int follow, std::atomic<bool>& following, PyObject* const& wrapped,
                  void (*wrap)());

}  // namespace torchrr::recorder::python

#endif  // TORCHRR_RECORDER_PYTHON_UTIL_H_
