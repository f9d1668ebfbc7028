#include "torchrr/format/json.h"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "torchrr/format/record_fields.h"

namespace torchrr::format {
namespace {

using json = nlohmann::ordered_json;

template <size_t N>
const char* NameOr(const std::array<const char*, N>& names, size_t i) {
  return i < N ? names[i] : "unknown";
}

// NaN and infinities are not JSON numbers: written as strings.
json Number(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  return d;
}

// Enum fields are written as their names.
json ToJson(FrameKind v) { return FrameKindName(v); }
json ToJson(ValueKind v) { return ValueKindName(v); }
json ToJson(OpScope v) { return OpScopeName(v); }
json ToJson(SavedSetKind v) { return SavedSetKindName(v); }
json ToJson(SavedHook v) { return SavedHookName(v); }
json ToJson(ErrorKind v) { return ErrorKindName(v); }
json ToJson(CudaCopyKind v) { return CudaCopyKindName(v); }
json ToJson(FingerprintWhen v) { return FingerprintWhenName(v); }

// A field named "kind" (an enum) is written as "<what>_kind": "kind" is the record's kind.
const char* KindKey(FrameKind) { return "frame_kind"; }
const char* KindKey(ValueKind) { return "value_kind"; }
const char* KindKey(ErrorKind) { return "error_kind"; }
const char* KindKey(CudaCopyKind) { return "copy_kind"; }

json ToJson(const Dim3& d);
json ToJson(const SavedTensor& s);
json ToJson(const FingerprintRecord& r);

// Every field under its name, in declaration order.
template <HasFields S>
json FieldsToJson(const S& s);

template <class T>
json ToJson(const T& value) {
  if constexpr (HasFields<T>) {
    return FieldsToJson(value);
  } else if constexpr (std::is_same_v<T, double>) {
    return Number(value);
  } else if constexpr (std::is_same_v<T, float>) {
    // Its shortest decimal as a float (7.1e4f is 71000, not 70999.9921875).
    char text[32];
    auto [end, ec] = std::to_chars(text, text + sizeof(text), value);
    return Number(std::strtod(std::string(text, end).c_str(), nullptr));
  } else if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, std::string>) {
    return value;
  } else {
    json out = json::array();
    for (const auto& element : value) out.push_back(ToJson(element));
    return out;
  }
}

template <HasFields S>
json FieldsToJson(const S& s) {
  json out = json::object();
  ForEachField(s, [&](const auto& field, const auto& value) {
    const char* key = field.name;
    if constexpr (requires { KindKey(value); }) {
      if (std::string_view(key) == "kind") key = KindKey(value);
    }
    out[key] = ToJson(value);
  });
  return out;
}

// [x, y, z].
json ToJson(const Dim3& d) {
  json out = json::array();
  ForEachField(d, [&](const auto&, uint32_t value) { out.push_back(value); });
  return out;
}

// These two have written list_index last since the first version, so dumps still compare as text.
json ListIndexLast(json out) {
  json list_index = std::move(out["list_index"]);
  out.erase("list_index");
  out["list_index"] = std::move(list_index);
  return out;
}
json ToJson(const SavedTensor& s) { return ListIndexLast(FieldsToJson(s)); }
json ToJson(const FingerprintRecord& r) { return ListIndexLast(FieldsToJson(r)); }

}  // namespace

// "kind" comes first: the record kind, then the fields. Enum-valued fields that would collide
// with "kind" are named "<what>_kind".
nlohmann::ordered_json RecordToJson(const Record& record) {
  json fields = std::visit([](const auto& r) { return ToJson(r); }, record);
  json out = {{"kind", RecordKindName(record)}};
  out.update(fields);
  return out;
}

nlohmann::ordered_json FileInfoToJson(const FileInfo& info) { return ToJson(info); }

nlohmann::ordered_json FileHeaderToJson(const FileHeader& h) {
  return {{"format", std::to_string(h.major) + "." + std::to_string(h.minor)},
          {"oldest_reader",
           std::to_string(h.oldest_reader_major) + "." + std::to_string(h.oldest_reader_minor)}};
}

nlohmann::ordered_json SummaryToJson(const ReadSummary& s) {
  json per_kind = json::object();
  for (size_t i = 0; i < kRecordKindCount; ++i) per_kind[RecordKindNameAt(i)] = s.records_per_kind[i];
  json out = {{"kind", "trace"},
              {"header", FileHeaderToJson(s.header)},
              {"status", StatusCodeName(s.status.code())},
              {"status_message", s.status.message()},
              {"warnings", s.warnings},
              {"closed_cleanly", s.has_index},
              {"chunks", s.chunks.size()},
              {"records", s.records()},
              {"records_per_kind", std::move(per_kind)},
              {"file_size", s.file_size},
              {"compressed_bytes", s.compressed_bytes},
              {"raw_bytes", s.raw_bytes}};
  if (s.has_info) out["info"] = FileInfoToJson(s.info);
  return out;
}

const char* FrameKindName(FrameKind kind) {
  static constexpr std::array<const char*, 2> kNames = {"native", "python"};
  return NameOr(kNames, static_cast<size_t>(kind));
}
const char* ValueKindName(ValueKind kind) {
  static constexpr std::array<const char*, 14> kNames = {
      "none",  "bool",   "int",    "double",        "string", "int_list",  "double_list",
      "dtype", "device", "layout", "memory_format", "other",  "bool_list", "complex"};
  return NameOr(kNames, static_cast<size_t>(kind));
}
const char* OpScopeName(OpScope scope) {
  static constexpr std::array<const char*, 4> kNames = {"function", "backward_function",
                                                        "user_scope", "other"};
  return NameOr(kNames, static_cast<size_t>(scope));
}
const char* SavedSetKindName(SavedSetKind kind) {
  static constexpr std::array<const char*, 4> kNames = {"exact", "none", "custom", "unknown"};
  return NameOr(kNames, static_cast<size_t>(kind));
}
const char* SavedHookName(SavedHook hook) {
  static constexpr std::array<const char*, 4> kNames = {"none", "opaque", "packed_tensor",
                                                        "checkpoint"};
  return NameOr(kNames, static_cast<size_t>(hook));
}
const char* ErrorKindName(ErrorKind kind) {
  static constexpr std::array<const char*, 4> kNames = {"cpp_exception", "python_exception",
                                                        "uncaught", "recorder"};
  return NameOr(kNames, static_cast<size_t>(kind));
}
const char* CudaCopyKindName(CudaCopyKind kind) {
  static constexpr std::array<const char*, 7> kNames = {
      "unknown", "host_to_device", "device_to_host", "device_to_device", "memset", "peer", "other"};
  return NameOr(kNames, static_cast<size_t>(kind));
}
const char* FingerprintWhenName(FingerprintWhen when) {
  static constexpr std::array<const char*, 2> kNames = {"at_save", "at_use"};
  return NameOr(kNames, static_cast<size_t>(when));
}
const char* StatusCodeName(StatusCode code) {
  static constexpr std::array<const char*, 7> kNames = {
      "ok", "truncated", "corrupt", "too_new", "not_a_trace", "invalid_argument", "io_error"};
  return NameOr(kNames, static_cast<size_t>(code));
}

}  // namespace torchrr::format
