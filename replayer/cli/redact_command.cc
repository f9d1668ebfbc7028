// `torchrr redact FILE -o OUT`: a copy of the trace without the names its owner may not want to
// share (privacy.h says which and how), every chunk re-written and re-checksummed by the format's
// writer. A damaged trace: what verifies is redacted, and the exit code says the copy is partial.
#include <cstdio>
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

int RunRedact(const RedactOptions& options) {
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
  if (int rc = RefuseOverwrite(options.path, options.output); rc != 0) return rc;
  if (int rc = CheckTraceOutput(options.output, options.force); rc != 0) return rc;
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
  auto writer = format::TraceWriter::Open(options.output, info, writer_options);
  if (!writer.ok()) {
    return Fail(7, replayer::Printable(writer.status().message()));
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
    std::remove(options.output.c_str());
    return Fail(7, replayer::Printable(written.message()));
  }
  std::fprintf(stderr, "torchrr: redacted %llu strings into %s (%s)\n",
               static_cast<unsigned long long>(strings_changed),
               replayer::Printable(options.output).c_str(), redaction.Describe().c_str());
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
  command->add_option("FILE", options->path, "Trace file (.trr)")->required();
  command->add_option("-o,--output", options->output, "The redacted copy (.trr)")->required();
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
  command->add_flag("--force", options->force,
                    "Replace the output even when it is an existing file that is not a trace");
  command->callback([options, exit_code] { *exit_code = RunRedact(*options); });
}

}  // namespace torchrr::cli
