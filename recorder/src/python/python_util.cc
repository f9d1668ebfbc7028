#include "python/python_util.h"

namespace torchrr::recorder::python {

bool PythonUsable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

void SetFollowing(int follow, std::atomic<bool>& following, PyObject* const& wrapped,
                  void (*wrap)()) {
  if (follow == 0) {
    following.store(false, std::memory_order_release);
    return;
  }
  if (!PythonUsable()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* error_type = nullptr;
  PyObject* error_value = nullptr;
  PyObject* error_trace = nullptr;
  PyErr_Fetch(&error_type, &error_value, &error_trace);
  if (wrapped == nullptr) wrap();
  following.store(wrapped != nullptr, std::memory_order_release);
  PyErr_Restore(error_type, error_value, error_trace);
  PyGILState_Release(gil);
}

}  // namespace torchrr::recorder::python
