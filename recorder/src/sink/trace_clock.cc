// The trace's clock: every record's time.
#include "sink/trace_sink.h"

#include <chrono>

namespace torchrr::recorder {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace torchrr::recorder
