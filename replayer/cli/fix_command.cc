// `torchrr fix FILE`: a patch for each culprit line, as a unified diff (`--json`: as data);
// `--check` re-runs the recorded command on patched copies and replays it, `--apply` then writes
// the checked patch. The rewrites need Python's own parser, so the verb runs the torchrr
// package's torchrr._fix (recorder/python/torchrr/_fix.py) with ScriptPython's python: it is
// standard library only, so any Python 3.9+ runs it, whatever torch it has or lacks.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "launch/child_process.h"
#include "launch/recorder_dirs.h"

namespace torchrr::cli {
namespace {

namespace fs = std::filesystem;

struct FixOptions {
  std::string path;
  bool json = false;
  bool check = false;
  bool apply = false;
  double timeout_s = 600;
  unsigned steps = 0;  // 0: the whole run.
};

// The exit codes torchrr._fix returns, passed to it so that exit_codes.h stays their one list.
std::string FixExitCodes() {
  return "ok=" + std::to_string(kExitOk) + ",violations=" + std::to_string(kExitViolations) +
         ",usage=" + std::to_string(kExitUsage) + ",other=" + std::to_string(kExitOther) +
         ",no_fix=" + std::to_string(kExitViolations) +
         ",not_rerun=" + std::to_string(kExitNotRerun);
}

int RunFix(const FixOptions& options) {
  std::error_code ec;
  const fs::path exe = fs::canonical("/proc/self/exe", ec);
  const fs::path package = FindRecorderDirs(exe).package;
  if (!fs::exists(package / "_fix.py")) {
    std::fprintf(stderr, "torchrr: error: %s not found: is torchrr installed whole?\n",
                 (package / "_fix.py").c_str());
    return kExitOther;
  }
  const std::string python = ScriptPython(package);
  // The options go as JSON, so that this table stays their one declaration; the trace's path
  // stays an argument, whose bytes need not be UTF-8.
  const nlohmann::json passed = {
      {"json", options.json},
      {"check", options.check},
      {"apply", options.apply},
      {"timeout", options.timeout_s},
      {"steps", options.steps > 0 ? nlohmann::json(options.steps) : nlohmann::json(nullptr)}};
  const std::vector<std::string> command = {python, "-m", "torchrr._fix", options.path};
  const std::string python_path = package.parent_path().string();
  int rc = RunProgram(command, [&] {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path = old && *old ? python_path + ":" + old : python_path;
    setenv("PYTHONPATH", path.c_str(), 1);
    setenv("TORCHRR_CLI", exe.c_str(), 1);
    setenv("TORCHRR_FIX_EXIT_CODES", FixExitCodes().c_str(), 1);
    setenv("TORCHRR_FIX_OPTIONS", passed.dump().c_str(), 1);
  });
  if (rc == kExitNotRun) {
    std::fprintf(stderr, "torchrr: error: fix needs Python 3 (%s): set TORCHRR_PYTHON\n",
                 python.c_str());
    return kExitOther;
  }
  return rc;
}

}  // namespace

void RegisterFixCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<FixOptions>();
  CLI::App* fix = app.add_subcommand(
      "fix", "Propose a patch for each violation's culprit line, as a unified diff; --check "
             "proves it by re-running the recorded command on patched copies");
  AddTraceArgument(*fix, &options->path);
  fix->add_flag("--json", options->json,
                "The edits as JSON: file, first_line, last_line, old, new, violations, certain");
  fix->add_flag("--check", options->check,
                "Re-run the recorded Python command under `torchrr record` with the patch applied "
                "to copies of its files, and replay it");
  fix->add_flag("--apply", options->apply,
                "After a clean --check, write the patch to the files (each old file kept as "
                "FILE.orig)");
  fix->add_option("--timeout", options->timeout_s, "Seconds the re-run may take (--check)")
      ->type_name("SECONDS")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  fix->add_option("--steps", options->steps,
                  "Stop the re-run once its first N training steps are recorded (--check)")
      ->type_name("N")
      ->check(CLI::Range(1u, std::numeric_limits<unsigned>::max()));
  fix->footer(ExitCodesFooter({kExitOk, kExitViolations, kExitUsage, kExitNotATrace,
                               kExitTruncated, kExitCorrupt, kExitTooNew, kExitOther,
                               kExitNotRerun, kExitMemory}));
  fix->callback([options, exit_code] {
    FixOptions run = *options;
    run.check = run.check || run.apply;
    *exit_code = RunFix(run);
  });
}

}  // namespace torchrr::cli
