// Whether a native program (a C++ trainer linked against libtorch) can be recorded: the recorder
// that LD_PRELOAD puts into it was built against one torch, and its libtorch is then the one the
// whole process uses (the loader matches the program's libtorch_cpu.so to the one already loaded
// by name), so a program built against another torch would run on the wrong one: an undefined
// symbol at start, or objects read with the wrong layout. `torchrr record` asks before it runs
// the program, as it asks a Python program's interpreter.
#ifndef TORCHRR_REPLAYER_CLI_NATIVE_TORCH_H_
#define TORCHRR_REPLAYER_CLI_NATIVE_TORCH_H_

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

}  // namespace torchrr::cli

#endif  // TORCHRR_REPLAYER_CLI_NATIVE_TORCH_H_
