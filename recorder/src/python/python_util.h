// What the Python nodes library's parts share: whether Python can be called, and starting or
// stopping what a part follows.
#ifndef TORCHRR_RECORDER_PYTHON_UTIL_H_
#define TORCHRR_RECORDER_PYTHON_UTIL_H_

#include <Python.h>

#include <atomic>

namespace torchrr::recorder::python {

// The interpreter is up and not finalizing.
bool PythonUsable();

// Starts following, wrapping what `wrap` wraps the first time (under the GIL), or stops (taking
// neither the GIL nor a lock). `following` says whether the wrap is in place and followed.
void SetFollowing(int follow, std::atomic<bool>& following, PyObject* const& wrapped,
                  void (*wrap)());

}  // namespace torchrr::recorder::python

#endif  // TORCHRR_RECORDER_PYTHON_UTIL_H_
