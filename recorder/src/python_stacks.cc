#include "python_stacks.h"

namespace torchrr::recorder {

// Not implemented yet: no Python frames.
size_t CapturePythonStack(PythonFrame*, size_t, std::vector<PythonCode>*) { return 0; }

}  // namespace torchrr::recorder
