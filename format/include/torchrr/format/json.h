// Records and file metadata as JSON, for `torchrr dump --json` and the replayer's reports.
//
// Every record becomes one object with "kind" (RecordKindName) first, then every field of its
// struct under the field's name in records.h, in declaration order (ordered_json; a saved tensor's
// and a fingerprint's list_index comes last); enums are written as their names ("function",
// "python"; an enum field that would clash with "kind" is "<what>_kind"), ObjectIds and InternIds
// as numbers, NaN and infinities as "nan"/"inf"/"-inf", a Dim3 as [x, y, z].
// Thread-safe (pure functions).
#ifndef TORCHRR_FORMAT_JSON_H_
#define TORCHRR_FORMAT_JSON_H_

#include <string>

#include <nlohmann/json.hpp>

#include "torchrr/format/reader.h"
#include "torchrr/format/records.h"

namespace torchrr::format {

// `json` as text (compact, or indented by `indent`), valid JSON whatever its strings hold: a byte
// that is not valid UTF-8 becomes U+FFFD (replayer/SCHEMA.md, "Strings"), where dump() would
// throw. Every JSON output of torchrr goes through it.
template <typename Json>
std::string JsonText(const Json& json, int indent = -1) {
  return json.dump(indent, ' ', false, Json::error_handler_t::replace);
}

nlohmann::ordered_json RecordToJson(const Record& record);
nlohmann::ordered_json FileInfoToJson(const FileInfo& info);
nlohmann::ordered_json FileHeaderToJson(const FileHeader& header);
// The header, the FileInfo and what the read found: status, warnings, clean close, chunk count,
// records per kind, sizes. `"kind": "trace"`.
nlohmann::ordered_json SummaryToJson(const ReadSummary& summary);

// Enum names, as the JSON and `torchrr dump` write them.
const char* FrameKindName(FrameKind kind);
const char* ValueKindName(ValueKind kind);
const char* OpScopeName(OpScope scope);
const char* SavedSetKindName(SavedSetKind kind);
const char* SavedHookName(SavedHook hook);
const char* ErrorKindName(ErrorKind kind);
const char* CudaCopyKindName(CudaCopyKind kind);
const char* FingerprintWhenName(FingerprintWhen when);
const char* StatusCodeName(StatusCode code);

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_JSON_H_
