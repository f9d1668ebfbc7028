// The recording options as a table (recording_options.def), for every way into the recorder:
// `torchrr record`'s flags, the TORCHRR_* environment the recorder reads in the program, the
// Python keywords (through torchrr_start_with), the docs. Each option's value has one text
// encoding, its environment variable's; every way in reads it through Set. No torch.
#ifndef TORCHRR_RECORDING_OPTIONS_H_
#define TORCHRR_RECORDING_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "torchrr/recorder.h"

namespace torchrr {

struct RecordingOption {
  const char* field;        // RecorderOptions' member.
  const char* environment;  // TORCHRR_*.
  const char* flag;         // `torchrr record`'s.
  const char* flag_value;   // What the flag sets when it takes no value; nullptr when it takes one.
  uint64_t flag_scale;      // The flag's value times this is the option's (MiB: 1 << 20).
  const char* keyword;      // torchrr.start()'s.
  uint64_t least, most;     // A count's bounds.
  const char* example;      // A value other than the default.
  const char* value_name;   // For help: N, MB, DIR, A:B; empty for a flag without a value.
  const char* help;         // Empty: for tests, hidden.
  // Sets the field of *options from `text`. Returns "" when it was understood, else why not
  // ("expected ...", "B is before A"), leaving *options unchanged.
  std::string (*set)(std::string_view text, RecorderOptions* options);
  // The field's value in *options, as text Set reads back.
  std::string (*get)(const RecorderOptions& options);
  // Copies the field from `from` into *to.
  void (*copy)(const RecorderOptions& from, RecorderOptions* to);
};

// Every option, in recording_options.def's order.
std::span<const RecordingOption> RecordingOptions();

// The option whose field, or whose Python keyword, is the one given; nullptr when none is.
const RecordingOption* FindRecordingOption(std::string_view field);
const RecordingOption* FindRecordingOptionByKeyword(std::string_view keyword);

// One relation of recording_options.def: an option that needs or excludes another.
struct RecordingOptionRelation {
  const RecordingOption* option;
  bool needs;  // false: excludes.
  const RecordingOption* other;
};
std::span<const RecordingOptionRelation> RecordingOptionRelations();

// The first relation the options given break (`given` says which are), or nullptr.
// `torchrr record` checks them as CLI11's needs and excludes.
const RecordingOptionRelation* BrokenRelation(
    const std::function<bool(const RecordingOption&)>& given);

// What a Python keyword's value sets: its text when the option takes it (a switch's 1 or 0, a
// count); for a flag option whose values are not switch words (drop_when_full, which sets
// when_full), a switch word sets flag_value when true, the default's text when false.
std::string KeywordText(const RecordingOption& option, std::string_view text);

// "A:B" (inclusive), "A:" (to the end) or ":B" (from 0): the one parser of step ranges.
// nullopt when malformed or B < A; *why, when given, then says which.
std::optional<StepRange> ParseStepRange(std::string_view text, std::string* why = nullptr);

// The defaults of a recording in a process that runs a Python interpreter or not: C++ stacks
// are off in one that does.
RecorderOptions DefaultRecorderOptions(bool runs_python);

}  // namespace torchrr

#endif  // TORCHRR_RECORDING_OPTIONS_H_
