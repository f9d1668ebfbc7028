// Where `torchrr record` finds the recorder it attaches: its libraries and its Python package,
// relative to this executable, in an install as in the build tree.
#ifndef TORCHRR_REPLAYER_CLI_LAUNCH_RECORDER_DIRS_H_
#define TORCHRR_REPLAYER_CLI_LAUNCH_RECORDER_DIRS_H_

#include <filesystem>
#include <string>

namespace torchrr::cli {

// Where the recorder's libraries and its Python package are.
struct RecorderDirs {
  std::filesystem::path lib;
  std::filesystem::path package;  // The torchrr package: __init__.py, _sitecustomize/.
};

// For the executable `exe`, as installed (cmake/TorchrrInstallDirs.cmake: <prefix>/bin/torchrr
// with <prefix>/lib and <prefix>/lib/torchrr/python/torchrr; a wheel's torchrr/bin/torchrr with
// torchrr/lib and torchrr/) or in the build tree (<build>/bin/torchrr with <build>/lib and its
// link <build>/lib/torchrr/python/torchrr). The first whose directory holds the recorder; else
// the first.
RecorderDirs FindRecorderDirs(const std::filesystem::path& exe);

// Notes how the user called torchrr (main's argv[0]): a path with a directory names the
// environment's bin/ even where the executable is a link into a build tree.
void SetInvokedAs(const char* argv0);

// The Python the verbs that run Python run (`fix`'s planner, `repro --check`'s script), for the
// torchrr `package` of FindRecorderDirs: $TORCHRR_PYTHON when set; else the python3 beside the
// torchrr the user called by its path (SetInvokedAs); else the environment's own python3 when
// the package is installed in one (<prefix>/lib/pythonX.Y/site-packages/torchrr with
// <prefix>/bin/python3: a virtual environment's, which has the torch torchrr was installed
// beside); else `python3`, looked up on PATH.
std::string ScriptPython(const std::filesystem::path& package);

}  // namespace torchrr::cli

#endif  // TORCHRR_REPLAYER_CLI_LAUNCH_RECORDER_DIRS_H_
