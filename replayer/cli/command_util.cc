#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "commands.h"
#include "torchrr/format/writer.h"
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

int CheckTraceOutput(const std::string& output, bool replace_any_file) {
  format::Status usable = format::TraceWriter::CheckPath(output, replace_any_file);
  if (usable.ok()) return 0;
  std::string message = replayer::Printable(usable.message());
  if (message.ends_with(format::TraceWriter::kNotReplacedSuffix)) message += " (--force replaces it)";
  std::fprintf(stderr, "torchrr: error: %s\n", message.c_str());
  return usable.code() == format::StatusCode::kInvalidArgument ? kExitUsage : kExitOther;
}

namespace {

int RefuseOutput(const std::string& output, const char* why, int* exit_code) {
  std::fprintf(stderr, "torchrr: error: %s: %s\n", replayer::Printable(output).c_str(), why);
  *exit_code = kExitUsage;
  return -1;
}

const char* NotAFile(mode_t mode) {
  return S_ISLNK(mode)    ? "a symbolic link: not written through"
         : S_ISDIR(mode)  ? "a directory"
         : S_ISFIFO(mode) ? "a FIFO: not a file to write to"
                          : "not a regular file";
}

}  // namespace

int CheckOutputFile(const std::string& output, std::string_view own_prefix, bool force,
                    int* exit_code) {
  if (output.empty()) return RefuseOutput(output, "the output's path is empty", exit_code);
  struct stat st {};
  const bool exists = ::lstat(output.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) return RefuseOutput(output, NotAFile(st.st_mode), exit_code);
  if (exists && st.st_size > 0 && !force) {
    std::string head(own_prefix.size(), '\0');
    ssize_t n = -1;
    if (int in = ::open(output.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
        in >= 0) {
      n = ::pread(in, head.data(), head.size(), 0);
      ::close(in);
    }
    if (n != static_cast<ssize_t>(head.size()) || head != own_prefix) {
      return RefuseOutput(output, "exists and was not written by this torchrr verb: not replaced "
                                  "(--force replaces it)", exit_code);
    }
  }
  return 0;
}

int OpenOutputFile(const std::string& output, std::string_view own_prefix, bool force,
                   int* exit_code) {
  if (CheckOutputFile(output, own_prefix, force, exit_code) != 0) return -1;
  struct stat st {};
  int fd = ::open(output.c_str(),
                  O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
                  0644);
  if (fd < 0) {
    if (errno == ELOOP) return RefuseOutput(output, NotAFile(S_IFLNK), exit_code);
    if (errno == ENXIO) return RefuseOutput(output, NotAFile(S_IFIFO), exit_code);
    if (errno == EISDIR) return RefuseOutput(output, NotAFile(S_IFDIR), exit_code);
    std::fprintf(stderr, "torchrr: error: %s: %s\n", replayer::Printable(output).c_str(),
                 std::strerror(errno));
    *exit_code = kExitOther;
    return -1;
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return RefuseOutput(output, NotAFile(st.st_mode), exit_code);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void AddSourceRootOption(CLI::App& command, std::vector<std::string>* roots) {
  command
      .add_option("--source-root", *roots,
                  "Quote this machine's source files under DIR for code the trace does not carry "
                  "(repeatable; default: the working directory only; a trace's own code is always "
                  "quoted)")
      ->type_name("DIR")
      ->check(CLI::ExistingDirectory);
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
