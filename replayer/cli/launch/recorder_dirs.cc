#include "launch/recorder_dirs.h"

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

}  // namespace torchrr::cli
