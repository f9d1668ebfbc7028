#include "launch/recorder_dirs.h"

#include <cstdlib>
#include <string_view>

namespace torchrr::cli {

namespace fs = std::filesystem;

RecorderDirs FindRecorderDirs(const fs::path& exe) {
  const fs::path installed = (exe.parent_path() / TORCHRR_LIBDIR_FROM_BINDIR).lexically_normal();
  const fs::path build = (exe.parent_path().parent_path() / "lib").lexically_normal();
  const RecorderDirs candidates[] = {
      {installed, (installed / TORCHRR_PACKAGE_FROM_LIBDIR).lexically_normal()},
      {build, build / "torchrr" / "python" / "torchrr"}};
  for (const RecorderDirs& dirs : candidates) {
    if (fs::exists(dirs.lib / "libtorchrr_recorder.so")) return dirs;
  }
  return candidates[0];
}

namespace {
fs::path& InvokedAs() {
  static fs::path invoked;
  return invoked;
}
}  // namespace

void SetInvokedAs(const char* argv0) {
  if (argv0 != nullptr && std::string_view(argv0).find('/') != std::string_view::npos) {
    std::error_code ec;
    InvokedAs() = fs::absolute(argv0, ec);  // Before any verb changes the directory.
  }
}

std::string ScriptPython(const fs::path& package) {
  const char* env = std::getenv("TORCHRR_PYTHON");
  if (env != nullptr && *env != '\0') return env;
  std::error_code ec;
  // <env>/bin/torchrr called by its path, beside <env>/bin/python3 (the project's .venv, whose
  // torchrr links into the build tree).
  if (!InvokedAs().empty()) {
    const fs::path beside = InvokedAs().parent_path() / "python3";
    if (fs::is_regular_file(beside, ec)) return beside.string();
  }
  const fs::path site = package.lexically_normal().parent_path();
  if (site.filename() == "site-packages") {
    const fs::path python = site.parent_path().parent_path().parent_path() / "bin" / "python3";
    if (fs::is_regular_file(python, ec)) return python.string();
  }
  return "python3";
}

}  // namespace torchrr::cli
