#include "environment_options.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "python_stacks.h"

namespace torchrr::recorder {
namespace {

void WarnIgnored(const char* name, const char* value, const char* expected) {
  std::fprintf(stderr, "torchrr: warning: %s=%s ignored (expected %s)\n", name, value, expected);
}

// Sets `*option` from the switch `name` when it is set and understood.
void ReadSwitch(const EnvironmentLookup& lookup, const char* name, bool* option) {
  const char* value = lookup(name);
  if (value == nullptr || *value == '\0') return;
  const std::string v = value;
  if (v == "1" || v == "true" || v == "yes" || v == "on") {
    *option = true;
  } else if (v == "0" || v == "false" || v == "no" || v == "off") {
    *option = false;
  } else {
    WarnIgnored(name, value, "0 or 1");
  }
}

// A decimal number with nothing after it, or nullopt.
std::optional<unsigned long long> ParseCount(const char* value) {
  if (value == nullptr || *value < '0' || *value > '9') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(value, &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return n;
}

// FILE.rankN.EXT for `output` = FILE.EXT (EXT .trr when it has none), as torchrun's workers
// would otherwise all write the same file.
std::string RankTracePath(const std::string& output, unsigned long long rank) {
  std::filesystem::path path(output);
  std::string extension = path.extension().string();
  if (extension.empty()) extension = ".trr";
  path.replace_extension();
  return path.string() + ".rank" + std::to_string(rank) + extension;
}

// A count variable: `*value` when it is set to a number of at least `least`; a warning and the
// default otherwise.
template <class T>
void ReadCount(const EnvironmentLookup& lookup, const char* name, unsigned long long least,
               const char* what, T* value) {
  const char* text = lookup(name);
  if (text == nullptr || *text == '\0') return;
  std::optional<unsigned long long> n = ParseCount(text);
  if (n && *n >= least) {
    *value = static_cast<T>(*n);
  } else {
    WarnIgnored(name, text, what);
  }
}

// "A:B" (inclusive), "A:" (to the end), ":B" (from 0) into *first, *last; false when malformed
// or B < A.
bool ParseStepRange(const std::string& text, uint64_t* first, uint64_t* last) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return false;
  const std::string a = text.substr(0, colon), b = text.substr(colon + 1);
  std::optional<unsigned long long> from = a.empty() ? 0ull : ParseCount(a.c_str());
  std::optional<unsigned long long> to =
      b.empty() ? std::optional<unsigned long long>(UINT64_MAX) : ParseCount(b.c_str());
  if (!from || !to || *to < *from) return false;
  *first = *from;
  *last = *to;
  return true;
}

}  // namespace

std::optional<RecorderOptions> OptionsFromEnvironment(const EnvironmentLookup& lookup,
                                                      bool runs_python) {
  const char* output = lookup("TORCHRR_OUTPUT");
  if (output == nullptr || *output == '\0') return std::nullopt;
  RecorderOptions options;
  options.path = output;
  std::optional<unsigned long long> rank = ParseCount(lookup("RANK"));
  if (rank && *rank <= INT_MAX) {
    options.path = RankTracePath(options.path, *rank);
    options.rank = static_cast<int>(*rank);
  }
  options.native_stacks = !runs_python;
  ReadSwitch(lookup, "TORCHRR_NATIVE_STACKS", &options.native_stacks);
  ReadSwitch(lookup, "TORCHRR_PYTHON_STACKS", &options.python_stacks);
  ReadSwitch(lookup, "TORCHRR_VERIFY_SAVED", &options.verify_saved);
  ReadSwitch(lookup, "TORCHRR_CUDA_KERNELS", &options.cuda_kernels);
  ReadSwitch(lookup, "TORCHRR_ALL_OPS", &options.all_ops);
  ReadSwitch(lookup, "TORCHRR_FOLLOW_FORKS", &options.follow_forks);
  ReadSwitch(lookup, "TORCHRR_SOURCE", &options.source);
  ReadCount(lookup, "TORCHRR_MAX_BUFFERED_BYTES", 1, "a number of bytes above 0",
            &options.max_buffered_bytes);
  ReadCount(lookup, "TORCHRR_KEEP_LAST", 0, "a number of steps", &options.keep_last_steps);
  ReadCount(lookup, "TORCHRR_KEEP_LAST_BYTES", 1, "a number of bytes above 0",
            &options.keep_last_bytes);
  if (const char* spill = lookup("TORCHRR_SPILL"); spill && *spill) options.spill_dir = spill;
  ReadCount(lookup, "TORCHRR_FAIL_AT_OP", 0, "a number of ops", &options.fail_at_op);
  if (const char* range = lookup("TORCHRR_STEPS"); range && *range) {
    if (!ParseStepRange(range, &options.steps_first, &options.steps_last)) {
      WarnIgnored("TORCHRR_STEPS", range, "A:B, A: or :B (step numbers from 0)");
    }
  }
  if (const char* full = lookup("TORCHRR_WHEN_FULL"); full && *full) {
    const std::string v = full;
    if (v == "wait") {
      options.when_full = WhenFull::kWait;
    } else if (v == "drop") {
      options.when_full = WhenFull::kDrop;
    } else {
      WarnIgnored("TORCHRR_WHEN_FULL", full, "wait or drop");
    }
  }
  return options;
}

std::optional<RecorderOptions> OptionsFromEnvironment() {
  return OptionsFromEnvironment([](const char* name) { return std::getenv(name); },
                                PythonInterpreterRunning());
}

}  // namespace torchrr::recorder
