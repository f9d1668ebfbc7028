#include "options/environment_options.h"

#include <charconv>
#include <cstring>
#include <functional>
#include <cstdio>
#include <filesystem>
#include <string>

#include "torchrr/recording_options.h"

namespace torchrr::recorder {
namespace {

// A decimal rank, or nullopt.
std::optional<int> ParseRank(const char* value) {
  if (value == nullptr) return std::nullopt;
  const char* end = value + std::strlen(value);
  int rank = 0;
  auto [stop, error] = std::from_chars(value, end, rank);
  if (value == end || *value == '-' || error != std::errc() || stop != end) return std::nullopt;
  return rank;
}

// FILE.rankN.EXT for `output` = FILE.EXT (EXT .trr when it has none), as torchrun's workers
// would otherwise all write the same file.
std::string RankTracePath(const std::string& output, int rank) {
  std::filesystem::path path(output);
  std::string extension = path.extension().string();
  if (extension.empty()) extension = ".trr";
  path.replace_extension();
  return path.string() + ".rank" + std::to_string(rank) + extension;
}

bool IsSet(const char* value) { return value != nullptr && *value != '\0'; }

}  // namespace

std::optional<RecorderOptions> OptionsFromEnvironment(const EnvironmentLookup& lookup,
                                                      bool runs_python) {
  const char* output = lookup("TORCHRR_OUTPUT");
  if (!IsSet(output)) return std::nullopt;
  RecorderOptions options = DefaultRecorderOptions(runs_python);
  options.path = output;
  if (std::optional<int> rank = ParseRank(lookup("RANK"))) {
    options.path = RankTracePath(options.path, *rank);
    options.rank = *rank;
  }
  for (const RecordingOption& option : RecordingOptions()) {
    const char* value = lookup(option.environment);
    if (!IsSet(value)) continue;
    std::string why = option.set(value, &options);
    if (!why.empty()) {
      std::fprintf(stderr, "torchrr: warning: %s=%s ignored (%s)\n", option.environment, value,
                   why.c_str());
    }
  }
  std::function<bool(const RecordingOption&)> given = [&lookup](const RecordingOption& option) {
    return IsSet(lookup(option.environment));
  };
  const RecorderOptions defaults = DefaultRecorderOptions(runs_python);
  while (const RecordingOptionRelation* broken = BrokenRelation(given)) {
    const RecordingOption* dropped = broken->option;
    std::fprintf(stderr, "torchrr: warning: %s ignored (it %s %s)\n", dropped->environment,
                 broken->needs ? "needs" : "excludes", broken->other->environment);
    dropped->copy(defaults, &options);
    given = [before = std::move(given), dropped](const RecordingOption& option) {
      return &option != dropped && before(option);
    };
  }
  return options;
}

}  // namespace torchrr::recorder
