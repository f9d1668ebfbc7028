// The fields of every struct of records.h, listed once.
//
// A record's fields are read and written in many places: the FlatBuffers codec, the JSON of
// `torchrr dump --json`, the recorder's queue encoding (record_bytes.h) and the tests. Each of them
// walks the lists below instead of naming the fields, so adding a field to a record takes three
// edits: its struct (records.h), its table (trace.fbs, at the end) and its list here. A struct
// member missing from its list stops the build (the static_assert in TORCHRR_DEFINE_FIELD_LIST).
//
// A list is an X-macro over the struct's members in declaration order, which is also the order of
// the fields of its FlatBuffers table or struct (the codec passes them to fb::Create<Name> by
// position). The macro that names a member says how the codec codes it in a RecordBatch (SPEC.md,
// "Id and time coding"): ID an ObjectId against the batch's id cursor, TIME a timestamp against its
// time cursor, X any other field as it is.
//
// C++ code walks a struct with ForEachField; the macros are for the codec, which needs the names as
// tokens to call the generated FlatBuffers accessors.
#ifndef TORCHRR_FORMAT_RECORD_FIELDS_H_
#define TORCHRR_FORMAT_RECORD_FIELDS_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "torchrr/format/records.h"

#define TORCHRR_FILE_INFO_FIELDS(X, ID, TIME)                                                   \
  X(torchrr_version) X(torch_version) X(cuda_version) X(host) X(pid) X(rank) X(world_size)     \
  X(start_time_unix_ns) X(command_line)
#define TORCHRR_STRING_DEF_FIELDS(X, ID, TIME) X(id) X(text)
#define TORCHRR_FRAME_DEF_FIELDS(X, ID, TIME) \
  X(id) X(kind) X(pc) X(function) X(file) X(line) X(library) X(framework) X(origin)
#define TORCHRR_STACK_DEF_FIELDS(X, ID, TIME) X(id) X(frames)
#define TORCHRR_DEVICE_FIELDS(X, ID, TIME) X(type) X(index)
#define TORCHRR_TENSOR_INFO_FIELDS(X, ID, TIME)                                                 \
  ID(tensor) ID(storage) ID(version_counter) X(dtype) X(device) X(shape) X(strides)            \
  X(storage_offset) X(requires_grad) X(is_leaf) ID(grad_fn) X(output_nr) X(storage_nbytes)     \
  X(storage_address) ID(inner)
#define TORCHRR_TENSOR_USE_FIELDS(X, ID, TIME) \
  ID(tensor) X(version_before) X(version_after) X(position) X(list_index)
#define TORCHRR_VALUE_FIELDS(X, ID, TIME) \
  X(position) X(kind) X(i) X(d) X(d_imag) X(s) X(ints) X(doubles)
#define TORCHRR_OP_RECORD_FIELDS(X, ID, TIME)                                                   \
  ID(op) X(name) X(overload) ID(parent) X(thread) X(scope) X(sequence_nr) X(forward_thread)    \
  TIME(start_ns) TIME(end_ns) X(stack) X(threw) X(grad_mode) X(inputs) X(outputs) X(values)   \
  X(module_path) X(input_ranges) X(output_ranges)
#define TORCHRR_VALUE_RANGE_FIELDS(X, ID, TIME) X(flags) X(max_abs)
#define TORCHRR_EDGE_FIELDS(X, ID, TIME) ID(node) X(input_nr)
#define TORCHRR_SAVED_TENSOR_FIELDS(X, ID, TIME)                                                \
  X(name) X(list_index) ID(tensor) ID(storage) ID(version_counter) X(saved_version)            \
  X(is_output) X(defined) X(has_hooks) X(is_leaf) X(output_nr) X(hook) X(checked)               \
  ID(recompute_from) X(unpack_hook) X(used_at)
#define TORCHRR_NODE_RECORD_FIELDS(X, ID, TIME)                                                 \
  ID(node) X(name) X(forward_thread) X(sequence_nr) ID(created_by) ID(variable) X(saved_kind)  \
  X(edges) X(saved)
#define TORCHRR_UNPACKED_TENSOR_FIELDS(X, ID, TIME) \
  X(saved) X(dtype) X(shape) X(saved_dtype) X(saved_shape)
#define TORCHRR_NODE_EXEC_RECORD_FIELDS(X, ID, TIME) \
  ID(node) ID(op) X(thread) TIME(start_ns) TIME(end_ns) X(threw) X(unpacked)
#define TORCHRR_ERROR_RECORD_FIELDS(X, ID, TIME) \
  X(kind) ID(op) X(thread) TIME(time_ns) X(type) X(message) X(stack)
#define TORCHRR_DIM3_FIELDS(X, ID, TIME) X(x) X(y) X(z)
#define TORCHRR_CUDA_KERNEL_RECORD_FIELDS(X, ID, TIME)                                          \
  X(name) ID(op) X(device) X(stream) X(correlation) TIME(start_ns) TIME(end_ns) X(grid)        \
  X(block) X(shared_memory) X(registers)
#define TORCHRR_CUDA_MEMCPY_RECORD_FIELDS(X, ID, TIME)                                          \
  X(kind) ID(op) X(device) X(stream) X(correlation) TIME(start_ns) TIME(end_ns) X(bytes)       \
  X(memset_value)
#define TORCHRR_DATA_LOSS_RECORD_FIELDS(X, ID, TIME) \
  X(records) X(bytes) TIME(first_ns) TIME(last_ns) X(reason)
#define TORCHRR_FINGERPRINT_RECORD_FIELDS(X, ID, TIME)                                          \
  ID(node) X(saved_name) X(list_index) ID(storage) ID(tensor) X(when) X(byte_offset)           \
  X(byte_length) X(hash) TIME(time_ns)
#define TORCHRR_SOURCE_FILE_FIELDS(X, ID, TIME) X(file) X(hash) X(bytes) X(lines)
#define TORCHRR_SOURCE_LINES_FIELDS(X, ID, TIME) X(file) X(first_line) X(text)
#define TORCHRR_STEP_RECORD_FIELDS(X, ID, TIME) X(step) TIME(time_ns) X(marked)

// Every struct with a list that trace.fbs stores as a table of the same name, X(Struct, LIST).
#define TORCHRR_TABLE_FIELD_LISTS(X)                                                            \
  X(FileInfo, TORCHRR_FILE_INFO_FIELDS)                                                         \
  X(StringDef, TORCHRR_STRING_DEF_FIELDS)                                                       \
  X(FrameDef, TORCHRR_FRAME_DEF_FIELDS)                                                         \
  X(StackDef, TORCHRR_STACK_DEF_FIELDS)                                                         \
  X(TensorInfo, TORCHRR_TENSOR_INFO_FIELDS)                                                     \
  X(Value, TORCHRR_VALUE_FIELDS)                                                                \
  X(OpRecord, TORCHRR_OP_RECORD_FIELDS)                                                         \
  X(SavedTensor, TORCHRR_SAVED_TENSOR_FIELDS)                                                   \
  X(NodeRecord, TORCHRR_NODE_RECORD_FIELDS)                                                     \
  X(UnpackedTensor, TORCHRR_UNPACKED_TENSOR_FIELDS)                                             \
  X(NodeExecRecord, TORCHRR_NODE_EXEC_RECORD_FIELDS)                                            \
  X(ErrorRecord, TORCHRR_ERROR_RECORD_FIELDS)                                                   \
  X(CudaKernelRecord, TORCHRR_CUDA_KERNEL_RECORD_FIELDS)                                        \
  X(CudaMemcpyRecord, TORCHRR_CUDA_MEMCPY_RECORD_FIELDS)                                        \
  X(DataLossRecord, TORCHRR_DATA_LOSS_RECORD_FIELDS)                                            \
  X(FingerprintRecord, TORCHRR_FINGERPRINT_RECORD_FIELDS)                                       \
  X(SourceFile, TORCHRR_SOURCE_FILE_FIELDS)                                                     \
  X(SourceLines, TORCHRR_SOURCE_LINES_FIELDS)                                                   \
  X(StepRecord, TORCHRR_STEP_RECORD_FIELDS)
// Every struct with a list that trace.fbs stores as a struct of the same name.
#define TORCHRR_STRUCT_FIELD_LISTS(X) \
  X(TensorUse, TORCHRR_TENSOR_USE_FIELDS) X(Edge, TORCHRR_EDGE_FIELDS) X(Dim3, TORCHRR_DIM3_FIELDS) \
  X(ValueRange, TORCHRR_VALUE_RANGE_FIELDS)
// Device is neither: TensorInfo stores its members as fields of its own (device_type,
// device_index).

namespace torchrr::format {

// How the codec stores a field in a RecordBatch (SPEC.md, "Id and time coding").
enum class Coding : uint8_t { kPlain, kId, kTime };

// Which kind of object an id field names. Format 1.13 counts how recently an id was used among
// the uses of its own kind (SPEC.md, "Step coding").
enum class IdKind : uint8_t { kNone, kTensor, kStorage, kVersionCounter, kNode, kOp };
inline constexpr size_t kIdKinds = 6;

// The kind of object an id field of this name names; every id field's name is one of these.
constexpr IdKind IdKindOf(std::string_view name) {
  if (name == "tensor" || name == "variable" || name == "inner") return IdKind::kTensor;
  if (name == "storage") return IdKind::kStorage;
  if (name == "version_counter") return IdKind::kVersionCounter;
  if (name == "node" || name == "grad_fn" || name == "recompute_from") return IdKind::kNode;
  if (name == "op" || name == "parent" || name == "created_by") return IdKind::kOp;
  return IdKind::kNone;
}

// One member of a struct: its name (the JSON key and the FlatBuffers field's name), how it is
// coded and, for an id, the kind of object it names. Empty but for the name; the member is in
// the type.
template <auto kMember, Coding kCoding, IdKind kKind = IdKind::kNone>
struct Field {
  static_assert(kCoding != Coding::kId || kKind != IdKind::kNone,
                "an id field whose name IdKindOf does not know");
  static constexpr Coding coding = kCoding;
  static constexpr IdKind kind = kKind;
  const char* name;

  template <class R>
  static constexpr auto& Of(R& record) {
    return record.*kMember;
  }
};

// FieldList<S>::kFields: a std::tuple of one Field per member of S, in declaration order.
// Defined for every struct of records.h but the Record variant itself.
template <class S>
struct FieldList;

template <class S>
concept HasFields = requires { FieldList<std::remove_const_t<S>>::kFields; };

// Calls fn(field, value) for every member of `s`, in declaration order, with `value` the member
// (const when `s` is). Inlines to the calls themselves.
template <HasFields S, class Fn>
constexpr void ForEachField(S& s, Fn&& fn) {
  std::apply([&](const auto&... field) { (fn(field, field.Of(s)), ...); },
             FieldList<std::remove_const_t<S>>::kFields);
}

template <class T>
struct IsVector : std::false_type {};
template <class T>
struct IsVector<std::vector<T>> : std::true_type {};

// Calls fn(field, value) for every member of `s` whose type has no field list (a number, an enum,
// a string, or a vector of those), and likewise through the members that have one and the vectors
// of them, depth first in declaration order: the walk that finds every id or every string of a
// record, whichever struct nests it. `field` is the member's own Field (its name and coding);
// `value` is const when `s` is.
template <HasFields S, class Fn>
constexpr void ForEachLeafField(S& s, Fn&& fn) {
  ForEachField(s, [&](const auto& field, auto& value) {
    using T = std::remove_cvref_t<decltype(value)>;
    if constexpr (HasFields<T>) {
      ForEachLeafField(value, fn);
    } else if constexpr (IsVector<T>::value) {
      if constexpr (HasFields<typename T::value_type>) {
        for (auto& element : value) ForEachLeafField(element, fn);
      } else {
        fn(field, value);
      }
    } else {
      fn(field, value);
    }
  });
}
// The same over whichever record `record` holds.
template <class Fn>
void ForEachLeafField(const Record& record, Fn&& fn) {
  std::visit([&](const auto& r) { ForEachLeafField(r, fn); }, record);
}
template <class Fn>
void ForEachLeafField(Record& record, Fn&& fn) {
  std::visit([&](auto& r) { ForEachLeafField(r, fn); }, record);
}

namespace internal {

// Converts to any member type: S{AnyMember{}, ...} compiles with as many of them as S has members
// and no more (an aggregate's members are each initialized by one, never by brace elision).
struct AnyMember {
  template <class T>
  constexpr operator T() const;  // Never defined: only used in unevaluated requires-expressions.
};

template <class S, size_t... kIndex>
constexpr bool InitializableFrom(std::index_sequence<kIndex...>) {
  return requires { S{(void(kIndex), AnyMember{})...}; };
}

// The number of (non-static) members of the aggregate S.
template <class S, size_t kCount = 0>
constexpr size_t MemberCount() {
  if constexpr (InitializableFrom<S>(std::make_index_sequence<kCount + 1>())) {
    return MemberCount<S, kCount + 1>();
  } else {
    return kCount;
  }
}

}  // namespace internal

#define TORCHRR_FIELD_(name) Field<&Self::name, Coding::kPlain>{#name},
#define TORCHRR_ID_FIELD_(name) Field<&Self::name, Coding::kId, IdKindOf(#name)>{#name},
#define TORCHRR_TIME_FIELD_(name) Field<&Self::name, Coding::kTime>{#name},
#define TORCHRR_DEFINE_FIELD_LIST_(S, LIST)                                                    \
  template <>                                                                                  \
  struct FieldList<S> {                                                                        \
    using Self = S;                                                                            \
    static constexpr auto kFields =                                                            \
        std::tuple{LIST(TORCHRR_FIELD_, TORCHRR_ID_FIELD_, TORCHRR_TIME_FIELD_)};              \
  };                                                                                           \
  static_assert(internal::MemberCount<S>() == std::tuple_size_v<decltype(FieldList<S>::kFields)>, \
                #S " has a member that " #LIST " does not list");

TORCHRR_TABLE_FIELD_LISTS(TORCHRR_DEFINE_FIELD_LIST_)
TORCHRR_STRUCT_FIELD_LISTS(TORCHRR_DEFINE_FIELD_LIST_)
TORCHRR_DEFINE_FIELD_LIST_(Device, TORCHRR_DEVICE_FIELDS)

#undef TORCHRR_DEFINE_FIELD_LIST_
#undef TORCHRR_TIME_FIELD_
#undef TORCHRR_ID_FIELD_
#undef TORCHRR_FIELD_

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_RECORD_FIELDS_H_
