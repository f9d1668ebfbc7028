#include "record_codec.h"

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "container.h"
#include "torchrr/format/record_fields.h"

namespace torchrr::format {
namespace {

namespace fbs = flatbuffers;

// Fb<S> for every struct S with a field list stored as a FlatBuffers table or struct of its name:
//   Type      fb::S;
//   Build     writes one from its fields' values, in order: fb::CreateS for a table (returns its
//             offset), fb::S's constructor for a struct (returns it);
//   kGet      the generated accessor of each field, in order, as a callable.
template <class S>
struct Fb;

template <class S>
concept HasFb = requires { typename Fb<S>::Type; };
template <class S>
concept IsTable = HasFb<S> && std::is_base_of_v<fbs::Table, typename Fb<S>::Type>;

// An accessor is only instantiated when called: TensorInfo's `device`, which has none, never is.
#define TORCHRR_FB_GET_(name) [](const auto& fb) { return fb.name(); },
#define TORCHRR_FB_(S, LIST, BUILD)                                                         \
  template <>                                                                               \
  struct Fb<S> {                                                                            \
    using Type = fb::S;                                                                     \
    template <class... Args>                                                                \
    static auto Build([[maybe_unused]] fbs::FlatBufferBuilder& fbb, const Args&... args) {  \
      return BUILD;                                                                         \
    }                                                                                       \
    static constexpr auto kGet =                                                            \
        std::tuple{LIST(TORCHRR_FB_GET_, TORCHRR_FB_GET_, TORCHRR_FB_GET_)};                \
  };
#define TORCHRR_FB_TABLE_(S, LIST) TORCHRR_FB_(S, LIST, fb::Create##S(fbb, args...))
#define TORCHRR_FB_STRUCT_(S, LIST) TORCHRR_FB_(S, LIST, fb::S(args...))
TORCHRR_TABLE_FIELD_LISTS(TORCHRR_FB_TABLE_)
TORCHRR_STRUCT_FIELD_LISTS(TORCHRR_FB_STRUCT_)
#undef TORCHRR_FB_STRUCT_
#undef TORCHRR_FB_TABLE_
#undef TORCHRR_FB_
#undef TORCHRR_FB_GET_

// Record's alternative i is the union's member i + 1 (trace.fbs).
template <size_t... kIndex>
constexpr bool RecordUnionMatches(std::index_sequence<kIndex...>) {
  return ((fb::RecordTraits<typename Fb<std::variant_alternative_t<kIndex, Record>>::Type>::
               enum_value == kIndex + 1) &&
          ...);
}
static_assert(fb::Record_MAX == kRecordKindCount, "trace.fbs's Record union must list every kind");
static_assert(RecordUnionMatches(std::make_index_sequence<kRecordKindCount>()),
              "Record's alternatives must be in the order of trace.fbs's Record union");

// A struct field of a table (Dim3): fb::CreateS takes a pointer to it, valid during the call.
template <class FbStruct>
struct StructArg {
  FbStruct value;
  operator const FbStruct*() const { return &value; }
};

// An OpRecord's name: what its op times are matched by (kStepsPredictedTimes).
template <class F>
constexpr bool IsOpName = std::is_same_v<F, Field<&OpRecord::name, Coding::kPlain>>;

// OpRecord's and NodeRecord's sequence_nr, which kSteps batches code as deltas (SequenceCoder).
template <class F>
constexpr bool IsSequenceNr = std::is_same_v<F, Field<&OpRecord::sequence_nr, Coding::kPlain>> ||
                               std::is_same_v<F, Field<&NodeRecord::sequence_nr, Coding::kPlain>>;

// Which time a time field is, for kStepsExecTimes and on (StepCoding::EncodeTime).
template <class F>
constexpr StepCoding::TimeRole TimeRoleOf() {
  using Role = StepCoding::TimeRole;
  if constexpr (std::is_same_v<F, Field<&OpRecord::start_ns, Coding::kTime>>) return Role::kOpStart;
  if constexpr (std::is_same_v<F, Field<&OpRecord::end_ns, Coding::kTime>>) return Role::kOpEnd;
  if constexpr (std::is_same_v<F, Field<&NodeExecRecord::start_ns, Coding::kTime>>) {
    return Role::kExecStart;
  }
  if constexpr (std::is_same_v<F, Field<&NodeExecRecord::end_ns, Coding::kTime>>) {
    return Role::kExecEnd;
  }
  return Role::kOther;
}

// A TensorUse as a kSteps batch stores it: version_after as its distance from version_before
// (wrapping), 0 unless the op wrote through the tensor, where the versions themselves grow from
// step to step.
TensorUse StepCodedUse(TensorUse use) {
  use.version_after -= use.version_before;
  return use;
}

// Writes records (and the tables, structs, strings and vectors in them) into a FlatBufferBuilder,
// field by field in declaration order, coding ids and times as it goes.
class Encoder {
 public:
  // `tables` is scratch for the offsets of a vector of tables; kept by the caller to keep its
  // capacity.
  // `steps`: nullptr for a kCursors batch.
  Encoder(fbs::FlatBufferBuilder& fbb, IdCoder& ids, TimeCoder& times, StepCoding* steps,
          std::vector<fbs::Offset<void>>& tables)
      : fbb_(fbb), ids_(ids), times_(times), steps_(steps), tables_(tables) {}

  // A sequence number 2^63 from the one before, which a kSteps batch cannot code.
  bool sequence_overflow() const { return sequence_overflow_; }

  // Writes `s`: first its strings, vectors and nested tables, in declaration order, then `s`.
  // Returns its offset (a table) or itself (a struct).
  template <HasFb S>
  auto Write(const S& s) {
    return std::apply([&](const auto&... arg) { return Fb<S>::Build(fbb_, arg...); }, Args(s));
  }

 private:
  // The arguments of Fb<S>::Build for `s`, one or more per field, in order. Each field is written
  // before the next (braced initialization runs in order): ids and times are coded, and strings
  // and vectors written, in declaration order.
  template <HasFields S>
  auto Args(const S& s) {
    auto per_field = std::apply(
        [&](const auto&... field) {
          return std::tuple<decltype(Arg(field, field.Of(s)))...>{Arg(field, field.Of(s))...};
        },
        FieldList<S>::kFields);
    return std::apply([](auto&... args) { return std::tuple_cat(args...); }, per_field);
  }

  // One field's arguments: a struct with no FlatBuffers type of its own (Device) is its members.
  template <class F, class T>
  auto Arg(const F&, const T& value) {
    if constexpr (F::coding == Coding::kId) {
      return std::tuple{steps_ == nullptr ? ids_.Encode(value)
                                          : steps_->EncodeId(ids_, value, F::kind)};
    } else if constexpr (F::coding == Coding::kTime) {
      if (steps_ == nullptr) return std::tuple{times_.Encode(value)};
      steps_->PutTime(steps_->EncodeTime(times_, value, TimeRoleOf<F>()));
      return std::tuple{uint64_t{0}};  // The default: not stored.
    } else if constexpr (IsSequenceNr<F>) {
      int64_t stored = value;
      if (steps_ != nullptr && !steps_->sequence.Encode(value, &stored)) sequence_overflow_ = true;
      return std::tuple{stored};
    } else if constexpr (HasFields<T> && !HasFb<T>) {
      return Args(value);
    } else {
      if constexpr (IsOpName<F>) {
        if (steps_ != nullptr) steps_->op_name = value;
      }
      return std::tuple{Plain(value)};
    }
  }

  template <class T>
  auto Plain(const T& value) {
    if constexpr (std::is_enum_v<T>) {
      return static_cast<std::underlying_type_t<T>>(value);
    } else if constexpr (std::is_arithmetic_v<T>) {
      return value;
    } else if constexpr (std::is_same_v<T, std::string>) {
      // An absent string or vector is cheaper to write and to read than an empty one.
      return value.empty() ? fbs::Offset<fbs::String>() : fbb_.CreateString(value);
    } else if constexpr (HasFb<T>) {
      return StructArg<typename Fb<T>::Type>{Write(value)};
    } else {
      static_assert(IsVector<T>::value, "a field of a type the codec does not know");
      return Vector(value);
    }
  }

  template <class E>
  auto Vector(const std::vector<E>& v) {
    if constexpr (std::is_arithmetic_v<E>) {
      return v.empty() ? fbs::Offset<fbs::Vector<E>>() : fbb_.CreateVector(v);
    } else if constexpr (std::is_same_v<E, std::string>) {
      using Out = fbs::Offset<fbs::Vector<fbs::Offset<fbs::String>>>;
      return v.empty() ? Out() : fbb_.CreateVectorOfStrings(v);
    } else if constexpr (IsTable<E>) {
      using Out = fbs::Offset<fbs::Vector<fbs::Offset<typename Fb<E>::Type>>>;
      if (v.empty()) return Out();
      size_t first = tables_.size();
      for (const E& e : v) tables_.push_back(Write(e).Union());
      auto offset = fbb_.CreateVector(tables_.data() + first, v.size());
      tables_.resize(first);
      return Out(offset.o);
    } else {
      // Vectors of structs are written in place, their ids coded in index order.
      using Out = typename Fb<E>::Type;
      if (v.empty()) return fbs::Offset<fbs::Vector<const Out*>>();
      Out* out = nullptr;
      auto offset = fbb_.CreateUninitializedVectorOfStructs(v.size(), &out);
      for (const E& e : v) {
        if constexpr (std::is_same_v<E, TensorUse>) {
          if (steps_ != nullptr) {
            *out++ = Write(StepCodedUse(e));
            continue;
          }
        }
        *out++ = Write(e);
      }
      return offset;
    }
  }

  fbs::FlatBufferBuilder& fbb_;
  IdCoder& ids_;
  TimeCoder& times_;
  StepCoding* steps_;
  std::vector<fbs::Offset<void>>& tables_;
  bool sequence_overflow_ = false;
};

// Reads what Encoder wrote, field by field in the same order, decoding ids and times as it goes.
class Decoder {
 public:
  Decoder(IdCoder& ids, TimeCoder& times, StepCoding* steps)
      : ids_(ids), times_(times), steps_(steps) {}

  // Sets every field of `out` from `in`, S's FlatBuffers table or struct.
  template <HasFb S>
  void Read(const typename Fb<S>::Type& in, S& out) {
    constexpr size_t kCount = std::tuple_size_v<decltype(FieldList<S>::kFields)>;
    [&]<size_t... kIndex>(std::index_sequence<kIndex...>) {
      (ReadField(std::get<kIndex>(FieldList<S>::kFields), std::get<kIndex>(Fb<S>::kGet), in, out),
       ...);
    }(std::make_index_sequence<kCount>());
  }

 private:
  template <class F, class Get, class In, class S>
  void ReadField(const F& field, const Get& get, const In& in, S& out) {
    auto& value = field.Of(out);
    using T = std::remove_cvref_t<decltype(value)>;
    if constexpr (std::is_same_v<T, Device>) {
      value = Device{in.device_type(), in.device_index()};  // Two fields of TensorInfo's.
    } else if constexpr (F::coding == Coding::kId) {
      value = steps_ == nullptr ? ids_.Decode(get(in))
                                : steps_->DecodeId(ids_, get(in), F::kind);
    } else if constexpr (F::coding == Coding::kTime) {
      value = steps_ == nullptr ? times_.Decode(get(in))
                                : steps_->DecodeTime(times_, steps_->NextTime(), TimeRoleOf<F>());
    } else if constexpr (IsSequenceNr<F>) {
      value = steps_ == nullptr ? get(in) : steps_->sequence.Decode(get(in));
    } else {
      ReadValue(get(in), value);
      if constexpr (IsOpName<F>) {
        if (steps_ != nullptr) steps_->op_name = value;
      }
      if constexpr (std::is_same_v<F, Field<&TensorUse::version_after, Coding::kPlain>>) {
        if (steps_ != nullptr) out.version_after += out.version_before;  // StepCodedUse.
      }
    }
  }

  template <class In, class T>
  void ReadValue(const In& in, T& out) {
    if constexpr (std::is_enum_v<T> || std::is_arithmetic_v<T>) {
      out = static_cast<T>(in);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (in == nullptr) {
        out.clear();
      } else {
        out.assign(in->data(), in->size());
      }
    } else if constexpr (HasFb<T>) {
      if (in == nullptr) {
        out = T{};
      } else {
        Read(*in, out);
      }
    } else {
      static_assert(IsVector<T>::value, "a field of a type the codec does not know");
      using E = typename T::value_type;
      if (in == nullptr) {
        out.clear();
      } else if constexpr (std::is_arithmetic_v<E>) {
        out.assign(in->begin(), in->end());
      } else if constexpr (std::is_trivially_copyable_v<E>) {
        out.clear();
        out.reserve(in->size());
        for (const auto* e : *in) {
          E element;
          ReadValue(e, element);
          out.push_back(element);
        }
      } else {
        // Overwritten in place, the elements' own strings and vectors keep their capacity.
        out.resize(in->size());
        auto element = out.begin();
        for (const auto* e : *in) ReadValue(e, *element++);
      }
    }
  }

  IdCoder& ids_;
  TimeCoder& times_;
  StepCoding* steps_;
};

// Fills `out` with the decoded T, reusing the alternative already there (and its vectors'
// capacity) when it is a T.
template <class T>
void DecodeInto(const void* table, Decoder& decoder, Record& out) {
  T* record = std::get_if<T>(&out);
  if (record == nullptr) record = &out.emplace<T>();
  decoder.Read(*static_cast<const typename Fb<T>::Type*>(table), *record);
}

// Upper bounds of the bytes a table's fixed-size fields and overhead take (a record's or a
// FileInfo's; one in a vector of tables), and of a string's overhead in a vector of strings.
constexpr size_t kFixed = 256;
constexpr size_t kNestedTable = 96;
constexpr size_t kNestedString = 8;

// Adds the strings and vectors in `value`, nested ones included, to `size`.
template <class T>
void AddVariableSize(const T& value, EncodedSize& size) {
  if constexpr (HasFields<T>) {
    ForEachField(value, [&](const auto&, const auto& field) { AddVariableSize(field, size); });
  } else if constexpr (std::is_same_v<T, std::string>) {
    size.elements += value.size();
    size.bytes += value.size();
  } else if constexpr (IsVector<T>::value) {
    using E = typename T::value_type;
    size.elements += value.size();
    if constexpr (std::is_arithmetic_v<E>) {
      size.bytes += value.size() * sizeof(E);
    } else if constexpr (HasFb<E> && !IsTable<E>) {
      size.bytes += value.size() * sizeof(typename Fb<E>::Type);
    } else {
      for (const E& element : value) {
        size.bytes += IsTable<E> ? kNestedTable : kNestedString;
        AddVariableSize(element, size);
      }
    }
  }
}

template <class T>
EncodedSize EstimateSize(const T& value) {
  EncodedSize size{0, kFixed};
  AddVariableSize(value, size);
  return size;
}

}  // namespace

BatchEncoder::BatchEncoder(size_t initial_bytes, BatchCoding coding)
    : fbb_(initial_bytes), coding_(coding) {
  // A vtable shared across the batch is referenced by a distance that differs for every table;
  // a vtable of its own sits next to its table, so the distance repeats and zstd removes it.
  fbb_.DedupVtables(false);
}

void BatchEncoder::Reset(uint64_t base_high, int64_t base_time_ns) {
  fbb_.Clear();
  types_.clear();
  offsets_.clear();
  base_high_ = base_high;
  base_time_ns_ = base_time_ns;
  ids_ = IdCoder(base_high);
  times_ = TimeCoder(base_time_ns);
  steps_.times.clear();
  steps_.sequence = SequenceCoder();
  steps_.steps = StepRule();
  steps_.previous_step_ids.clear();
  steps_.step_ids.clear();
  steps_.SetCoding(coding_);
  steps_.recent.Clear();
}

Status BatchEncoder::Add(const Record& record) {
  IdCoder ids_before = ids_;
  TimeCoder times_before = times_;
  SequenceCoder sequence_before = steps_.sequence;
  const int64_t op_times_before[2] = {steps_.op_times[0], steps_.op_times[1]};
  size_t times_before_size = steps_.times.size();
  size_t step_ids_before = steps_.step_ids.size();
  const StepCoding::TimesMark times_mark = steps_.MarkTimes();
  const bool step_coded = coding_ != BatchCoding::kCursors;
  StepCoding* steps = step_coded ? &steps_ : nullptr;
  Encoder encoder(fbb_, ids_, times_, steps, table_offsets_);
  fbs::Offset<void> offset =
      std::visit([&](const auto& r) { return encoder.Write(r).Union(); }, record);
  if (ids_.overflow() || encoder.sequence_overflow()) {
    const char* why = ids_.overflow() ? " record has an id above 2^62-1; dropped"
                                      : " record has a sequence number 2^63 from the one before; "
                                        "dropped";
    // The bytes already in the builder stay unreferenced; the record is not part of the batch.
    ids_ = ids_before;
    times_ = times_before;
    steps_.sequence = sequence_before;
    steps_.op_times[0] = op_times_before[0];
    steps_.op_times[1] = op_times_before[1];
    steps_.times.resize(times_before_size);
    steps_.step_ids.resize(step_ids_before);
    steps_.RestoreTimes(times_mark);
    steps_.recent.Undo();
    return Status(StatusCode::kInvalidArgument, std::string(RecordKindName(record)) + why);
  }
  if (steps != nullptr) steps_.Next(record);
  steps_.recent.Commit();
  types_.push_back(static_cast<uint8_t>(record.index() + 1));
  offsets_.push_back(offset);
  return Status::Ok();
}

std::span<uint8_t> BatchEncoder::Finish() {
  auto types = fbb_.CreateVector(types_);
  auto records = fbb_.CreateVector(offsets_);
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> times;
  if (coding_ != BatchCoding::kCursors) times = fbb_.CreateVector(steps_.times);
  fb::RecordBatchBuilder batch(fbb_);
  batch.add_base_high(base_high_);
  batch.add_base_time_ns(base_time_ns_);
  batch.add_records_type(types);
  batch.add_records(records);
  batch.add_coding(static_cast<uint8_t>(coding_));
  batch.add_times(times);
  fbb_.Finish(batch.Finish());
  return {fbb_.GetBufferPointer(), fbb_.GetSize()};
}

bool RecordOffsetDeltas(std::span<uint8_t> batch, bool to_deltas) {
  // Walks the FlatBuffer by hand (it is not verified yet when read): root offset, the root's
  // vtable, the `records` field, its vector. Every position is checked against the size in 64
  // bits, so no value read can point outside the bytes.
  const uint64_t size = batch.size();
  uint8_t* data = batch.data();
  auto u32 = [&](uint64_t pos, uint64_t* out) {
    if (pos + 4 > size) return false;
    *out = LoadLe32(data + pos);
    return true;
  };
  uint64_t root = 0;
  uint64_t distance = 0;
  if (!u32(0, &root) || !u32(root, &distance)) return false;
  // An soffset_t: the vtable sits at root - distance (a negative distance puts it after the table).
  const int64_t vtable =
      static_cast<int64_t>(root) - static_cast<int32_t>(static_cast<uint32_t>(distance));
  constexpr uint64_t kSlot = fb::RecordBatch::VT_RECORDS;
  if (vtable < 0 || static_cast<uint64_t>(vtable) + 4 > size) return false;
  const uint64_t vtable_size = LoadLe16(data + vtable);
  if (static_cast<uint64_t>(vtable) + vtable_size > size) return false;
  if (vtable_size < kSlot + 2) return true;  // No records: nothing to code.
  const uint64_t field = LoadLe16(data + vtable + kSlot);
  if (field == 0) return true;
  uint64_t vector = 0;
  uint64_t count = 0;
  if (!u32(root + field, &vector)) return false;
  vector += root + field;
  if (!u32(vector, &count) || vector + 4 + 4 * count > size) return false;
  uint8_t* elements = data + vector + 4;
  // The builder writes tables back to front, so each record's table sits below the one before,
  // and its element 4 bytes further on: the element before minus this one is the earlier
  // record's size plus 4, a small number like the rest of the batch's.
  if (to_deltas) {
    for (uint64_t i = count; i-- > 1;) {
      StoreLe32(elements + 4 * i, LoadLe32(elements + 4 * (i - 1)) - LoadLe32(elements + 4 * i));
    }
  } else {
    for (uint64_t i = 1; i < count; ++i) {
      StoreLe32(elements + 4 * i, LoadLe32(elements + 4 * (i - 1)) - LoadLe32(elements + 4 * i));
    }
  }
  return true;
}

EncodedSize EstimateEncodedSize(const Record& record) {
  return std::visit([](const auto& r) { return EstimateSize(r); }, record);
}

EncodedSize EstimateEncodedSize(const FileInfo& info) { return EstimateSize(info); }

bool VerifyPayload(uint16_t chunk_type, const uint8_t* data, size_t size) {
  flatbuffers::Verifier::Options options;
  options.max_depth = 64;
  // Every table takes at least 4 bytes: this bounds the work without refusing any real batch.
  options.max_tables = static_cast<flatbuffers::uoffset_t>(size / 4 + 16);
  flatbuffers::Verifier verifier(data, size, options);
  switch (chunk_type) {
    case kChunkFileInfo:
      return verifier.VerifyBuffer<fb::FileInfo>(nullptr);
    case kChunkRecordBatch:
      return verifier.VerifyBuffer<fb::RecordBatch>(nullptr);
    case kChunkIndex:
      return verifier.VerifyBuffer<fb::Index>(nullptr);
    default:
      return true;  // A newer minor version's chunk type: checksummed, skipped.
  }
}

// By hand, not by Encoder: the FileInfo chunk keeps the layout it has had since format 1.0 (the
// command line first, every string written even when empty). A field added to FileInfo is added
// here too (RoundTrip.EveryKindEveryField fails until it is).
void EncodeFileInfo(const FileInfo& info, flatbuffers::FlatBufferBuilder& fbb) {
  std::vector<fbs::Offset<fbs::String>> args;
  args.reserve(info.command_line.size());
  for (const std::string& arg : info.command_line) args.push_back(fbb.CreateString(arg));
  auto command_line = fbb.CreateVector(args);
  auto torchrr_version = fbb.CreateString(info.torchrr_version);
  auto torch_version = fbb.CreateString(info.torch_version);
  auto cuda_version = fbb.CreateString(info.cuda_version);
  auto host = fbb.CreateString(info.host);
  fbb.Finish(fb::CreateFileInfo(fbb, torchrr_version, torch_version, cuda_version, host, info.pid,
                                info.rank, info.world_size, info.start_time_unix_ns,
                                command_line));
}

FileInfo DecodeFileInfo(const fb::FileInfo& in) {
  FileInfo info;
  IdCoder ids;  // FileInfo has no ids or times.
  TimeCoder times;
  Decoder(ids, times, nullptr).Read(in, info);
  return info;
}

void EncodeIndex(const std::vector<ChunkInfo>& chunks, flatbuffers::FlatBufferBuilder& fbb) {
  fb::ChunkEntry* out = nullptr;
  auto entries = fbb.CreateUninitializedVectorOfStructs(chunks.size(), &out);
  for (const ChunkInfo& c : chunks) {
    *out++ = fb::ChunkEntry(c.offset, c.type, c.compressed_bytes, c.raw_bytes, c.records);
  }
  fbb.Finish(fb::CreateIndex(fbb, entries));
}

bool DecodeRecord(fb::Record type, const void* table, IdCoder& ids, TimeCoder& times,
                  StepCoding* steps, Record& out) {
  if (table == nullptr) return false;
  Decoder decoder(ids, times, steps);
  auto kind = static_cast<size_t>(type);
  // Union member i + 1 is Record's alternative i.
  return [&]<size_t... kIndex>(std::index_sequence<kIndex...>) {
    return ((kind == kIndex + 1 &&
             (DecodeInto<std::variant_alternative_t<kIndex, Record>>(table, decoder, out), true)) ||
            ...);
  }(std::make_index_sequence<kRecordKindCount>());
}

}  // namespace torchrr::format
