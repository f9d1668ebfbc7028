#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "commands.h"
#include "torchrr/format/output_file.h"
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

namespace {

format::OutputFileOptions VerbOutput(std::string_view own_prefix, bool force) {
  format::OutputFileOptions options;
  options.own_prefix = own_prefix;
  options.replace_any_file = force;
  return options;
}

// One line for a refused or failed output; its exit code.
int OutputError(const format::Status& status) {
  std::string message = replayer::Printable(status.message());
  if (message.ends_with(format::kNotReplaced)) message += " (--force replaces it)";
  std::fprintf(stderr, "torchrr: error: %s\n", message.c_str());
  return status.code() == format::StatusCode::kInvalidArgument ? kExitUsage : kExitOther;
}

}  // namespace

int CheckTraceOutput(const std::string& output, bool replace_any_file) {
  format::Status usable = format::TraceWriter::CheckPath(output, replace_any_file);
  return usable.ok() ? 0 : OutputError(usable);
}

int CheckOutputFile(const std::string& output, std::string_view own_prefix, bool force,
                    int* exit_code) {
  format::Status usable = format::CheckOutputFile(output, VerbOutput(own_prefix, force));
  if (usable.ok()) return 0;
  *exit_code = OutputError(usable);
  return -1;
}

int OpenOutputFile(const std::string& output, std::string_view own_prefix, bool force,
                   int* exit_code) {
  format::StatusOr<int> fd = format::OpenOutputFile(output, VerbOutput(own_prefix, force),
                                                    /*create=*/true, /*truncate=*/true);
  if (fd.ok()) return fd.value();
  *exit_code = OutputError(fd.status());
  return -1;
}

CLI::Option* AddTraceArgument(CLI::App& command, std::string* path) {
  return command.add_option("FILE", *path, "The trace (.trr)")->required();
}

CLI::Option* AddOutputOption(CLI::App& command, std::string* output, const std::string& what,
                             bool stdout_ok) {
  return command
      .add_option("-o,--output", *output,
                  what + (stdout_ok ? "; - writes it to stdout" : ""))
      ->type_name("OUT");
}

void AddForceFlag(CLI::App& command, bool* force) {
  command.add_flag("--force", *force,
                   "Replace the output even when it is an existing file this verb did not write");
}

void SayWrote(const std::string& output, const std::string& what) {
  const std::string where = output == kStdout ? "stdout" : replayer::Printable(output);
  std::fprintf(stderr, "torchrr: wrote %s (%s)\n", where.c_str(), what.c_str());
}

std::string ExitCodesFooter(std::initializer_list<int> codes, const std::string& note) {
  std::string text = "Exit codes:\n";
  for (int code : codes) {
    for (const ExitCodeMeaning& exit : kExitCodeMeanings) {
      if (exit.code != code) continue;
      const std::string number = std::to_string(code);
      text += "  " + number + std::string(number.size() < 3 ? 3 - number.size() : 1, ' ') +
              exit.meaning + "\n";
    }
  }
  return note.empty() ? text : text + note + "\n";
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
