// `torchrr repro FILE -o OUT.py`: a standalone Python script, using only torch, that reproduces
// one violation from the trace alone (torchrr/replayer/repro.h says what it holds); `--check`
// runs it, from a temporary directory, and says whether it reproduced.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "launch/child_process.h"
#include "launch/recorder_dirs.h"
#include "torchrr/format/output_file.h"
#include "torchrr/format/reader.h"
#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/repro.h"

namespace torchrr::cli {
namespace {

struct ReproCommandOptions {
  std::string path;
  std::string output;
  size_t violation = 0;
  std::string device;
  bool force = false;
  bool check = false;
  unsigned timeout_s = 120;
};

namespace fs = std::filesystem;

// A temporary directory, removed with what it holds when this goes out of scope.
class TemporaryDirectory {
 public:
  TemporaryDirectory() {
    std::error_code ec;
    std::string pattern = (fs::temp_directory_path(ec) / "torchrr-repro-XXXXXX").string();
    if (!ec && ::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TemporaryDirectory() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
  const fs::path& path() const { return path_; }  // Empty when it could not be made.

 private:
  fs::path path_;
};

// `repro --check`: runs `script` with ScriptPython's python from a temporary directory (the
// script in it, its output kept there), killed by SIGALRM after `timeout_s` seconds, and prints
// whether it reproduced `v`. Returns 0 when it did, kExitNotReproduced when it ran and did not,
// kExitOther when it could not be run.
int CheckRepro(const replayer::Violation& v, const std::string& script, unsigned timeout_s) {
  TemporaryDirectory directory;
  if (directory.path().empty()) {
    std::fprintf(stderr, "torchrr: error: repro --check: no temporary directory: %s\n",
                 std::strerror(errno));
    return kExitOther;
  }
  const fs::path script_path = directory.path() / "repro.py";
  const fs::path output_path = directory.path() / "output.txt";
  const int fd = ::open(script_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  const bool written = fd >= 0 && format::WriteAll(fd, script, script_path.string()).ok();
  if (fd < 0 || ::close(fd) != 0 || !written) {
    std::fprintf(stderr, "torchrr: error: repro --check: %s: write failed\n", script_path.c_str());
    return kExitOther;
  }
  std::error_code ec;
  const fs::path exe = fs::canonical("/proc/self/exe", ec);
  const std::string python = ScriptPython(FindRecorderDirs(exe).package);
  const int status = RunProgram({python, script_path.string()}, [&] {
    // In the child: its output into the file, and the timer that ends a script which hangs (an
    // alarm survives exec, and Python leaves SIGALRM's default, which ends the process).
    const int out = ::open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out >= 0) {
      ::dup2(out, STDOUT_FILENO);
      ::dup2(out, STDERR_FILENO);
      ::close(out);
    }
    if (::chdir(directory.path().c_str()) != 0) _exit(kExitOther);
    ::alarm(timeout_s);
  });
  std::ifstream file(output_path, std::ios::binary);
  const std::string output((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (status == kExitNotRun || output.find("No module named 'torch'") != std::string::npos) {
    std::fprintf(stderr, "torchrr: error: repro --check: %s %s: set TORCHRR_PYTHON to a Python "
                 "with torch\n", replayer::Printable(python).c_str(),
                 status == kExitNotRun ? "could not be run" : "has no torch");
    return kExitOther;
  }
  if (status == 128 + SIGALRM) {
    std::printf("not reproduced: the script ran past --timeout %us\n", timeout_s);
    return kExitNotReproduced;
  }
  const replayer::ReproCheck check = replayer::JudgeRepro(v, status, output);
  std::printf("%s: %s (%s)\n", check.reproduced ? "reproduced" : "not reproduced",
              check.summary.c_str(), replayer::Printable(python).c_str());
  return check.reproduced ? kExitOk : kExitNotReproduced;
}

int RunRepro(const ReproCommandOptions& options) {
  if (options.output.empty() && !options.check) {
    std::fprintf(stderr, "torchrr: error: repro: -o OUT.py is required (unless --check)\n");
    return kExitUsage;
  }
  const bool to_stdout = options.output == kStdout;
  if (to_stdout && options.check) {
    std::fprintf(stderr, "torchrr: error: repro: --check prints its verdict on stdout: write "
                         "the script to a file with -o, or leave -o out\n");
    return kExitUsage;
  }
  const bool to_file = !options.output.empty() && !to_stdout;
  int refused = 0;
  if (to_file) {
    if (int rc = RefuseOverwrite(options.path, options.output); rc != 0) return rc;
    if (CheckOutputFile(options.output, replayer::kReproPrefix, options.force, &refused) != 0) {
      return refused;
    }
  }
  // The slice walks back from the culprit, so the records stay in memory.
  replayer::Analyzer analyzer;
  std::vector<format::Record> records;
  format::ReadSummary summary = format::ReadTraceFile(options.path, [&](const format::Record& r) {
    analyzer.Add(r);
    records.push_back(r);
  });
  int rc = ReportRead(options.path, summary);
  if (NothingToWrite(rc)) return rc;
  replayer::Report report = FinishAnalysis(analyzer, summary);

  replayer::ReproOptions repro_options;
  repro_options.violation = options.violation;
  repro_options.device = options.device;
  repro_options.trace_name = options.path;
  replayer::Repro repro = replayer::WriteRepro(records, report, summary.info, repro_options);
  if (!repro.ok) {
    std::fprintf(stderr, "torchrr: error: %s: no reproducer: %s\n",
                 replayer::Printable(options.path).c_str(), repro.error.c_str());
    return kExitNoRepro;
  }
  if (!options.output.empty()) {
    const int fd = to_stdout ? STDOUT_FILENO
                             : OpenOutputFile(options.output, replayer::kReproPrefix,
                                              options.force, &refused);
    if (fd < 0) return refused;
    const bool written = format::WriteAll(fd, repro.script, options.output).ok();
    if ((!to_stdout && ::close(fd) != 0) || !written) {
      std::fprintf(stderr, "torchrr: error: %s: write failed\n",
                   replayer::Printable(options.output).c_str());
      return kExitOther;
    }
    const std::string stand_ins =
        repro.stand_ins == 0 ? "" : ", " + std::to_string(repro.stand_ins) + " through a stand-in";
    SayWrote(options.output, "the reproducer of violation " + std::to_string(options.violation) +
                                 ": " + std::to_string(repro.slice_ops) + " of the trace's " +
                                 std::to_string(repro.trace_ops) + " ops" + stand_ins);
  }
  if (options.check) {
    std::fflush(stderr);
    const int checked =
        CheckRepro(report.violations[options.violation], repro.script, options.timeout_s);
    if (checked != kExitOk) return checked;
  }
  return rc;
}

}  // namespace

void RegisterReproCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<ReproCommandOptions>();
  CLI::App* command = app.add_subcommand(
      "repro", "Write a standalone Python script, using only torch, that reproduces a violation");
  AddTraceArgument(*command, &options->path);
  AddOutputOption(*command, &options->output, "The script (.py), required unless --check",
                  /*stdout_ok=*/true);
  command
      ->add_option("--violation", options->violation,
                   "Which violation, from 0 in the order of `torchrr replay --json` "
                   "(default: the first)")
      ->type_name("N");
  command
      ->add_option("--device", options->device,
                   "Where the script runs the recorded non-CPU tensors (default: the recorded "
                   "device when the machine has it, else the CPU)")
      ->type_name("DEVICE");
  AddForceFlag(*command, &options->force);
  command->add_flag(
      "--check", options->check,
      "Run the script (a copy in a temporary directory) with $TORCHRR_PYTHON, else the python3 "
      "beside the torchrr called, else that of the environment torchrr is installed in, else "
      "python3, and say whether it reproduced: "
      "exit 0 when it raised PyTorch's recorded message (a silent write: the gradients "
      "differed), 13 when it did not");
  command->add_option("--timeout", options->timeout_s, "Seconds the script may run (--check)")
      ->type_name("SECONDS")
      ->check(CLI::Range(1u, 86400u))
      ->capture_default_str();
  command->footer(ExitCodesFooter({kExitOk, kExitUsage, kExitNotATrace, kExitTruncated,
                                   kExitCorrupt, kExitTooNew, kExitOther, kExitNoRepro,
                                   kExitNotReproduced, kExitMemory}));
  command->callback([options, exit_code] { *exit_code = RunRepro(*options); });
}

}  // namespace torchrr::cli
