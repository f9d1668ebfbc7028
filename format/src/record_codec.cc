#include "record_codec.h"

#include <string>
#include <type_traits>
#include <utility>

#include "container.h"

namespace torchrr::format {
namespace {

namespace fbs = flatbuffers;

template <typename... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <typename... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// An absent field is an empty string or vector: cheaper to write and to read than an empty one.
fbs::Offset<fbs::String> MaybeString(fbs::FlatBufferBuilder& fbb, const std::string& s) {
  return s.empty() ? 0 : fbb.CreateString(s);
}
template <typename T>
fbs::Offset<fbs::Vector<T>> MaybeVector(fbs::FlatBufferBuilder& fbb, const std::vector<T>& v) {
  return v.empty() ? 0 : fbb.CreateVector(v);
}

// Vectors of structs are written in place, coding their ids in index order.
fbs::Offset<fbs::Vector<const fb::TensorUse*>> EncodeUses(fbs::FlatBufferBuilder& fbb,
                                                          const std::vector<TensorUse>& uses,
                                                          IdCoder& ids) {
  if (uses.empty()) return 0;
  fb::TensorUse* out = nullptr;
  auto offset = fbb.CreateUninitializedVectorOfStructs(uses.size(), &out);
  for (const TensorUse& u : uses) {
    *out++ = fb::TensorUse(ids.Encode(u.tensor), u.version_before, u.version_after, u.position,
                           u.list_index);
  }
  return offset;
}

void DecodeUses(const fbs::Vector<const fb::TensorUse*>* in, IdCoder& ids,
                std::vector<TensorUse>& out) {
  out.clear();
  if (in == nullptr) return;
  out.reserve(in->size());
  for (const fb::TensorUse* u : *in) {
    TensorUse use;
    use.tensor = ids.Decode(u->tensor());
    use.version_before = u->version_before();
    use.version_after = u->version_after();
    use.position = u->position();
    use.list_index = u->list_index();
    out.push_back(use);
  }
}

template <typename T>
void CopyVector(const fbs::Vector<T>* in, std::vector<T>& out) {
  out.clear();
  if (in != nullptr) out.assign(in->begin(), in->end());
}

std::string ToString(const fbs::String* s) { return s == nullptr ? std::string() : s->str(); }

// One Encode per record kind; each codes its ids and times in records.h's declaration order.
class Encoder {
 public:
  Encoder(fbs::FlatBufferBuilder& fbb, IdCoder& ids, TimeCoder& times)
      : fbb_(fbb), ids_(ids), times_(times) {}

  fbs::Offset<void> operator()(const StringDef& r) {
    return fb::CreateStringDef(fbb_, r.id, MaybeString(fbb_, r.text)).Union();
  }
  fbs::Offset<void> operator()(const FrameDef& r) {
    return fb::CreateFrameDef(fbb_, r.id, static_cast<uint8_t>(r.kind), r.pc, r.function, r.file,
                              r.line, r.library, r.framework)
        .Union();
  }
  fbs::Offset<void> operator()(const StackDef& r) {
    return fb::CreateStackDef(fbb_, r.id, MaybeVector(fbb_, r.frames)).Union();
  }
  fbs::Offset<void> operator()(const TensorInfo& r) {
    uint64_t tensor = ids_.Encode(r.tensor);
    uint64_t storage = ids_.Encode(r.storage);
    uint64_t counter = ids_.Encode(r.version_counter);
    uint64_t grad_fn = ids_.Encode(r.grad_fn);
    auto shape = MaybeVector(fbb_, r.shape);
    auto strides = MaybeVector(fbb_, r.strides);
    return fb::CreateTensorInfo(fbb_, tensor, storage, counter, r.dtype, r.device.type,
                                r.device.index, shape, strides, r.storage_offset, r.requires_grad,
                                r.is_leaf, grad_fn, r.output_nr, r.storage_nbytes,
                                r.storage_address)
        .Union();
  }
  fbs::Offset<void> operator()(const OpRecord& r) {
    uint64_t op = ids_.Encode(r.op);
    uint64_t parent = ids_.Encode(r.parent);
    uint64_t start = times_.Encode(r.start_ns);
    uint64_t end = times_.Encode(r.end_ns);
    auto inputs = EncodeUses(fbb_, r.inputs, ids_);
    auto outputs = EncodeUses(fbb_, r.outputs, ids_);
    fbs::Offset<fbs::Vector<fbs::Offset<fb::Value>>> values = 0;
    if (!r.values.empty()) {
      value_offsets_.clear();
      for (const Value& v : r.values) {
        value_offsets_.push_back(fb::CreateValue(fbb_, v.position, static_cast<uint8_t>(v.kind),
                                                 v.i, v.d, v.d_imag, v.s,
                                                 MaybeVector(fbb_, v.ints),
                                                 MaybeVector(fbb_, v.doubles)));
      }
      values = fbb_.CreateVector(value_offsets_);
    }
    return fb::CreateOpRecord(fbb_, op, r.name, r.overload, parent, r.thread,
                              static_cast<uint8_t>(r.scope), r.sequence_nr, r.forward_thread,
                              start, end, r.stack, r.threw, r.grad_mode, inputs, outputs, values)
        .Union();
  }
  fbs::Offset<void> operator()(const NodeRecord& r) {
    uint64_t node = ids_.Encode(r.node);
    uint64_t created_by = ids_.Encode(r.created_by);
    uint64_t variable = ids_.Encode(r.variable);
    fbs::Offset<fbs::Vector<const fb::Edge*>> edges = 0;
    if (!r.edges.empty()) {
      fb::Edge* out = nullptr;
      edges = fbb_.CreateUninitializedVectorOfStructs(r.edges.size(), &out);
      for (const Edge& e : r.edges) *out++ = fb::Edge(ids_.Encode(e.node), e.input_nr);
    }
    fbs::Offset<fbs::Vector<fbs::Offset<fb::SavedTensor>>> saved = 0;
    if (!r.saved.empty()) {
      saved_offsets_.clear();
      for (const SavedTensor& s : r.saved) {
        uint64_t tensor = ids_.Encode(s.tensor);
        uint64_t storage = ids_.Encode(s.storage);
        uint64_t counter = ids_.Encode(s.version_counter);
        saved_offsets_.push_back(fb::CreateSavedTensor(fbb_, s.name, s.list_index, tensor, storage,
                                                       counter, s.saved_version, s.is_output,
                                                       s.defined, s.has_hooks, s.is_leaf,
                                                       s.output_nr));
      }
      saved = fbb_.CreateVector(saved_offsets_);
    }
    return fb::CreateNodeRecord(fbb_, node, r.name, r.forward_thread, r.sequence_nr, created_by,
                                variable, static_cast<uint8_t>(r.saved_kind), edges, saved)
        .Union();
  }
  fbs::Offset<void> operator()(const NodeExecRecord& r) {
    uint64_t node = ids_.Encode(r.node);
    uint64_t op = ids_.Encode(r.op);
    uint64_t start = times_.Encode(r.start_ns);
    uint64_t end = times_.Encode(r.end_ns);
    return fb::CreateNodeExecRecord(fbb_, node, op, r.thread, start, end, r.threw).Union();
  }
  fbs::Offset<void> operator()(const ErrorRecord& r) {
    uint64_t op = ids_.Encode(r.op);
    uint64_t time = times_.Encode(r.time_ns);
    return fb::CreateErrorRecord(fbb_, static_cast<uint8_t>(r.kind), op, r.thread, time, r.type,
                                 MaybeString(fbb_, r.message), r.stack)
        .Union();
  }
  fbs::Offset<void> operator()(const CudaKernelRecord& r) {
    uint64_t op = ids_.Encode(r.op);
    uint64_t start = times_.Encode(r.start_ns);
    uint64_t end = times_.Encode(r.end_ns);
    fb::Dim3 grid(r.grid.x, r.grid.y, r.grid.z);
    fb::Dim3 block(r.block.x, r.block.y, r.block.z);
    return fb::CreateCudaKernelRecord(fbb_, r.name, op, r.device, r.stream, r.correlation, start,
                                      end, &grid, &block, r.shared_memory, r.registers)
        .Union();
  }
  fbs::Offset<void> operator()(const CudaMemcpyRecord& r) {
    uint64_t op = ids_.Encode(r.op);
    uint64_t start = times_.Encode(r.start_ns);
    uint64_t end = times_.Encode(r.end_ns);
    return fb::CreateCudaMemcpyRecord(fbb_, static_cast<uint8_t>(r.kind), op, r.device, r.stream,
                                      r.correlation, start, end, r.bytes, r.memset_value)
        .Union();
  }
  fbs::Offset<void> operator()(const DataLossRecord& r) {
    uint64_t first = times_.Encode(r.first_ns);
    uint64_t last = times_.Encode(r.last_ns);
    return fb::CreateDataLossRecord(fbb_, r.records, r.bytes, first, last,
                                    MaybeString(fbb_, r.reason))
        .Union();
  }
  fbs::Offset<void> operator()(const FingerprintRecord& r) {
    uint64_t node = ids_.Encode(r.node);
    uint64_t storage = ids_.Encode(r.storage);
    uint64_t tensor = ids_.Encode(r.tensor);
    uint64_t time = times_.Encode(r.time_ns);
    return fb::CreateFingerprintRecord(fbb_, node, r.saved_name, r.list_index, storage, tensor,
                                       static_cast<uint8_t>(r.when), r.byte_offset, r.byte_length,
                                       r.hash, time)
        .Union();
  }

 private:
  fbs::FlatBufferBuilder& fbb_;
  IdCoder& ids_;
  TimeCoder& times_;
  std::vector<fbs::Offset<fb::Value>> value_offsets_;
  std::vector<fbs::Offset<fb::SavedTensor>> saved_offsets_;
};

// Mirrors Encoder: same field order for ids and times.
template <typename T>
T& Emplace(Record& out) {
  if (T* existing = std::get_if<T>(&out)) {
    return *existing;
  }
  return out.emplace<T>();
}

void Decode(const fb::StringDef& in, IdCoder&, TimeCoder&, Record& out) {
  auto& r = Emplace<StringDef>(out);
  r.id = in.id();
  r.text = ToString(in.text());
}
void Decode(const fb::FrameDef& in, IdCoder&, TimeCoder&, Record& out) {
  auto& r = Emplace<FrameDef>(out);
  r.id = in.id();
  r.kind = static_cast<FrameKind>(in.kind());
  r.pc = in.pc();
  r.function = in.function();
  r.file = in.file();
  r.line = in.line();
  r.library = in.library();
  r.framework = in.framework();
}
void Decode(const fb::StackDef& in, IdCoder&, TimeCoder&, Record& out) {
  auto& r = Emplace<StackDef>(out);
  r.id = in.id();
  CopyVector(in.frames(), r.frames);
}
void Decode(const fb::TensorInfo& in, IdCoder& ids, TimeCoder&, Record& out) {
  auto& r = Emplace<TensorInfo>(out);
  r.tensor = ids.Decode(in.tensor());
  r.storage = ids.Decode(in.storage());
  r.version_counter = ids.Decode(in.version_counter());
  r.grad_fn = ids.Decode(in.grad_fn());
  r.dtype = in.dtype();
  r.device.type = in.device_type();
  r.device.index = in.device_index();
  CopyVector(in.shape(), r.shape);
  CopyVector(in.strides(), r.strides);
  r.storage_offset = in.storage_offset();
  r.requires_grad = in.requires_grad();
  r.is_leaf = in.is_leaf();
  r.output_nr = in.output_nr();
  r.storage_nbytes = in.storage_nbytes();
  r.storage_address = in.storage_address();
}
void Decode(const fb::OpRecord& in, IdCoder& ids, TimeCoder& times, Record& out) {
  auto& r = Emplace<OpRecord>(out);
  r.op = ids.Decode(in.op());
  r.parent = ids.Decode(in.parent());
  r.start_ns = times.Decode(in.start_ns());
  r.end_ns = times.Decode(in.end_ns());
  DecodeUses(in.inputs(), ids, r.inputs);
  DecodeUses(in.outputs(), ids, r.outputs);
  r.name = in.name();
  r.overload = in.overload();
  r.thread = in.thread();
  r.scope = static_cast<OpScope>(in.scope());
  r.sequence_nr = in.sequence_nr();
  r.forward_thread = in.forward_thread();
  r.stack = in.stack();
  r.threw = in.threw();
  r.grad_mode = in.grad_mode();
  r.values.clear();
  if (const auto* values = in.values()) {
    r.values.reserve(values->size());
    for (const fb::Value* v : *values) {
      Value& value = r.values.emplace_back();
      value.position = v->position();
      value.kind = static_cast<ValueKind>(v->kind());
      value.i = v->i();
      value.d = v->d();
      value.d_imag = v->d_imag();
      value.s = v->s();
      CopyVector(v->ints(), value.ints);
      CopyVector(v->doubles(), value.doubles);
    }
  }
}
void Decode(const fb::NodeRecord& in, IdCoder& ids, TimeCoder&, Record& out) {
  auto& r = Emplace<NodeRecord>(out);
  r.node = ids.Decode(in.node());
  r.created_by = ids.Decode(in.created_by());
  r.variable = ids.Decode(in.variable());
  r.name = in.name();
  r.forward_thread = in.forward_thread();
  r.sequence_nr = in.sequence_nr();
  r.saved_kind = static_cast<SavedSetKind>(in.saved_kind());
  r.edges.clear();
  if (const auto* edges = in.edges()) {
    r.edges.reserve(edges->size());
    for (const fb::Edge* e : *edges) {
      r.edges.push_back(Edge{ids.Decode(e->node()), e->input_nr()});
    }
  }
  r.saved.clear();
  if (const auto* saved = in.saved()) {
    r.saved.reserve(saved->size());
    for (const fb::SavedTensor* s : *saved) {
      SavedTensor& t = r.saved.emplace_back();
      t.tensor = ids.Decode(s->tensor());
      t.storage = ids.Decode(s->storage());
      t.version_counter = ids.Decode(s->version_counter());
      t.name = s->name();
      t.list_index = s->list_index();
      t.saved_version = s->saved_version();
      t.is_output = s->is_output();
      t.defined = s->defined();
      t.has_hooks = s->has_hooks();
      t.is_leaf = s->is_leaf();
      t.output_nr = s->output_nr();
    }
  }
}
void Decode(const fb::NodeExecRecord& in, IdCoder& ids, TimeCoder& times, Record& out) {
  auto& r = Emplace<NodeExecRecord>(out);
  r.node = ids.Decode(in.node());
  r.op = ids.Decode(in.op());
  r.start_ns = times.Decode(in.start_ns());
  r.end_ns = times.Decode(in.end_ns());
  r.thread = in.thread();
  r.threw = in.threw();
}
void Decode(const fb::ErrorRecord& in, IdCoder& ids, TimeCoder& times, Record& out) {
  auto& r = Emplace<ErrorRecord>(out);
  r.op = ids.Decode(in.op());
  r.time_ns = times.Decode(in.time_ns());
  r.kind = static_cast<ErrorKind>(in.kind());
  r.thread = in.thread();
  r.type = in.type();
  r.message = ToString(in.message());
  r.stack = in.stack();
}
void Decode(const fb::CudaKernelRecord& in, IdCoder& ids, TimeCoder& times, Record& out) {
  auto& r = Emplace<CudaKernelRecord>(out);
  r.op = ids.Decode(in.op());
  r.start_ns = times.Decode(in.start_ns());
  r.end_ns = times.Decode(in.end_ns());
  r.name = in.name();
  r.device = in.device();
  r.stream = in.stream();
  r.correlation = in.correlation();
  r.grid = in.grid() ? Dim3{in.grid()->x(), in.grid()->y(), in.grid()->z()} : Dim3{};
  r.block = in.block() ? Dim3{in.block()->x(), in.block()->y(), in.block()->z()} : Dim3{};
  r.shared_memory = in.shared_memory();
  r.registers = in.registers();
}
void Decode(const fb::CudaMemcpyRecord& in, IdCoder& ids, TimeCoder& times, Record& out) {
  auto& r = Emplace<CudaMemcpyRecord>(out);
  r.op = ids.Decode(in.op());
  r.start_ns = times.Decode(in.start_ns());
  r.end_ns = times.Decode(in.end_ns());
  r.kind = static_cast<CudaCopyKind>(in.kind());
  r.device = in.device();
  r.stream = in.stream();
  r.correlation = in.correlation();
  r.bytes = in.bytes();
  r.memset_value = in.memset_value();
}
void Decode(const fb::DataLossRecord& in, IdCoder&, TimeCoder& times, Record& out) {
  auto& r = Emplace<DataLossRecord>(out);
  r.first_ns = times.Decode(in.first_ns());
  r.last_ns = times.Decode(in.last_ns());
  r.records = in.records();
  r.bytes = in.bytes();
  r.reason = ToString(in.reason());
}
void Decode(const fb::FingerprintRecord& in, IdCoder& ids, TimeCoder& times, Record& out) {
  auto& r = Emplace<FingerprintRecord>(out);
  r.node = ids.Decode(in.node());
  r.storage = ids.Decode(in.storage());
  r.tensor = ids.Decode(in.tensor());
  r.time_ns = times.Decode(in.time_ns());
  r.saved_name = in.saved_name();
  r.list_index = in.list_index();
  r.when = static_cast<FingerprintWhen>(in.when());
  r.byte_offset = in.byte_offset();
  r.byte_length = in.byte_length();
  r.hash = in.hash();
}

template <typename FbTable>
bool DecodeAs(const void* table, IdCoder& ids, TimeCoder& times, Record& out) {
  Decode(*static_cast<const FbTable*>(table), ids, times, out);
  return true;
}

}  // namespace

BatchEncoder::BatchEncoder(size_t initial_bytes) : fbb_(initial_bytes) {
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
}

Status BatchEncoder::Add(const Record& record) {
  IdCoder ids_before = ids_;
  TimeCoder times_before = times_;
  Encoder encoder(fbb_, ids_, times_);
  fbs::Offset<void> offset = std::visit(encoder, record);
  if (ids_.overflow()) {
    // The bytes already in the builder stay unreferenced; the record is not part of the batch.
    ids_ = ids_before;
    times_ = times_before;
    return Status(StatusCode::kInvalidArgument,
                  std::string(RecordKindName(record)) + " record has an id above 2^62-1; dropped");
  }
  types_.push_back(static_cast<uint8_t>(record.index() + 1));
  offsets_.push_back(offset);
  return Status::Ok();
}

std::span<const uint8_t> BatchEncoder::Finish() {
  auto types = fbb_.CreateVector(types_);
  auto records = fbb_.CreateVector(offsets_);
  fb::RecordBatchBuilder batch(fbb_);
  batch.add_base_high(base_high_);
  batch.add_base_time_ns(base_time_ns_);
  batch.add_records_type(types);
  batch.add_records(records);
  fbb_.Finish(batch.Finish());
  return {fbb_.GetBufferPointer(), fbb_.GetSize()};
}

// Upper bound of a record's fixed-size fields and table overhead.
constexpr size_t kFixed = 256;

size_t EstimateEncodedBytes(const Record& record) {
  return std::visit(
      Overloaded{
          [](const StringDef& r) { return kFixed + r.text.size(); },
          [](const StackDef& r) { return kFixed + 4 * r.frames.size(); },
          [](const TensorInfo& r) { return kFixed + 8 * (r.shape.size() + r.strides.size()); },
          [](const OpRecord& r) {
            size_t n = kFixed + 24 * (r.inputs.size() + r.outputs.size());
            for (const Value& v : r.values) n += 96 + 8 * (v.ints.size() + v.doubles.size());
            return n;
          },
          [](const NodeRecord& r) { return kFixed + 16 * r.edges.size() + 96 * r.saved.size(); },
          [](const ErrorRecord& r) { return kFixed + r.message.size(); },
          [](const DataLossRecord& r) { return kFixed + r.reason.size(); },
          [](const auto&) { return kFixed; },
      },
      record);
}

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
  info.torchrr_version = ToString(in.torchrr_version());
  info.torch_version = ToString(in.torch_version());
  info.cuda_version = ToString(in.cuda_version());
  info.host = ToString(in.host());
  info.pid = in.pid();
  info.rank = in.rank();
  info.world_size = in.world_size();
  info.start_time_unix_ns = in.start_time_unix_ns();
  if (const auto* args = in.command_line()) {
    for (const fbs::String* arg : *args) info.command_line.push_back(ToString(arg));
  }
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
                  Record& out) {
  if (table == nullptr) return false;
  switch (type) {
    case fb::Record_StringDef: return DecodeAs<fb::StringDef>(table, ids, times, out);
    case fb::Record_FrameDef: return DecodeAs<fb::FrameDef>(table, ids, times, out);
    case fb::Record_StackDef: return DecodeAs<fb::StackDef>(table, ids, times, out);
    case fb::Record_TensorInfo: return DecodeAs<fb::TensorInfo>(table, ids, times, out);
    case fb::Record_OpRecord: return DecodeAs<fb::OpRecord>(table, ids, times, out);
    case fb::Record_NodeRecord: return DecodeAs<fb::NodeRecord>(table, ids, times, out);
    case fb::Record_NodeExecRecord: return DecodeAs<fb::NodeExecRecord>(table, ids, times, out);
    case fb::Record_ErrorRecord: return DecodeAs<fb::ErrorRecord>(table, ids, times, out);
    case fb::Record_CudaKernelRecord: return DecodeAs<fb::CudaKernelRecord>(table, ids, times, out);
    case fb::Record_CudaMemcpyRecord: return DecodeAs<fb::CudaMemcpyRecord>(table, ids, times, out);
    case fb::Record_DataLossRecord: return DecodeAs<fb::DataLossRecord>(table, ids, times, out);
    case fb::Record_FingerprintRecord:
      return DecodeAs<fb::FingerprintRecord>(table, ids, times, out);
    default:
      return false;
  }
}

static_assert(fb::Record_MAX == kRecordKindCount, "trace.fbs's Record union must list every kind");

}  // namespace torchrr::format
