#include "session/file_info.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#ifndef TORCHRR_VERSION
#define TORCHRR_VERSION "unknown"
#endif
#ifndef TORCHRR_TORCH_VERSION
#define TORCHRR_TORCH_VERSION "unknown"
#endif
#ifndef TORCHRR_TORCH_CUDA_VERSION
#define TORCHRR_TORCH_CUDA_VERSION ""
#endif

namespace torchrr::recorder {
namespace {

std::vector<std::string> ReadCommandLine() {
  std::vector<std::string> args;
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  return std::atoi(value);
}

}  // namespace

format::FileInfo MakeFileInfo(const RecorderOptions& options) {
  format::FileInfo info;
  info.torchrr_version = TORCHRR_VERSION;
  info.torch_version = TORCHRR_TORCH_VERSION;
  info.cuda_version = TORCHRR_TORCH_CUDA_VERSION;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) info.host = host;
  info.pid = getpid();
  info.rank = options.rank >= 0 ? options.rank : EnvInt("RANK", -1);
  info.world_size = EnvInt("WORLD_SIZE", 0);
  info.start_time_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  info.command_line = ReadCommandLine();
  return info;
}

}  // namespace torchrr::recorder
