// bench_replayer: how fast `torchrr replay` analyses a trace and how much memory it holds.
//
// A synthetic training run of about a million ops, shaped like the recorder's output for an MLP:
// per step, for each layer an aten::mm and an aten::relu (each a node saving its tensors), a loss,
// the backward pass (every node executed, each with a nested op), and an optimizer step that
// updates every weight in place. Measures
//   1. the analysis alone: records fed to an Analyzer as they are generated (generation untimed);
//   2. `replay` end to end: the trace encoded with TraceWriter, then ReadTraceBytes -> Analyzer;
// and, for each, the peak heap the analysis added (a counting operator new) against the
// decompressed trace size (the writer's raw chunk bytes). Targets: >= 2M ops/s, peak <= 2x.
//
//   3. many threads: as many top-level ops (each with a stack, as the user's calls are), each on a
//      thread of its own, against the same ops on one thread: the per-thread lookups are hashed,
//      so the ratio stays near 1 whatever the count (a scan made it grow with the count).
//
// Usage: bench_replayer [ops (default 1000000)] [threads (default 400000)]
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "torchrr/format/reader.h"
#include "torchrr/format/writer.h"
#include "torchrr/replayer/replayer.h"

// --- Counting allocator: live heap bytes and their peak. ---------------------------------------
namespace {
// Plain counters: the benchmark allocates from one thread (the reader does not start any).
struct Counter {
  int64_t value = 0;
  int64_t load() const { return value; }
  void store(int64_t v) { value = v; }
};
Counter g_live;
Counter g_peak;

void* Count(void* p) {
  if (p == nullptr) throw std::bad_alloc();
  g_live.value += static_cast<int64_t>(malloc_usable_size(p));
  if (g_live.value > g_peak.value) g_peak.value = g_live.value;
  return p;
}
void Uncount(void* p) {
  if (p != nullptr) g_live.value -= static_cast<int64_t>(malloc_usable_size(p));
  free(p);
}
void ResetPeak() { g_peak.store(g_live.load()); }
}  // namespace

void* operator new(size_t n) { return Count(malloc(n)); }
void* operator new[](size_t n) { return Count(malloc(n)); }
void operator delete(void* p) noexcept { Uncount(p); }
void operator delete[](void* p) noexcept { Uncount(p); }
void operator delete(void* p, size_t) noexcept { Uncount(p); }
void operator delete[](void* p, size_t) noexcept { Uncount(p); }

namespace {

using namespace torchrr;
using format::ObjectId;
using format::Record;

constexpr int kLayers = 8;
constexpr int64_t kWidth = 256;
constexpr int64_t kBatch = 32;

// Generates the run step by step; each call appends one training step's records.
class SyntheticRun {
 public:
  uint64_t ops = 0;

  void Begin(std::vector<Record>& out) {
    const char* names[] = {"aten::mm", "aten::relu", "aten::sum", "aten::sub_", "aten::mm",
                           "MmBackward0", "ReluBackward0", "SumBackward0",
                           "torch::autograd::AccumulateGrad", "aten::threshold_backward",
                           "train.py", "forward", "step", "torch/nn/functional.py", "linear",
                           "self", "mat2", "result"};
    for (uint32_t i = 0; i < std::size(names); ++i) out.push_back(format::StringDef{i + 1, names[i]});
    // Frames: 1 torch frame, then train.py at lines 10..(10+kLayers*2+2).
    out.push_back(format::FrameDef{1, format::FrameKind::kPython, 0, 15, 14, 100, 0, true});
    for (uint32_t line = 0; line < 40; ++line) {
      out.push_back(format::FrameDef{2 + line, format::FrameKind::kPython, 0, 12, 11, 10 + line, 0,
                                     false});
      out.push_back(format::StackDef{1 + line, {1, 2 + line}});
    }
    for (int l = 0; l < kLayers; ++l) {
      weights_[l] = NewTensor(out, {kWidth, kWidth}, true, 0);
      format::NodeRecord acc;
      acc.node = accumulate_[l] = NewId();
      acc.name = 9;
      acc.sequence_nr = INT64_MAX;
      acc.variable = weights_[l];
      acc.saved_kind = format::SavedSetKind::kNone;
      out.push_back(acc);
    }
  }

  void Step(std::vector<Record>& out) {
    std::vector<ObjectId> nodes;  // In creation order.
    ObjectId h = NewTensor(out, {kBatch, kWidth}, false, 0);
    ObjectId h_node = 0;
    uint32_t line = 0;
    for (int l = 0; l < kLayers; ++l) {
      ObjectId mm_node = NewId();
      ObjectId mm_out = NewTensor(out, {kBatch, kWidth}, true, mm_node);
      ObjectId mm_op = Op(out, 1, {h, weights_[l]}, {mm_out}, 0, ++line, seq_nr_);
      Node(out, mm_node, 6, mm_op, {h_node, accumulate_[l]},
           {{16, h}, {17, weights_[l]}});
      nodes.push_back(mm_node);
      ObjectId relu_node = NewId();
      ObjectId relu_out = NewTensor(out, {kBatch, kWidth}, true, relu_node);
      ObjectId relu_op = Op(out, 2, {mm_out}, {relu_out}, 0, ++line, seq_nr_);
      Node(out, relu_node, 7, relu_op, {mm_node}, {{18, relu_out}});
      nodes.push_back(relu_node);
      h = relu_out;
      h_node = relu_node;
    }
    ObjectId loss_node = NewId();
    ObjectId loss = NewTensor(out, {}, true, loss_node);
    ObjectId loss_op = Op(out, 3, {h}, {loss}, 0, ++line, seq_nr_);
    Node(out, loss_node, 8, loss_op, {h_node}, {});
    nodes.push_back(loss_node);
    // Backward: every node in reverse creation order, each with a nested op, then the weights'
    // AccumulateGrad nodes.
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) Exec(out, *it, true);
    for (int l = 0; l < kLayers; ++l) Exec(out, accumulate_[l], false);
    // Optimizer: w.sub_(lr * grad) under no_grad.
    for (int l = 0; l < kLayers; ++l) {
      uint32_t v = versions_[l]++;
      format::OpRecord op = BaseOp(4, 0, 35);
      op.grad_mode = false;
      op.inputs.push_back({weights_[l], v, v + 1, 0});
      op.outputs.push_back({weights_[l], v, v + 1, 0});
      out.push_back(std::move(op));
    }
  }

 private:
  ObjectId NewId() { return ++next_id_; }

  ObjectId NewTensor(std::vector<Record>& out, std::vector<int64_t> shape, bool requires_grad,
                     ObjectId grad_fn) {
    format::TensorInfo t;
    t.tensor = NewId();
    t.storage = NewId();
    t.version_counter = NewId();
    t.dtype = 6;
    t.strides = shape.size() == 2 ? std::vector<int64_t>{shape[1], 1} : std::vector<int64_t>{};
    t.shape = std::move(shape);
    t.requires_grad = requires_grad;
    t.is_leaf = grad_fn == 0;
    t.grad_fn = grad_fn;
    t.storage_nbytes = 4 * kBatch * kWidth;
    out.push_back(std::move(t));
    return t.tensor;
  }

  format::OpRecord BaseOp(format::InternId name, ObjectId parent, uint32_t line) {
    format::OpRecord op;
    op.op = NewId();
    op.name = name;
    op.parent = parent;
    op.thread = 1;
    op.start_ns = ++clock_;
    op.end_ns = ++clock_;
    op.stack = line == 0 ? 0 : std::min<uint32_t>(line, 40);
    ++ops;
    return op;
  }

  ObjectId Op(std::vector<Record>& out, format::InternId name, std::vector<ObjectId> inputs,
              std::vector<ObjectId> outputs, ObjectId parent, uint32_t line, int64_t& seq) {
    format::OpRecord op = BaseOp(name, parent, line);
    op.sequence_nr = seq++;
    uint16_t position = 0;
    for (ObjectId t : inputs) op.inputs.push_back({t, Version(t), Version(t), position++});
    position = 0;
    for (ObjectId t : outputs) op.outputs.push_back({t, 0, 0, position++});
    ObjectId id = op.op;
    out.push_back(std::move(op));
    return id;
  }

  uint32_t Version(ObjectId t) const {
    for (int l = 0; l < kLayers; ++l) {
      if (weights_[l] == t) return versions_[l];
    }
    return 0;
  }

  void Node(std::vector<Record>& out, ObjectId id, format::InternId name, ObjectId created_by,
            std::vector<ObjectId> edges, std::vector<std::pair<format::InternId, ObjectId>> saved) {
    format::NodeRecord node;
    node.node = id;
    node.name = name;
    node.forward_thread = 1;
    node.sequence_nr = seq_nr_ - 1;
    node.created_by = created_by;
    for (ObjectId e : edges) node.edges.push_back({e, 0});
    for (auto [member, tensor] : saved) {
      format::SavedTensor s;
      s.name = member;
      s.tensor = tensor;
      s.storage = tensor + 1;           // NewTensor's ids: tensor, storage, counter.
      s.version_counter = tensor + 2;
      s.saved_version = Version(tensor);
      node.saved.push_back(s);
    }
    node_seq_[id] = node.sequence_nr;
    out.push_back(std::move(node));
  }

  void Exec(std::vector<Record>& out, ObjectId node, bool nested) {
    format::OpRecord op = BaseOp(0, 0, 0);
    ObjectId id = op.op;
    if (nested) {
      format::OpRecord child = BaseOp(10, id, 0);
      out.push_back(std::move(child));
    }
    op.scope = format::OpScope::kBackwardFunction;
    op.sequence_nr = node_seq_.count(node) ? node_seq_[node] : INT64_MAX;
    out.push_back(std::move(op));
    out.push_back(format::NodeExecRecord{node, id, 1, clock_, clock_, false});
    node_seq_.erase(node);
  }

  ObjectId next_id_ = 0;
  int64_t clock_ = 0;
  int64_t seq_nr_ = 0;
  ObjectId weights_[kLayers] = {};
  uint32_t versions_[kLayers] = {};
  ObjectId accumulate_[kLayers] = {};
  std::unordered_map<ObjectId, int64_t> node_seq_;
};

// CPU seconds the analysis takes for `ops` top-level ops with a stack, each on a thread of its own
// (`own_threads`) or all on thread 1.
double ThreadsAnalysis(uint64_t ops, bool own_threads);

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// CPU time of this thread: on a shared machine wall time also counts other processes' turns.
double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t target_ops = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000000;

  // The trace, encoded once (its decompressed size is the memory yardstick).
  std::string bytes;
  uint64_t raw_bytes = 0;
  {
    auto writer = format::TraceWriter::ToString(&bytes, format::FileInfo{});
    SyntheticRun run;
    std::vector<Record> batch;
    run.Begin(batch);
    while (true) {
      for (const Record& r : batch) {
        if (!writer->Append(r).ok()) return 7;
      }
      batch.clear();
      if (run.ops >= target_ops) break;
      run.Step(batch);
    }
    if (!writer->Close().ok()) return 7;
    raw_bytes = writer->raw_bytes_written();
  }
  bytes.shrink_to_fit();
  // 1. Analysis alone, fed as generated (generation not timed; the record batch is small).
  {
    SyntheticRun run;
    std::vector<Record> batch;
    replayer::Analyzer analyzer;
    int64_t base = g_live.load();
    ResetPeak();
    std::chrono::steady_clock::duration busy{};
    double cpu = 0;
    run.Begin(batch);
    while (true) {
      auto t0 = std::chrono::steady_clock::now();
      double c0 = CpuSeconds();
      for (const Record& r : batch) analyzer.Add(r);
      cpu += CpuSeconds() - c0;
      busy += std::chrono::steady_clock::now() - t0;
      batch.clear();
      if (run.ops >= target_ops) break;
      run.Step(batch);
    }
    auto t0 = std::chrono::steady_clock::now();
    replayer::Report report = analyzer.Finish();
    busy += std::chrono::steady_clock::now() - t0;
    std::printf("analysis only: %llu ops, %llu records, %llu node executions, %llu passes, "
                "%zu violations\n",
                (unsigned long long)report.ops, (unsigned long long)report.records,
                (unsigned long long)report.node_executions,
                (unsigned long long)report.backward_passes, report.violations.size());
    double peak = static_cast<double>(g_peak.load() - base);
    std::printf("  wall %.3f s = %.2f M ops/s; cpu %.3f s = %.2f M ops/s; peak heap added %.1f "
                "MiB = %.2fx the decompressed trace (includes the generator's one-step batch)\n",
                Seconds(busy), report.ops / Seconds(busy) / 1e6, cpu, report.ops / cpu / 1e6,
                peak / 1048576.0, peak / raw_bytes);
  }

  // 2. End to end: read and analyse.
  {
    int64_t base = g_live.load();
    ResetPeak();
    auto t0 = std::chrono::steady_clock::now();
    double c0 = CpuSeconds();
    replayer::Analyzer analyzer;
    format::ReadSummary summary =
        format::ReadTraceBytes(bytes, [&](const Record& r) { analyzer.Add(r); });
    replayer::Report report = analyzer.Finish();
    double seconds = Seconds(std::chrono::steady_clock::now() - t0);
    double cpu = CpuSeconds() - c0;
    double peak = static_cast<double>(g_peak.load() - base);
    std::printf("read + analysis: %llu ops from %.1f MiB on disk, %.1f MiB decompressed (%s)\n",
                (unsigned long long)report.ops, bytes.size() / 1048576.0, raw_bytes / 1048576.0,
                summary.status.ok() ? "ok" : summary.status.message().c_str());
    std::printf("  wall %.3f s = %.2f M ops/s; cpu %.3f s = %.2f M ops/s; peak heap added %.1f "
                "MiB = %.2fx the decompressed trace\n",
                seconds, report.ops / seconds / 1e6, cpu, report.ops / cpu / 1e6,
                peak / 1048576.0, peak / raw_bytes);
  }
  // 3. Many threads against one.
  {
    const uint64_t threads = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 400000;
    const double one = ThreadsAnalysis(threads, false);
    const double own = ThreadsAnalysis(threads, true);
    std::printf("threads: %llu ops on one thread %.3f s cpu, each on its own thread %.3f s cpu: "
                "%.2fx\n",
                (unsigned long long)threads, one, own, own / one);
  }
  return 0;
}

namespace {

double ThreadsAnalysis(uint64_t ops, bool own_threads) {
  std::vector<Record> records;
  records.push_back(format::StringDef{1, "aten::add"});
  records.push_back(format::StringDef{2, "train.py"});
  records.push_back(format::FrameDef{1, format::FrameKind::kPython, 0, 1, 2, 10, 0, false});
  records.push_back(format::StackDef{1, {1}});
  records.reserve(ops + 4);
  for (uint64_t i = 0; i < ops; ++i) {
    format::OpRecord op;
    op.op = i + 1;
    op.name = 1;
    op.thread = own_threads ? static_cast<uint32_t>(i + 1) : 1;
    op.start_ns = static_cast<int64_t>(2 * i + 1);
    op.end_ns = static_cast<int64_t>(2 * i + 2);
    op.stack = 1;
    records.push_back(std::move(op));
  }
  const double c0 = CpuSeconds();
  replayer::Analyzer analyzer;
  for (const Record& r : records) analyzer.Add(r);
  (void)analyzer.Finish();
  return CpuSeconds() - c0;
}

}  // namespace
