#include "torchrr/recording_options.h"

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <string>

namespace torchrr {
namespace {

// A decimal number with nothing after it, or nullopt.
std::optional<uint64_t> ParseCount(std::string_view text) {
  uint64_t n = 0;
  if (text.empty() || text[0] < '0' || text[0] > '9') return std::nullopt;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return n;
}

std::optional<bool> ParseSwitch(std::string_view text) {
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "false" || text == "no" || text == "off") return false;
  return std::nullopt;
}

// One Decode and Encode per option type: what `set` and `get` run.
std::string Decode(std::string_view text, uint64_t, uint64_t, bool* value) {
  std::optional<bool> on = ParseSwitch(text);
  if (!on) return "expected 0 or 1";
  *value = *on;
  return "";
}
std::string Encode(bool value) { return value ? "1" : "0"; }

template <class T>
std::string DecodeCount(std::string_view text, uint64_t least, uint64_t most, T* value) {
  std::optional<uint64_t> n = ParseCount(text);
  if (!n || *n < least || *n > most) {
    if (least == 0) return "expected a number up to " + std::to_string(most);
    return "expected a number from " + std::to_string(least) + " to " + std::to_string(most);
  }
  *value = static_cast<T>(*n);
  return "";
}
std::string Decode(std::string_view text, uint64_t least, uint64_t most, unsigned long* value) {
  return DecodeCount(text, least, most, value);
}
std::string Decode(std::string_view text, uint64_t least, uint64_t most,
                   unsigned long long* value) {
  return DecodeCount(text, least, most, value);
}
std::string Encode(unsigned long value) { return std::to_string(value); }
std::string Encode(unsigned long long value) { return std::to_string(value); }

std::string Decode(std::string_view text, uint64_t, uint64_t, std::string* value) {
  *value = std::string(text);
  return "";
}
std::string Encode(const std::string& value) { return value; }

std::string Decode(std::string_view text, uint64_t, uint64_t, WhenFull* value) {
  if (text == "wait") {
    *value = WhenFull::kWait;
  } else if (text == "drop") {
    *value = WhenFull::kDrop;
  } else {
    return "expected wait or drop";
  }
  return "";
}
std::string Encode(WhenFull value) { return value == WhenFull::kDrop ? "drop" : "wait"; }

std::string Decode(std::string_view text, uint64_t, uint64_t, StepRange* value) {
  std::string why;
  std::optional<StepRange> range = ParseStepRange(text, &why);
  if (!range) return why;
  *value = *range;
  return "";
}
std::string Encode(const StepRange& value) {
  if (!value.on()) return "";
  return std::to_string(value.first) + ":" +
         (value.last == UINT64_MAX ? std::string() : std::to_string(value.last));
}

constexpr RecordingOption kOptions[] = {
#define TORCHRR_OPTION(type, field, default_value, environment, flag, flag_value, flag_scale, \
                       keyword, least, most, example, value_name, help)                      \
  {#field, environment, flag, flag_value, flag_scale, keyword, least, most, example,          \
   value_name, help,                                                                          \
   [](std::string_view text, RecorderOptions* options) {                                      \
     return Decode(text, least, most, &options->field);                                       \
   },                                                                                         \
   [](const RecorderOptions& options) { return Encode(options.field); },                      \
   [](const RecorderOptions& from, RecorderOptions* to) { to->field = from.field; }},
#include "torchrr/recording_options.def"
#undef TORCHRR_OPTION
};

}  // namespace

std::span<const RecordingOption> RecordingOptions() { return kOptions; }

const RecordingOption* FindRecordingOption(std::string_view field) {
  for (const RecordingOption& option : kOptions) {
    if (option.field == field) return &option;
  }
  return nullptr;
}

const RecordingOption* FindRecordingOptionByKeyword(std::string_view keyword) {
  for (const RecordingOption& option : kOptions) {
    if (option.keyword == keyword) return &option;
  }
  return nullptr;
}

std::span<const RecordingOptionRelation> RecordingOptionRelations() {
  static const RecordingOptionRelation relations[] = {
#define TORCHRR_OPTION(...)
#define TORCHRR_OPTION_RELATION(field, kind, other) \
  {FindRecordingOption(#field), std::string_view(#kind) == "needs", FindRecordingOption(#other)},
#include "torchrr/recording_options.def"
#undef TORCHRR_OPTION_RELATION
#undef TORCHRR_OPTION
  };
  return relations;
}

const RecordingOptionRelation* BrokenRelation(
    const std::function<bool(const RecordingOption&)>& given) {
  for (const RecordingOptionRelation& relation : RecordingOptionRelations()) {
    if (given(*relation.option) && given(*relation.other) != relation.needs) return &relation;
  }
  return nullptr;
}

std::string KeywordText(const RecordingOption& option, std::string_view text) {
  RecorderOptions scratch;
  if (option.flag_value == nullptr || option.set(text, &scratch).empty()) {
    return std::string(text);  // A switch's own words, or a value.
  }
  std::optional<bool> on = ParseSwitch(text);
  if (!on) return std::string(text);
  return *on ? option.flag_value : option.get(RecorderOptions{});
}

std::optional<StepRange> ParseStepRange(std::string_view text, std::string* why) {
  auto fail = [why](const char* reason) -> std::optional<StepRange> {
    if (why != nullptr) *why = reason;
    return std::nullopt;
  };
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos || text == ":") {
    return fail("expected A:B, A: or :B (step numbers from 0)");
  }
  const std::string_view a = text.substr(0, colon), b = text.substr(colon + 1);
  std::optional<uint64_t> from = a.empty() ? 0 : ParseCount(a);
  std::optional<uint64_t> to = b.empty() ? std::optional<uint64_t>(UINT64_MAX) : ParseCount(b);
  if (!from || !to) return fail("expected A:B, A: or :B (step numbers from 0)");
  if (*to < *from) return fail("B is before A");
  return StepRange{*from, *to};
}

RecorderOptions DefaultRecorderOptions(bool runs_python) {
  RecorderOptions options;
  options.native_stacks = !runs_python;
  return options;
}

}  // namespace torchrr
