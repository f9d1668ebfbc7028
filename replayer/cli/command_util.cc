#include <cstdio>

#include "commands.h"
#include "torchrr/replayer/printable.h"

namespace torchrr::cli {

int ReportRead(const std::string& path, const format::ReadSummary& summary) {
  using format::StatusCode;
  StatusCode code = summary.status.code();
  bool fatal = code == StatusCode::kNotATrace || code == StatusCode::kTooNew ||
               code == StatusCode::kInvalidArgument || code == StatusCode::kIoError;
  std::string shown = replayer::Printable(path);
  if (fatal) {
    std::fprintf(stderr, "torchrr: error: %s: %s\n", shown.c_str(),
                 replayer::Printable(summary.status.message()).c_str());
  } else {
    for (const std::string& warning : summary.warnings) {
      std::fprintf(stderr, "torchrr: warning: %s: %s\n", shown.c_str(),
                   replayer::Printable(warning).c_str());
    }
  }
  return ExitCodeFor(code);
}

}  // namespace torchrr::cli
