// torchrr record -o FILE -- COMMAND ARGS...: runs an unchanged program with the recorder attached
// and passes its exit status through (128+N when a signal N ended it).
//
// How the recorder gets in depends on the program: a Python interpreter (python*, torchrun)
// imports torchrr through a sitecustomize directory put first on PYTHONPATH, which chains to any
// sitecustomize already there; any other program (a C++ trainer linked against libtorch) gets
// libtorchrr_preload.so through LD_PRELOAD. Only the started process records: children it spawns
// inherit LD_PRELOAD but not the recording (TORCHRR_TARGET_PID). Both are found relative to this
// executable, in an install as in the build tree (launch/recorder_dirs.h), and both read the
// options from the TORCHRR_* variables set here (recorder/src/options/environment_options.h,
// where their defaults are). The program runs as launch/child_process.h says, once
// launch/torch_check.h found its torch to be the recorder's.
//
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <charconv>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "commands.h"
#include "exit_codes.h"
#include "launch/child_process.h"
#include "launch/recorder_dirs.h"
#include "launch/torch_check.h"
#include "torchrr/format/writer.h"
#include "torchrr/recording_options.h"
#include "torchrr/replayer/printable.h"

namespace torchrr::cli {
namespace {

namespace fs = std::filesystem;

// The trace's name when -o is not given, in the working directory; when a trace of that name (or
// one of its rank or exec siblings) is there, the first free torchrr.N.trr instead (DefaultOutput).
constexpr const char* kDefaultOutput = "torchrr.trr";

struct RecordArgs {
  std::string output = kDefaultOutput;
  bool output_given = false;  // -o was on the command line.
  // The recording options given (recording_options.def), each as its TORCHRR_* variable's text.
  std::map<const RecordingOption*, std::string> options;
  bool no_stacks = false;
  bool force_python = false;
  bool force_native = false;
  bool quiet = false;  // No verdict after the program ends.
  // A trace of an earlier run whose raw write (a silent violation found by fingerprint) this run
  // locates to its line (torchrr/_locate.py); empty: none.
  std::string locate_write;
  std::vector<std::string> command;
};

bool LooksLikePython(const std::string& program) {
  std::string base = fs::path(program).filename().string();
  return base.rfind("python", 0) == 0 || base == "torchrun" || base == "pytest" ||
         base == "accelerate" || base == "deepspeed";
}

// The recorder's options (environment_options.h). Each is set only when the command line gives
// it; the others are cleared, so that the recorder's default applies and not a value left over
// in the caller's environment.
void SetOptionVariables(const RecordArgs& args) {
  for (const RecordingOption& option : RecordingOptions()) unsetenv(option.environment);
  for (const auto& [option, text] : args.options) setenv(option->environment, text.c_str(), 1);
}

void PrependEnv(const char* name, const std::string& value, char separator) {
  const char* old = std::getenv(name);
  std::string joined = value;
  if (old != nullptr && *old != '\0') joined += separator + std::string(old);
  setenv(name, joined.c_str(), 1);
}

// --spill DIR: made if missing, and named absolutely in *absolute. Refuses, with one line, a DIR
// that is something else (kExitUsage) or cannot be made (7).
int MakeSpillDir(const std::string& dir, std::string* absolute) {
  std::error_code ec;
  const fs::path path = fs::absolute(dir, ec);
  if (fs::exists(path, ec) && !fs::is_directory(path, ec)) {
    std::fprintf(stderr, "torchrr: error: --spill %s: not a directory\n", dir.c_str());
    return kExitUsage;
  }
  fs::create_directories(path, ec);
  if (ec || access(path.c_str(), W_OK | X_OK) != 0) {
    std::fprintf(stderr, "torchrr: error: --spill %s: %s\n", dir.c_str(),
                 ec ? ec.message().c_str() : std::strerror(errno));
    return kExitOther;
  }
  *absolute = path.lexically_normal().string();
  return 0;
}

// Whether `middle` (of STEM.middle.trr) names a trace a run writes beside STEM.trr: rankN (one per
// rank under torchrun), execN (the image an exec started), execN.rankM.
bool IsSiblingTrace(std::string_view middle) {
  auto numbered = [](std::string_view part, std::string_view word) {
    return part.size() > word.size() && part.starts_with(word) &&
           part.find_first_not_of("0123456789", word.size()) == std::string_view::npos;
  };
  const size_t dot = middle.find('.');
  if (dot == std::string_view::npos) return numbered(middle, "rank") || numbered(middle, "exec");
  return numbered(middle.substr(0, dot), "exec") && numbered(middle.substr(dot + 1), "rank");
}

// The traces a run that started at `started` wrote for `output`: the file itself, one per rank
// under torchrun (run.trr: run.rank0.trr, run.rank1.trr, ...), and one per exec'd image
// (run.exec1.trr), named as the user named the output; earlier runs' beside them are not this
// run's.
std::vector<fs::path> WrittenTraces(const fs::path& output, fs::file_time_type started) {
  std::error_code ec;
  std::vector<fs::path> traces;
  if (fs::is_regular_file(output, ec)) traces.push_back(output);
  std::vector<fs::path> siblings;
  const fs::path dir = output.has_parent_path() ? output.parent_path() : fs::path(".");
  const std::string prefix = output.stem().string() + ".";
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() + 4 || !name.starts_with(prefix) || !name.ends_with(".trr")) {
      continue;
    }
    if (!IsSiblingTrace(std::string_view(name).substr(prefix.size(),
                                                      name.size() - prefix.size() - 4))) {
      continue;
    }
    if (entry.is_regular_file(ec) && entry.last_write_time(ec) >= started && !ec) {
      siblings.push_back(output.has_parent_path() ? dir / name : fs::path(name));
    }
  }
  std::sort(siblings.begin(), siblings.end());
  traces.insert(traces.end(), siblings.begin(), siblings.end());
  return traces;
}

// The trace's name without -o: torchrr.trr, else the first of torchrr.1.trr, torchrr.2.trr, ...
// that no earlier run wrote (neither the file nor a rank or exec sibling of it), so that a second
// run never replaces the first's trace.
std::string DefaultOutput() {
  const fs::file_time_type any = fs::file_time_type::min();
  std::error_code ec;
  auto taken = [&](const std::string& name) {
    return fs::exists(fs::symlink_status(name, ec)) || !WrittenTraces(name, any).empty();
  };
  if (!taken(kDefaultOutput)) return kDefaultOutput;
  for (unsigned n = 1;; ++n) {
    std::string name = "torchrr." + std::to_string(n) + ".trr";
    if (!taken(name)) return name;
  }
}

std::string SizeText(uintmax_t bytes) {
  if (bytes < (1u << 10)) return std::to_string(bytes) + " bytes";
  const double kib = static_cast<double>(bytes) / 1024.0;
  return kib < 1024.0 ? fmt::format("{:.1f} KiB", kib) : fmt::format("{:.1f} MiB", kib / 1024.0);
}

// After the program ended: where each trace it wrote is (the default name said as such), or why
// there is none. On stderr, below the program's output.
void SayWhatWasWritten(const RecordArgs& args, fs::file_time_type started, bool python,
                       int status) {
  const std::vector<fs::path> traces = WrittenTraces(args.output, started);
  for (const fs::path& trace : traces) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(trace, ec);
    std::string what = "the trace, " + SizeText(ec ? 0 : size);
    if (!args.output_given && trace == fs::path(args.output)) {
      what += args.output == kDefaultOutput
                  ? std::string("; the default name without -o")
                  : std::string("; the default name, numbered: torchrr.trr is taken");
    }
    SayWrote(trace.string(), what);
  }
  // A program that could not be run was said to be (child_process.h).
  if (!traces.empty() || status == kExitNotRun) return;
  std::string why;
  if (python) {
    why = "the program never imported torch (recording starts at `import torch`)";
  } else {
    why = "the program never loaded libtorch, or it is not the process that ran it";
  }
  if (status != 0) why += "; it exited with status " + std::to_string(status);
  std::fprintf(stderr, "torchrr: no trace written to %s: %s\n",
               replayer::Printable(args.output).c_str(), why.c_str());
}

// A clean run's trace larger than this is not replayed after the program ends (a whole long run
// takes a while to analyse): `torchrr replay` says the rest. A failed run's always is.
constexpr uintmax_t kVerdictMaxBytes = uintmax_t{64} << 20;

// After the program ended: the short verdict of each trace it wrote that holds a violation, on
// stderr below the program's own output (replayer::FormatShortVerdict); nothing for a clean one.
void PrintVerdicts(const std::string& output, fs::file_time_type started, int status) {
  for (const fs::path& trace : WrittenTraces(output, started)) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(trace, ec);
    if (ec || (status == 0 && size > kVerdictMaxBytes)) continue;
    replayer::Analyzer analyzer;
    format::ReadSummary summary =
        format::ReadTraceFile(trace.string(), [&](const format::Record& r) { analyzer.Add(r); });
    if (!Analysable(summary.status.code())) continue;
    const std::string verdict =
        replayer::FormatShortVerdict(FinishAnalysis(analyzer, summary), trace.string());
    std::fputs(verdict.c_str(), stderr);
  }
}

int RunRecord(const RecordArgs& given) {
  RecordArgs args = given;
  if (args.output.empty()) {
    std::fprintf(stderr, "torchrr: error: -o: the trace's path is empty\n");
    return kExitUsage;
  }
  if (args.output == kStdout) {
    std::fprintf(stderr, "torchrr: error: record: -o -: a trace cannot go to stdout (the recorder "
                         "locks and writes a file while the program runs); name a file\n");
    return kExitUsage;
  }
  if (!args.output_given) args.output = DefaultOutput();
  std::error_code ec;
  const RecorderDirs dirs = FindRecorderDirs(fs::canonical("/proc/self/exe", ec));
  fs::path preload = dirs.lib / "libtorchrr_preload.so";
  fs::path site_dir = dirs.package / "_sitecustomize";
  fs::path output = fs::absolute(args.output, ec);

  const bool replace = args.options.contains(FindRecordingOption("replace_output"));
  // Before the program runs; the recorder checks again when it opens the file.
  if (int refused = CheckTraceOutput(output.string(), replace)) return refused;
  RecordArgs resolved = args;
  if (auto spill = resolved.options.find(FindRecordingOption("spill"));
      spill != resolved.options.end()) {
    if (int refused = MakeSpillDir(spill->second, &spill->second)) return refused;
  }

  bool python = args.force_python || (!args.force_native && LooksLikePython(args.command[0]));
  if (python && !fs::exists(site_dir / "sitecustomize.py")) {
    std::fprintf(stderr, "torchrr: error: %s not found: is torchrr built? (make build)\n",
                 (site_dir / "sitecustomize.py").c_str());
    return kExitOther;
  }
  // A Python interpreter named directly: asked, before the program runs, whether its torch is
  // the one the recorder was built against. Launchers (torchrun, pytest) are left to the
  // sitecustomize, which warns in the program.
  if (python && fs::path(args.command[0]).filename().string().rfind("python", 0) == 0) {
    std::string problem = PythonTorchProblem(args.command[0], dirs.package);
    if (!problem.empty()) {
      std::fprintf(stderr, "torchrr: error: %s\n", problem.c_str());
      return kExitTorchMismatch;
    }
  }
  if (!python && !fs::exists(preload)) {
    std::fprintf(stderr, "torchrr: error: %s not found: the recorder is not built (make build "
                         "builds it when it finds torch)\n", preload.c_str());
    return kExitOther;
  }
  // A native program, likewise, from the libtorch its loader would pick.
  if (!python) {
    std::string problem = NativeTorchProblem(args.command, dirs.lib);
    if (!problem.empty()) {
      std::fprintf(stderr, "torchrr: error: %s\n", problem.c_str());
      return kExitTorchMismatch;
    }
  }

  const fs::file_time_type started = fs::file_time_type::clock::now();
  const int status = RunProgram(args.command, [&] {
    setenv("TORCHRR_OUTPUT", output.c_str(), 1);
    // Left by a recorded program this one may run under: the first image of this run is FILE.
    unsetenv("TORCHRR_EXEC_BASE");
    unsetenv("TORCHRR_EXEC_COUNT");
    SetOptionVariables(resolved);
    unsetenv("TORCHRR_LOCATE_WRITE");
    if (!args.locate_write.empty()) {
      setenv("TORCHRR_LOCATE_WRITE", fs::absolute(args.locate_write).c_str(), 1);
    }
    if (python) {
      PrependEnv("PYTHONPATH", site_dir.string(), ':');
      // AOTAutograd's cache hands back compiled regions without the backward graph that says
      // which user line each saved tensor is for (the victim's line): traced again instead, which
      // changes compile time only. The user's own setting wins.
      setenv("TORCHINDUCTOR_AUTOGRAD_CACHE", "0", 0);
    } else {
      setenv("TORCHRR_TARGET_PID", std::to_string(getpid()).c_str(), 1);
      PrependEnv("LD_PRELOAD", preload.string(), ':');
    }
  });
  if (!args.quiet) {
    SayWhatWasWritten(args, started, python, status);
    PrintVerdicts(args.output, started, status);
  }
  return status;
}

// What `value`, given to option's flag, sets: the value times the flag's scale. Returns why not
// ("" when it is understood).
std::string FlagText(const RecordingOption& option, const std::string& value, std::string* text) {
  if (option.flag_scale == 1) {
    RecorderOptions scratch;
    *text = value;
    return option.set(value, &scratch);
  }
  const uint64_t least = (option.least + option.flag_scale - 1) / option.flag_scale;
  const uint64_t most = option.most / option.flag_scale;
  uint64_t n = 0;
  auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (value.empty() || error != std::errc() || end != value.data() + value.size() || n < least ||
      n > most) {
    return "expected a number from " + std::to_string(least) + " to " + std::to_string(most);
  }
  *text = std::to_string(n * option.flag_scale);
  return "";
}

// One flag per recording option, its relations as CLI11's needs and excludes.
void AddOptionFlags(CLI::App& cmd, const std::shared_ptr<RecordArgs>& args) {
  std::map<const RecordingOption*, CLI::Option*> flags;
  for (const RecordingOption& option : RecordingOptions()) {
    const RecordingOption* o = &option;
    CLI::Option* flag = nullptr;
    if (option.flag_value != nullptr) {
      flag = cmd.add_flag_callback(
          option.flag, [args, o] { args->options[o] = o->flag_value; }, option.help);
    } else {
      flag = cmd.add_option_function<std::string>(
                    option.flag,
                    [args, o](const std::string& value) { FlagText(*o, value, &args->options[o]); },
                    option.help)
                 ->type_name(option.value_name)
                 ->check([o](const std::string& value) {
                   std::string text;
                   return FlagText(*o, value, &text);
                 });
    }
    if (*option.help == '\0') flag->group("");
    flags[o] = flag;
  }
  for (const RecordingOptionRelation& relation : RecordingOptionRelations()) {
    if (relation.needs) {
      flags[relation.option]->needs(flags[relation.other]);
    } else {
      flags[relation.option]->excludes(flags[relation.other]);
    }
  }
}

}  // namespace

void RegisterRecordCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<RecordArgs>();
  CLI::App* cmd = app.add_subcommand(
      "record", "Run a program with the recorder attached: torchrr record -o run.trr -- CMD ...");
  AddOutputOption(*cmd, &args->output,
                  "The trace to write: a new or regular file, locked while recorded (torchrun: "
                  "one per rank, OUT.rankN.trr); default: torchrr.trr in the working directory, "
                  "or torchrr.N.trr when that is taken",
                  /*stdout_ok=*/false);
  cmd->add_flag("--no-stacks", args->no_stacks, "Do not capture stacks (faster, no lines)");
  AddOptionFlags(*cmd, args);
  cmd->add_flag("--quiet", args->quiet,
                "Print nothing after the program ends (by default: where the trace is, and for a "
                "trace with a violation its culprit and victim lines and the fix)");
  cmd->add_option("--locate-write", args->locate_write,
                  "A trace of an earlier run of this program whose write into a saved tensor no "
                  "op made (--verify-saved's evidence fingerprint): this run watches that tensor's "
                  "bytes line by line from its save to its use and names the line after which "
                  "they changed (Python programs)")
      ->type_name("TRACE")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--python", args->force_python, "The command is a Python program");
  cmd->add_flag("--native", args->force_native, "The command is a native program (LD_PRELOAD)");
  cmd->add_option("command", args->command, "The program and its arguments, after --")
      ->required();
  cmd->footer(ExitCodesFooter(
      {kExitUsage, kExitOther, kExitTorchMismatch, kExitNotRun},
      "Otherwise the program's own exit status (128+N when signal N ended it). The program is "
      "not run when the output is empty or not a regular file (2), another recording is "
      "writing it (7), or its torch is not the one torchrr was built against (9). Ctrl-C "
      "reaches the program once, from the terminal; SIGTERM and SIGHUP sent to torchrr are "
      "passed on."));
  cmd->callback([cmd, args, exit_code] {
    if (args->no_stacks) {
      args->options[FindRecordingOption("native_stacks")] = "0";
      args->options[FindRecordingOption("python_stacks")] = "0";
    }
    args->output_given = cmd->get_option("--output")->count() > 0;
    *exit_code = RunRecord(*args);
  });
}

}  // namespace torchrr::cli
