#include <sys/stat.h>

#include <cstdio>

#include "commands.h"
#include "torchrr/replayer/printable.h"

namespace torchrr::cli {

int RefuseOverwrite(const std::string& trace, const std::string& output) {
  struct stat a {};
  struct stat b {};
  if (stat(trace.c_str(), &a) != 0 || stat(output.c_str(), &b) != 0 || a.st_dev != b.st_dev ||
      a.st_ino != b.st_ino) {
    return 0;
  }
  std::fprintf(stderr, "torchrr: error: %s: the output would overwrite the trace it is made from\n",
               replayer::Printable(output).c_str());
  return kExitUsage;
}

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

bool Analysable(format::StatusCode code) {
  return code == format::StatusCode::kOk || code == format::StatusCode::kTruncated ||
         code == format::StatusCode::kCorrupt;
}

replayer::Report FinishAnalysis(replayer::Analyzer& analyzer, const format::ReadSummary& summary) {
  if (summary.has_info) analyzer.SetRecordingTorch(summary.info.torch_version);
  return analyzer.Finish();
}

}  // namespace torchrr::cli
