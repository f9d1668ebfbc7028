#include <cstdio>

#include "commands.h"

namespace torchrr::cli {

int ReportRead(const std::string& path, const format::ReadSummary& summary) {
  using format::StatusCode;
  StatusCode code = summary.status.code();
  bool fatal = code == StatusCode::kNotATrace || code == StatusCode::kTooNew ||
               code == StatusCode::kInvalidArgument || code == StatusCode::kIoError;
  if (fatal) {
    std::fprintf(stderr, "torchrr: error: %s: %s\n", path.c_str(),
                 summary.status.message().c_str());
  } else {
    for (const std::string& warning : summary.warnings) {
      std::fprintf(stderr, "torchrr: warning: %s: %s\n", path.c_str(), warning.c_str());
    }
  }
  return ExitCodeFor(code);
}

}  // namespace torchrr::cli
