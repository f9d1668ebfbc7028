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
  GilAndErrorGuard guard;
  if (wrapped == nullptr) wrap();
  following.store(wrapped != nullptr, std::memory_order_release);
}

}  // namespace torchrr::recorder::python
