#include "torchrr/format/json.h"

#include <array>
#include <cmath>

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

json UsesToJson(const std::vector<TensorUse>& uses) {
  json out = json::array();
  for (const TensorUse& u : uses) {
    out.push_back({{"tensor", u.tensor},
                   {"version_before", u.version_before},
                   {"version_after", u.version_after},
                   {"position", u.position},
                   {"list_index", u.list_index}});
  }
  return out;
}

json ToJson(const StringDef& r) { return {{"id", r.id}, {"text", r.text}}; }

json ToJson(const FrameDef& r) {
  return {{"id", r.id},           {"frame_kind", FrameKindName(r.kind)},
          {"pc", r.pc},           {"function", r.function},
          {"file", r.file},       {"line", r.line},
          {"library", r.library}, {"framework", r.framework}};
}

json ToJson(const StackDef& r) { return {{"id", r.id}, {"frames", r.frames}}; }

json ToJson(const TensorInfo& r) {
  return {{"tensor", r.tensor},
          {"storage", r.storage},
          {"version_counter", r.version_counter},
          {"dtype", r.dtype},
          {"device", {{"type", r.device.type}, {"index", r.device.index}}},
          {"shape", r.shape},
          {"strides", r.strides},
          {"storage_offset", r.storage_offset},
          {"requires_grad", r.requires_grad},
          {"is_leaf", r.is_leaf},
          {"grad_fn", r.grad_fn},
          {"output_nr", r.output_nr},
          {"storage_nbytes", r.storage_nbytes},
          {"storage_address", r.storage_address}};
}

json ToJson(const Value& v) {
  json doubles = json::array();
  for (double d : v.doubles) doubles.push_back(Number(d));
  return {{"position", v.position}, {"value_kind", ValueKindName(v.kind)},
          {"i", v.i},               {"d", Number(v.d)},
          {"d_imag", Number(v.d_imag)}, {"s", v.s},
          {"ints", v.ints},         {"doubles", std::move(doubles)}};
}

json ToJson(const OpRecord& r) {
  json values = json::array();
  for (const Value& v : r.values) values.push_back(ToJson(v));
  return {{"op", r.op},
          {"name", r.name},
          {"overload", r.overload},
          {"parent", r.parent},
          {"thread", r.thread},
          {"scope", OpScopeName(r.scope)},
          {"sequence_nr", r.sequence_nr},
          {"forward_thread", r.forward_thread},
          {"start_ns", r.start_ns},
          {"end_ns", r.end_ns},
          {"stack", r.stack},
          {"threw", r.threw},
          {"grad_mode", r.grad_mode},
          {"inputs", UsesToJson(r.inputs)},
          {"outputs", UsesToJson(r.outputs)},
          {"values", std::move(values)}};
}

json ToJson(const NodeRecord& r) {
  json edges = json::array();
  for (const Edge& e : r.edges) edges.push_back({{"node", e.node}, {"input_nr", e.input_nr}});
  json saved = json::array();
  for (const SavedTensor& s : r.saved) {
    json t = {{"name", s.name},
              {"tensor", s.tensor},
              {"storage", s.storage},
              {"version_counter", s.version_counter},
              {"saved_version", s.saved_version},
              {"is_output", s.is_output},
              {"defined", s.defined},
              {"has_hooks", s.has_hooks},
              {"is_leaf", s.is_leaf},
              {"output_nr", s.output_nr},
              {"list_index", s.list_index}};
    saved.push_back(std::move(t));
  }
  return {{"node", r.node},
          {"name", r.name},
          {"forward_thread", r.forward_thread},
          {"sequence_nr", r.sequence_nr},
          {"created_by", r.created_by},
          {"variable", r.variable},
          {"saved_kind", SavedSetKindName(r.saved_kind)},
          {"edges", std::move(edges)},
          {"saved", std::move(saved)}};
}

json ToJson(const NodeExecRecord& r) {
  return {{"node", r.node},         {"op", r.op},         {"thread", r.thread},
          {"start_ns", r.start_ns}, {"end_ns", r.end_ns}, {"threw", r.threw}};
}

json ToJson(const ErrorRecord& r) {
  return {{"error_kind", ErrorKindName(r.kind)},
          {"op", r.op},
          {"thread", r.thread},
          {"time_ns", r.time_ns},
          {"type", r.type},
          {"message", r.message},
          {"stack", r.stack}};
}

json Dim3ToJson(const Dim3& d) { return json::array({d.x, d.y, d.z}); }

json ToJson(const CudaKernelRecord& r) {
  return {{"name", r.name},
          {"op", r.op},
          {"device", r.device},
          {"stream", r.stream},
          {"correlation", r.correlation},
          {"start_ns", r.start_ns},
          {"end_ns", r.end_ns},
          {"grid", Dim3ToJson(r.grid)},
          {"block", Dim3ToJson(r.block)},
          {"shared_memory", r.shared_memory},
          {"registers", r.registers}};
}

json ToJson(const CudaMemcpyRecord& r) {
  return {{"copy_kind", CudaCopyKindName(r.kind)},
          {"op", r.op},
          {"device", r.device},
          {"stream", r.stream},
          {"correlation", r.correlation},
          {"start_ns", r.start_ns},
          {"end_ns", r.end_ns},
          {"bytes", r.bytes},
          {"memset_value", r.memset_value}};
}

json ToJson(const DataLossRecord& r) {
  return {{"records", r.records},
          {"bytes", r.bytes},
          {"first_ns", r.first_ns},
          {"last_ns", r.last_ns},
          {"reason", r.reason}};
}

json ToJson(const FingerprintRecord& r) {
  json out = {{"node", r.node},
              {"saved_name", r.saved_name},
              {"storage", r.storage},
              {"tensor", r.tensor},
              {"when", FingerprintWhenName(r.when)},
              {"byte_offset", r.byte_offset},
              {"byte_length", r.byte_length},
              {"hash", r.hash},
              {"time_ns", r.time_ns},
              {"list_index", r.list_index}};
  return out;
}

}  // namespace

// "kind" comes first: the record kind, then the fields. Enum-valued fields that would collide
// with "kind" are named "<what>_kind".
nlohmann::ordered_json RecordToJson(const Record& record) {
  json fields = std::visit([](const auto& r) { return ToJson(r); }, record);
  json out = {{"kind", RecordKindName(record)}};
  out.update(fields);
  return out;
}

nlohmann::ordered_json FileInfoToJson(const FileInfo& info) {
  return {{"torchrr_version", info.torchrr_version},
          {"torch_version", info.torch_version},
          {"cuda_version", info.cuda_version},
          {"host", info.host},
          {"pid", info.pid},
          {"rank", info.rank},
          {"world_size", info.world_size},
          {"start_time_unix_ns", info.start_time_unix_ns},
          {"command_line", info.command_line}};
}

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
