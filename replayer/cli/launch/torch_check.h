// Whether the program `torchrr record` is about to run has the torch the recorder was built
// against, asked before it runs. A Python program: its interpreter is asked. A native program (a
// C++ trainer linked against libtorch): the recorder
// that LD_PRELOAD puts into it was built against one torch, and its libtorch is then the one the
// whole process uses (the loader matches the program's libtorch_cpu.so to the one already loaded
// by name), so a program built against another torch would run on the wrong one: an undefined
// symbol at start, or objects read with the wrong layout. `torchrr record` asks before it runs
// the program, as it asks a Python program's interpreter.
#ifndef TORCHRR_REPLAYER_CLI_LAUNCH_TORCH_CHECK_H_
#define TORCHRR_REPLAYER_CLI_LAUNCH_TORCH_CHECK_H_

#include <filesystem>
#include <string>
#include <vector>

namespace torchrr::cli {

// The libtorch_cpu.so that `command` (a program, looked up on PATH, and its arguments) would
// load: its dynamic loader is asked with LD_TRACE_LOADED_OBJECTS=1, what ldd does (the loader
// lists the libraries and exits before the program runs), only when the program is a dynamically
// linked ELF file. Empty when it names none (no libtorch), or the program is anything else (a
// script, a static program), or cannot be asked.
std::filesystem::path ProgramLibtorch(const std::vector<std::string>& command);

// The torch release of the libtorch at `library`: torch/version.py beside a pip install's
// torch/lib, or the build-version file of a libtorch archive (libtorch/lib). Empty when neither
// says.
std::string LibtorchVersion(const std::filesystem::path& library);

// Why the recorder in `lib_dir` (its torchrr_build.json) cannot record `command`, as one line
// naming both torch versions and how to rebuild; empty when it can, and whenever it cannot be
// told (no libtorch found, its version unknown, no torchrr_build.json).
std::string NativeTorchProblem(const std::vector<std::string>& command,
                               const std::filesystem::path& lib_dir);

// Why the recorder in `package` cannot record under the torch that the interpreter `python`
// (a command, looked up on PATH) would import: torchrr._native.installed_torch_problem() run in
// that interpreter, which reads torch's version from its metadata without importing it (about
// 50 ms). Empty when it can, and whenever the question cannot be asked (no such interpreter, no
// torch, an old package): the sitecustomize then checks again, and warns, in the program.
std::string PythonTorchProblem(const std::string& python, const std::filesystem::path& package);

}  // namespace torchrr::cli

#endif  // TORCHRR_REPLAYER_CLI_LAUNCH_TORCH_CHECK_H_
