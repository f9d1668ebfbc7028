// `torchrr redact FILE -o OUT`: a copy of the trace without the names its owner may not want to
// share (privacy.h says which and how), every chunk re-written and re-checksummed by the format's
// writer. A damaged trace: what verifies is redacted, and the exit code says the copy is partial.
// `-o -` writes the copy to stdout (not to a terminal): the writer makes it in a temporary
// directory, then it is copied out whole.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "torchrr/replayer/privacy.h"
#include "torchrr/format/reader.h"
#include "torchrr/format/writer.h"
#include "torchrr/replayer/printable.h"

namespace torchrr::cli {
namespace {

struct RedactOptions {
  std::string path;
  std::string output;
  std::vector<std::string> maps;  // OLD=NEW
  bool drop_values = false;
  bool drop_source = false;
  bool drop_args = false;
  bool force = false;
};

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "torchrr: error: %s\n", message.c_str());
  return code;
}

namespace fs = std::filesystem;

// Where the copy is written for `-o -`: a file in a directory of its own, removed with it.
class StdoutStaging {
 public:
  StdoutStaging() {
    std::error_code ec;
    std::string pattern = (fs::temp_directory_path(ec) / "torchrr-redact-XXXXXX").string();
    if (!ec && ::mkdtemp(pattern.data()) != nullptr) dir_ = pattern;
  }
  ~StdoutStaging() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  StdoutStaging(const StdoutStaging&) = delete;
  StdoutStaging& operator=(const StdoutStaging&) = delete;
  // The file to write; empty when no directory could be made.
  std::string file() const { return dir_.empty() ? "" : (dir_ / "redacted.trr").string(); }

 private:
  fs::path dir_;
};

// Copies the file at `path` to stdout. Returns whether all of it was written.
bool CopyToStdout(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char buffer[1 << 16];
  while (in) {
    in.read(buffer, sizeof buffer);
    const size_t n = static_cast<size_t>(in.gcount());
    if (n != 0 && std::fwrite(buffer, 1, n, stdout) != n) return false;
  }
  return in.eof() && std::fflush(stdout) == 0;
}

int RunRedact(const RedactOptions& options) {
  const bool to_stdout = options.output == kStdout;
  if (to_stdout && isatty(STDOUT_FILENO)) {
    return Fail(kExitUsage, "redact: -o -: stdout is a terminal; redirect it to a file or a pipe");
  }
  replayer::Redaction redaction;
  redaction.drop_values = options.drop_values;
  redaction.drop_source = options.drop_source;
  redaction.drop_args = options.drop_args;
  for (const std::string& map : options.maps) {
    size_t eq = map.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Fail(kExitUsage, "--map " + replayer::Printable(map) + ": expected OLD=NEW");
    }
    redaction.maps.emplace_back(map.substr(0, eq), map.substr(eq + 1));
  }
  StdoutStaging staging;
  if (to_stdout && staging.file().empty()) {
    return Fail(kExitOther, std::string("redact: no temporary directory: ") + std::strerror(errno));
  }
  const std::string output = to_stdout ? staging.file() : options.output;
  if (!to_stdout) {
    if (int rc = RefuseOverwrite(options.path, output); rc != 0) return rc;
    if (int rc = CheckTraceOutput(output, options.force); rc != 0) return rc;
  }
  // Pass 1: the names to redact, and whether the trace can be read at all.
  format::ReadSummary summary =
      format::ReadTraceFile(options.path, [&](const format::Record& r) { redaction.FindNames(r); });
  int rc = ReportRead(options.path, summary);
  if (NothingToWrite(rc)) return rc;
  redaction.FindNames(summary.info);
  redaction.AddThisMachine();
  redaction.Finish();

  format::FileInfo info = summary.info;
  redaction.ApplyTo(info);
  format::WriterOptions writer_options;
  writer_options.replace_any_file = options.force;
  auto writer = format::TraceWriter::Open(output, info, writer_options);
  if (!writer.ok()) {
    return Fail(kExitOther, replayer::Printable(writer.status().message()));
  }
  // Pass 2: every record, rewritten, in the order read.
  format::Status written = format::Status::Ok();
  uint64_t strings_changed = 0;
  (void)format::ReadTraceFile(options.path, [&](const format::Record& r) {
    if (!written.ok() || redaction.Drops(r)) return;
    format::Record copy = r;
    strings_changed += redaction.ApplyTo(copy);
    written = (*writer)->Append(copy);
  });
  if (written.ok()) written = (*writer)->Close();
  if (!written.ok()) {
    std::remove(output.c_str());
    return Fail(kExitOther, replayer::Printable(written.message()));
  }
  if (to_stdout && !CopyToStdout(output)) return Fail(kExitOther, "stdout: write failed");
  SayWrote(options.output, "the redacted copy: " + std::to_string(strings_changed) +
                               " strings changed; " + redaction.Describe());
  if (rc != 0) {
    std::fprintf(stderr,
                 "torchrr: warning: %s: the copy holds only the %llu records that could be read\n",
                 replayer::Printable(options.path).c_str(),
                 static_cast<unsigned long long>(summary.records()));
  }
  return rc;
}

}  // namespace

void RegisterRedactCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<RedactOptions>();
  CLI::App* command = app.add_subcommand(
      "redact",
      "Copy a trace without its home directories, user and host names (and, on request, "
      "argument values or source code); it replays to the same verdicts");
  AddTraceArgument(*command, &options->path);
  AddOutputOption(*command, &options->output, "The redacted copy (.trr)", /*stdout_ok=*/true)
      ->required();
  command
      ->add_option("--map", options->maps,
                   "Replace OLD by NEW in every string, before the other rules (repeatable)")
      ->type_name("OLD=NEW");
  command->add_flag("--drop-values", options->drop_values,
                    "Drop the ops' non-tensor arguments (numbers, strings, lists)");
  command->add_flag("--drop-source", options->drop_source,
                    "Drop the source code the trace carries (the replay then quotes code only "
                    "where the files are at hand)");
  command->add_flag("--drop-args", options->drop_args,
                    "Drop the recorded command line's arguments (the program's name stays)");
  AddForceFlag(*command, &options->force);
  command->footer(ExitCodesFooter({kExitOk, kExitUsage, kExitNotATrace, kExitTruncated,
                                   kExitCorrupt, kExitTooNew, kExitOther, kExitMemory}));
  command->callback([options, exit_code] { *exit_code = RunRedact(*options); });
}

}  // namespace torchrr::cli
