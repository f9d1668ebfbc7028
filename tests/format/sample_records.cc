#include "sample_records.h"

#include <string>
#include <utility>

#include "torchrr/format/json.h"

namespace torchrr::format::testing {

FileInfo SampleFileInfo() {
  FileInfo info;
  info.torchrr_version = "0.1.0";
  info.torch_version = "2.4.1+cu121";
  info.cuda_version = "12.1";
  info.host = "golden-host";
  info.pid = 4242;
  info.rank = 3;
  info.world_size = 8;
  info.start_time_unix_ns = 1700000000123456789;
  info.command_line = {"python", "train.py", "--lr", "1e-4"};
  return info;
}

std::vector<Record> EveryKind(uint64_t base, uint64_t old_id, int64_t t0) {
  std::vector<Record> out;
  auto id = [base](uint64_t i) { return base + i; };
  auto intern = [base](uint32_t i) { return static_cast<InternId>(base % 1000 + i); };

  out.push_back(StringDef{intern(1), "aten::add_" + std::to_string(base)});
  out.push_back(FrameDef{intern(2), FrameKind::kPython, 0x7f00dead0000 + base, intern(1),
                         intern(1), 42, intern(1), true, 7});
  out.push_back(StackDef{intern(3), {intern(2), intern(2), 7}});

  TensorInfo tensor;
  tensor.tensor = id(10);          // New: above high.
  tensor.storage = id(5);          // Below high, above base: relative to high.
  tensor.version_counter = old_id; // At or below base (or an earlier batch): absolute.
  tensor.dtype = 6;
  tensor.device = Device{1, 3};
  tensor.shape = {4, 1024, 4096};
  tensor.strides = {4194304, 4096, 1};
  tensor.storage_offset = 17;
  tensor.requires_grad = true;
  tensor.is_leaf = false;
  tensor.grad_fn = id(20);
  tensor.output_nr = 2;
  tensor.storage_nbytes = 67108864;
  tensor.storage_address = 0x7f3a12345000;
  tensor.inner = id(11);           // In (base, high]: relative to high, as it stands after grad_fn.
  out.push_back(tensor);

  OpRecord op;
  op.op = id(30);
  op.name = intern(1);
  op.overload = intern(4);
  op.parent = id(25);
  op.thread = 9;
  op.scope = OpScope::kBackwardFunction;
  op.sequence_nr = 1234;
  op.forward_thread = 77;
  op.start_ns = t0 + 1000;
  op.end_ns = t0 + 900;  // Ends "before" it starts: negative deltas must survive.
  op.stack = intern(3);
  op.threw = true;
  op.grad_mode = false;
  op.inputs = {TensorUse{id(10), 3, 4, 0, TensorUse::kNotInList}, TensorUse{old_id, 1, 1, 1, 2},
               TensorUse{0, 0, 0, 2, 0}};
  op.outputs = {TensorUse{id(31), 0, 1, 0, 5}};
  Value vb{0, ValueKind::kBool, 1, 0, 0, 0, {}, {}};
  Value vd{1, ValueKind::kComplex, -3, 2.5, -0.75, intern(1), {1, -2}, {0.5}};
  Value vl{2, ValueKind::kIntList, 0, 0, 0, 0, {-1, 0, 1, INT64_MAX, INT64_MIN}, {1e300, -1e-300}};
  op.values = {vb, vd, vl};
  op.module_path = intern(1);
  op.input_ranges = {ValueRange{ValueRange::kChecked, 7.1e4f}, ValueRange{},
                     ValueRange{ValueRange::kChecked | ValueRange::kNan | ValueRange::kNegInf, 0}};
  op.output_ranges = {ValueRange{ValueRange::kChecked | ValueRange::kPosInf, 3.4028235e38f}};
  out.push_back(op);

  NodeRecord node;
  node.node = id(20);
  node.name = intern(5);
  node.forward_thread = 77;
  node.sequence_nr = 1234;
  node.created_by = id(30);
  node.variable = id(3);
  node.saved_kind = SavedSetKind::kCustom;
  node.edges = {Edge{id(21), 0}, Edge{0, 1}, Edge{old_id, 3}};
  SavedTensor saved;
  saved.name = intern(6);
  saved.list_index = 1;
  saved.tensor = id(10);
  saved.storage = id(5);
  saved.version_counter = old_id;
  saved.saved_version = 4;
  saved.is_output = true;
  saved.defined = false;
  saved.has_hooks = true;
  saved.is_leaf = true;
  saved.output_nr = 1;
  saved.hook = SavedHook::kCheckpoint;
  saved.checked = false;
  saved.recompute_from = id(21);
  saved.unpack_hook = intern(3);
  saved.used_at = intern(3);
  node.saved = {saved, SavedTensor{}};
  out.push_back(node);

  out.push_back(NodeExecRecord{id(20), id(32), 11, t0 + 2000, t0 + 2500, true,
                               {UnpackedTensor{1, 5, {4, 8}, 6, {4, 8}}}});
  out.push_back(ErrorRecord{ErrorKind::kPythonException, id(32), 11, t0 + 2600, intern(7),
                            "one of the variables needed for gradient computation has been "
                            "modified by an inplace operation",
                            intern(3)});
  CudaKernelRecord kernel;
  kernel.name = intern(8);
  kernel.op = id(30);
  kernel.device = 1;
  kernel.stream = 7;
  kernel.correlation = 99;
  kernel.start_ns = t0 + 1100;
  kernel.end_ns = t0 + 1200;
  kernel.grid = Dim3{128, 2, 3};
  kernel.block = Dim3{256, 4, 1};
  kernel.shared_memory = 49152;
  kernel.registers = 64;
  out.push_back(kernel);
  out.push_back(CudaMemcpyRecord{CudaCopyKind::kDeviceToHost, id(30), 1, 7, 100, t0 + 1300,
                                 t0 + 1400, 4096, 0xab});
  out.push_back(DataLossRecord{12, 3456, t0 + 10, t0 + 20, "ring buffer full"});
  FingerprintRecord fingerprint;
  fingerprint.node = id(20);
  fingerprint.saved_name = intern(6);
  fingerprint.list_index = 0;
  fingerprint.storage = id(5);
  fingerprint.tensor = id(10);
  fingerprint.when = FingerprintWhen::kAtUse;
  fingerprint.byte_offset = 64;
  fingerprint.byte_length = 1 << 20;
  fingerprint.hash = 0x0123456789abcdef;
  fingerprint.time_ns = t0 + 3000;
  out.push_back(fingerprint);
  out.push_back(SourceFile{intern(1), 0xfedcba9876543210 + base, 4096 + base, 120});
  out.push_back(SourceLines{intern(1), 40, {"def step(x):", "    y = x * w", "", "\ty.add_(1)  # \xc3\xa9"}});
  out.push_back(StepRecord{base, t0 + 5, base % 2 == 0});
  return out;
}

std::vector<Record> ManySteps(int steps) {
  std::vector<Record> out;
  for (int step = 0; step < steps; ++step) {
    uint64_t base = 1000 + 100 * static_cast<uint64_t>(step);
    uint64_t old_id = 1 + static_cast<uint64_t>(step) * 37;
    for (Record& r : EveryKind(base, old_id, 1'000'000'000LL * (step + 1))) {
      out.push_back(std::move(r));
    }
  }
  return out;
}

std::vector<Record> TrainingSteps(int steps) {
  enum : InternId { kMm = 1, kAdd, kMmBackward, kAddInPlace };
  std::vector<Record> out = {StringDef{kMm, "aten::mm"}, StringDef{kAdd, "aten::add"},
                             StringDef{kMmBackward, "MmBackward0"},
                             StringDef{kAddInPlace, "aten::add_"}};
  ObjectId next_id = 1;
  int64_t t = 1'000'000'000;
  uint64_t state = 88172645463325252ull;
  auto jitter = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return static_cast<int64_t>(state % 200);
  };
  auto op = [&](InternId name, OpScope scope, int64_t gap, int64_t duration) {
    OpRecord r;
    r.op = next_id++;
    r.name = name;
    r.scope = scope;
    r.thread = 1;
    r.start_ns = t + gap + jitter();
    r.end_ns = r.start_ns + duration + jitter();
    t = r.end_ns;
    return r;
  };
  for (int step = 0; step < steps; ++step) {
    std::vector<ObjectId> nodes;
    const std::pair<InternId, int64_t> forwards[] = {{kMm, 20'000}, {kAdd, 3'000}};
    for (auto [name, duration] : forwards) {
      OpRecord forward = op(name, OpScope::kFunction, 500, duration);
      NodeRecord node;  // Written before the op whose end saw it, as the recorder does.
      node.node = next_id++;
      node.name = kMmBackward;
      node.created_by = forward.op;
      nodes.push_back(node.node);
      out.push_back(node);
      out.push_back(forward);
    }
    OpRecord backward = op(kMmBackward, OpScope::kBackwardFunction, 800, 40'000);
    out.push_back(backward);
    out.push_back(NodeExecRecord{nodes[0], backward.op, 1, backward.start_ns, backward.end_ns});
    out.push_back(op(kAddInPlace, OpScope::kFunction, 200, 5'000));
  }
  return out;
}

}  // namespace torchrr::format::testing

namespace torchrr::format {

void PrintTo(const Record& record, std::ostream* os) { *os << RecordToJson(record).dump(); }
void PrintTo(const FileInfo& info, std::ostream* os) { *os << FileInfoToJson(info).dump(); }

}  // namespace torchrr::format
