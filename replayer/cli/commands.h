// The verbs of the `torchrr` command line. main.cc only parses arguments; each verb lives in its
// own <verb>_command.cc and adds itself to the app with a Register<Verb>Command function.
#ifndef TORCHRR_REPLAYER_CLI_COMMANDS_H_
#define TORCHRR_REPLAYER_CLI_COMMANDS_H_

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "exit_codes.h"
#include "torchrr/format/json.h"
#include "torchrr/format/reader.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::cli {

// Adds the verb's subcommand to `app`. When the verb runs (inside app.parse), it stores its exit
// code in *exit_code.
void RegisterInfoCommand(CLI::App& app, int* exit_code);
void RegisterDumpCommand(CLI::App& app, int* exit_code);
void RegisterRecordCommand(CLI::App& app, int* exit_code);
void RegisterExportCommand(CLI::App& app, int* exit_code);
void RegisterRedactCommand(CLI::App& app, int* exit_code);
void RegisterReportCommand(CLI::App& app, int* exit_code);
void RegisterFixCommand(CLI::App& app, int* exit_code);
void RegisterReproCommand(CLI::App& app, int* exit_code);

// Every JSON output of the command line goes through format::JsonText (valid UTF-8 whatever its
// strings hold).
using format::JsonText;

// A verb that reads `trace` twice and writes `output` must not truncate the trace before its
// second read: returns kExitUsage after one error line when both name the same file, else 0.
int RefuseOverwrite(const std::string& trace, const std::string& output);

// Refuses, with one line, a trace output that TraceWriter::Open would refuse (empty, a FIFO, a
// directory, a device, a link, an existing file that is not a trace unless `replace_any_file`:
// kExitUsage, the message naming --force where that is the reason) or cannot open now (another
// recording holds it, its directory takes no new file: kExitOther). Returns 0 when it can.
int CheckTraceOutput(const std::string& output, bool replace_any_file);

// Opens `output` for a verb that writes a file made from a trace (report's page, export's JSON,
// repro's script) through format::OpenOutputFile, as the recorder opens a trace: never through a
// link, never a FIFO, device or directory, and never over an existing file that does not start
// with `own_prefix`, what the verb itself writes, unless `force`. Returns the descriptor
// (blocking, O_CLOEXEC, the file emptied), or -1 after one error line with *exit_code set:
// kExitUsage for a refusal, kExitOther when the open failed.
int OpenOutputFile(const std::string& output, std::string_view own_prefix, bool force,
                   int* exit_code);
// OpenOutputFile's refusals alone, before a verb does its work: 0, or -1 after the error line.
// Creates and opens nothing.
int CheckOutputFile(const std::string& output, std::string_view own_prefix, bool force,
                    int* exit_code);

// `-o -`: a verb whose output is a file writes it to stdout instead (export, redact, report,
// repro); `record` refuses it with a usage error (a trace is locked and written while the program
// runs, which a pipe cannot be).
inline constexpr std::string_view kStdout = "-";

// The options every verb that reads a trace and writes a file declares alike, declared here once:
// the trace argument (FILE), -o/--output OUT (`what` says what the file is; "-" for stdout is
// added to the help where `stdout_ok`), and --force.
CLI::Option* AddTraceArgument(CLI::App& command, std::string* path);
CLI::Option* AddOutputOption(CLI::App& command, std::string* output, const std::string& what,
                             bool stdout_ok);
void AddForceFlag(CLI::App& command, bool* force);

// The line every verb that wrote something prints on stderr: "torchrr: wrote OUT (WHAT)", OUT
// being "stdout" for `-o -`. Nothing else is printed there by it.
void SayWrote(const std::string& output, const std::string& what);

// The footer of a verb's help: the exit codes it returns (`codes`, from exit_codes.h), each with
// its meaning; `torchrr --help` lists all of them once.
std::string ExitCodesFooter(std::initializer_list<int> codes, const std::string& note = "");

// --source-root DIR (repeatable): where a report may read this machine's source files for code
// the trace does not carry (replayer::SetLocalSourceRoots); without it, the working directory.
void AddSourceRootOption(CLI::App& command, std::vector<std::string>* roots);

// Prints what the read found on stderr, one line each ("torchrr: warning: run.trr: truncated
// after chunk 3"; "torchrr: error: ..." when nothing could be read) and returns the exit code.
int ReportRead(const std::string& path, const format::ReadSummary& summary);

// The report of `analyzer`, fed every record of a trace whose read ended in `summary`: the
// analysis is told the torch that recorded it (FileInfo), so that every verb words PyTorch's
// messages as that torch does. Call once, after the read.
replayer::Report FinishAnalysis(replayer::Analyzer& analyzer, const format::ReadSummary& summary);

// Whether the records a read ended with `code` gave are worth analysing: all of them, or those
// before the damage (truncated, corrupt).
bool Analysable(format::StatusCode code);

}  // namespace torchrr::cli

#endif  // TORCHRR_REPLAYER_CLI_COMMANDS_H_
