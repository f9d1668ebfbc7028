#include "launch/torch_check.h"

#include <elf.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "launch/child_output.h"

namespace torchrr::cli {
namespace {

namespace fs = std::filesystem;

// MAJOR.MINOR of a version ("2.11.0+cu130" → 2, 11); false when it has none.
bool Minor(const std::string& version, int* major, int* minor) {
  std::smatch match;
  static const std::regex kMinor(R"(^(\d+)\.(\d+))");
  if (!std::regex_search(version, match, kMinor)) return false;
  *major = std::stoi(match[1]);
  *minor = std::stoi(match[2]);
  return true;
}

std::string PublicPart(const std::string& version) { return version.substr(0, version.find('+')); }

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

constexpr const char* kRebuild =
    "rebuild torchrr against that torch (cmake -DCMAKE_PREFIX_PATH=<its libtorch> for a libtorch "
    "archive; `pip install --no-build-isolation <torchrr source>` in its Python environment), or "
    "build the program against the torch torchrr was built with";

// `program` as execvp would find it: itself when it names a directory, else the first executable
// file of that name on PATH.
fs::path FindProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    fs::path candidate = fs::path(dir.empty() ? "." : dir) / program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

// Whether `path` is a dynamically linked ELF program (64-bit, with a PT_INTERP: a loader to ask).
// A static program, or a script whose interpreter is one, ignores LD_TRACE_LOADED_OBJECTS and
// would simply run, so only these are asked.
bool IsDynamicElf(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  Elf64_Ehdr header{};
  if (!in.read(reinterpret_cast<char*>(&header), sizeof header)) return false;
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64 ||
      header.e_phentsize != sizeof(Elf64_Phdr)) {
    return false;
  }
  for (int i = 0; i < header.e_phnum; ++i) {
    Elf64_Phdr segment{};
    in.seekg(static_cast<std::streamoff>(header.e_phoff + i * sizeof segment));
    if (!in.read(reinterpret_cast<char*>(&segment), sizeof segment)) return false;
    if (segment.p_type == PT_INTERP) return true;
  }
  return false;
}

}  // namespace

fs::path ProgramLibtorch(const std::vector<std::string>& command) {
  if (command.empty()) return {};
  const fs::path program = FindProgram(command[0]);
  if (program.empty() || !IsDynamicElf(program)) return {};
  // The program's own resolution: nothing of torchrr's preloaded.
  std::vector<std::string> argv = command;
  argv[0] = program.string();
  const std::string out =
      ChildOutput(argv, {{"LD_TRACE_LOADED_OBJECTS", "1"}}, {"LD_PRELOAD"}).value_or("");
  // "\tlibtorch_cpu.so => /path/libtorch_cpu.so (0x...)"
  static const std::regex kLine(R"(^\s*libtorch_cpu\.so\S* => (/\S+))");
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch match;
    if (std::regex_search(line, match, kLine)) return fs::path(match[1].str());
  }
  return {};
}

std::string LibtorchVersion(const fs::path& library) {
  const fs::path root = library.parent_path().parent_path();  // torch/ or libtorch/
  std::error_code ec;
  if (fs::exists(root / "version.py", ec)) {
    static const std::regex kVersion(R"(__version__\s*=\s*['"]([^'"]+)['"])");
    std::smatch match;
    const std::string text = ReadFile(root / "version.py");
    if (std::regex_search(text, match, kVersion)) return match[1].str();
  }
  if (fs::exists(root / "build-version", ec)) {
    std::string text = ReadFile(root / "build-version");
    text.erase(text.find_last_not_of(" \t\r\n") + 1);
    return text;
  }
  return {};
}

std::string NativeTorchProblem(const std::vector<std::string>& command, const fs::path& lib_dir) {
  nlohmann::json info;
  try {
    info = nlohmann::json::parse(ReadFile(lib_dir / "torchrr_build.json"));
  } catch (const nlohmann::json::exception&) {
    return "";  // No build information: nothing to compare with.
  }
  const std::string built = info.value("torch", "");
  const std::string low = info.value("torch_min", ""), high = info.value("torch_max", "");
  const fs::path library = ProgramLibtorch(command);
  if (built.empty() || library.empty()) return "";
  const std::string version = LibtorchVersion(library);
  if (version.empty()) return "";
  int major = 0, minor = 0, low_major = 0, low_minor = 0, high_major = 0, high_minor = 0;
  if (Minor(version, &major, &minor) && Minor(low, &low_major, &low_minor) &&
      Minor(high, &high_major, &high_minor) &&
      (std::make_pair(major, minor) < std::make_pair(low_major, low_minor) ||
       std::make_pair(major, minor) > std::make_pair(high_major, high_minor))) {
    return "the program loads torch " + version + " (" + library.string() +
           "), outside the versions torchrr supports (" + low + " to " + high +
           "; this torchrr was built against torch " + built + "): " + kRebuild;
  }
  // Public versions only: builds of one release for several CUDA versions share their C++ ABI.
  if (PublicPart(version) != PublicPart(built)) {
    return "torchrr was built against torch " + built + ", and the program loads torch " +
           version + " (" + library.string() + "): " + kRebuild;
  }
  return "";
}

std::string PythonTorchProblem(const std::string& python, const std::filesystem::path& package) {
  const std::string code =
      "import sys; sys.path.insert(0, sys.argv[1]); from torchrr import _native; "
      "sys.stdout.write(_native.installed_torch_problem() or '')";
  // -W ignore: the import's own TorchVersionWarning would say it a second time.
  return ChildOutput({python, "-I", "-W", "ignore", "-c", code,
                      package.parent_path().string()})
      .value_or("");
}

}  // namespace torchrr::cli
