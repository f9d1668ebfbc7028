// bench_format: how fast TraceWriter encodes, and how small a repeating training step gets.
//
// Writes a synthetic stream shaped like a LoRA fine-tuning step (RMSNorm, attention and SwiGLU
// blocks whose projections are frozen linears with LoRA A/B adapters, backward node executions,
// AdamW on the adapters) 50 times into memory: parameters are reused, activations are new each
// step, ids are allocated in the same order every step and timestamps jitter. Only Append and
// Close are timed (the records are generated between the timed parts), then, apart, reading the
// trace back, and the recorder's hop of every record through RecordBytes (appended as bytes, read
// back). Not a test.
//
// Each figure with step coding (format 1.10) off and on, side by side. With --trace, it instead
// writes the records of a recorded trace again both ways and prints the bytes per op of each.
//
//   build/bin/bench_format [--steps N] [--layers N] [--level N]
//   build/bin/bench_format --trace FILE
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "torchrr/format/reader.h"
#include "torchrr/format/record_bytes.h"
#include "torchrr/format/writer.h"

namespace torchrr::format {
namespace {

struct Tensor {
  ObjectId id = 0;
  ObjectId grad_fn = 0;
  uint32_t version = 0;
};

// Emits the records of one process's training steps; state (ids, params, interned names) carries
// from step to step like the recorder's would.
class LoraStepGenerator {
 public:
  explicit LoraStepGenerator(int layers) : layers_(layers), rng_(42) {}

  // The records of the next step (the first also defines the parameters and names).
  const std::vector<Record>& Step() {
    out_.clear();
    ops_ = 0;
    if (params_.empty()) Setup();
    forward_nodes_.clear();
    Tensor x = NewActivation({4, 512, kHidden}, 0);
    Op("aten::embedding", 0, {params_[0], x}, 1, {IntValue(2, -1)}, false);
    x = last_outputs_[0];
    for (int l = 0; l < layers_; ++l) x = Block(l, x);
    x = RmsNorm(x, final_norm_);
    Tensor logits = FrozenLinear("lm_head", x, head_);
    Tensor loss = UnaryOp("aten::cross_entropy_loss", logits, true, {IntValue(2, -100)});
    Backward(loss);
    Optimizer();
    return out_;
  }
  uint64_t ops() const { return ops_; }

 private:
  static constexpr int64_t kHidden = 4096;

  ObjectId NewId() { return next_id_++; }

  InternId Intern(const std::string& text) {
    auto [it, inserted] = strings_.emplace(text, static_cast<InternId>(strings_.size() + 1));
    if (inserted) out_.push_back(StringDef{it->second, text});
    return it->second;
  }

  InternId StackFor(const std::string& site) {
    auto it = stacks_.find(site);
    if (it != stacks_.end()) return it->second;
    InternId file = Intern("/home/user/lora/model.py");
    InternId function = Intern(site);
    auto frame = static_cast<InternId>(frames_++ + 1);
    out_.push_back(FrameDef{frame, FrameKind::kPython, 0, function, file,
                            static_cast<uint32_t>(100 + stacks_.size()), Intern("model"), false});
    auto stack = static_cast<InternId>(stacks_.size() + 1);
    out_.push_back(StackDef{stack, {frame, 1, 2}});
    stacks_[site] = stack;
    return stack;
  }

  int64_t Jitter(int64_t base, int64_t spread) {
    return base + static_cast<int64_t>(rng_() % static_cast<uint64_t>(spread));
  }

  Tensor NewTensor(std::vector<int64_t> shape, ObjectId grad_fn, bool requires_grad, bool leaf) {
    Tensor t{NewId(), grad_fn, 0};
    TensorInfo info;
    info.tensor = t.id;
    info.storage = NewId();
    info.version_counter = NewId();
    info.dtype = 15;  // bfloat16
    info.device = Device{1, 0};
    int64_t numel = 1;
    info.strides.resize(shape.size());
    for (size_t i = shape.size(); i-- > 0;) {
      info.strides[i] = numel;
      numel *= shape[i];
    }
    info.shape = std::move(shape);
    info.requires_grad = requires_grad;
    info.is_leaf = leaf;
    info.grad_fn = grad_fn;
    info.storage_nbytes = static_cast<uint64_t>(numel) * 2;
    out_.push_back(std::move(info));
    return t;
  }
  Tensor NewActivation(std::vector<int64_t> shape, ObjectId grad_fn) {
    return NewTensor(std::move(shape), grad_fn, grad_fn != 0, grad_fn == 0);
  }

  static Value IntValue(uint16_t position, int64_t i) {
    Value v;
    v.position = position;
    v.kind = ValueKind::kInt;
    v.i = i;
    return v;
  }
  static Value DoubleValue(uint16_t position, double d) {
    Value v;
    v.position = position;
    v.kind = ValueKind::kDouble;
    v.d = d;
    return v;
  }

  // One op: its outputs are new activations (or, for in-place ops, the first input written).
  // With `node`, an autograd node that saves the inputs and links to their grad_fns.
  ObjectId Op(const std::string& name, ObjectId parent, std::vector<Tensor> inputs, int outputs,
              std::vector<Value> values, bool node, bool in_place = false,
              OpScope scope = OpScope::kFunction) {
    OpRecord op;
    op.op = NewId();
    op.name = Intern(name);
    op.parent = parent;
    op.thread = scope == OpScope::kBackwardFunction ? 2 : 1;
    op.scope = scope;
    op.stack = scope == OpScope::kFunction && parent == 0 ? StackFor(name) : 0;
    clock_ += Jitter(800, 400);
    op.start_ns = clock_;
    ObjectId node_id = 0;
    if (node) {
      node_id = NewId();
      op.sequence_nr = sequence_nr_++;
    }
    last_outputs_.clear();
    for (const Tensor& t : inputs) {
      op.inputs.push_back(TensorUse{t.id, t.version, t.version, 0, TensorUse::kNotInList});
    }
    for (uint16_t i = 0; i < op.inputs.size(); ++i) op.inputs[i].position = i;
    if (in_place) {
      Tensor& written = inputs[0];
      op.inputs[0].version_after = written.version + 1;
      op.outputs.push_back(TensorUse{written.id, written.version, written.version + 1, 0,
                                     TensorUse::kNotInList});
    } else {
      for (int i = 0; i < outputs; ++i) {
        Tensor out = NewActivation({4, 512, kHidden}, node_id);
        op.outputs.push_back(TensorUse{out.id, 0, 0, static_cast<uint16_t>(i),
                                       TensorUse::kNotInList});
        last_outputs_.push_back(out);
      }
    }
    if (node) {
      NodeRecord n;
      n.node = node_id;
      n.name = Intern(name.substr(6) + "Backward0");
      n.forward_thread = 1;
      n.sequence_nr = op.sequence_nr;
      n.created_by = op.op;
      for (const Tensor& t : inputs) {
        n.edges.push_back(Edge{t.grad_fn, 0});
        SavedTensor s;
        s.name = Intern("self");
        s.tensor = t.id;
        s.storage = t.id + 1;
        s.version_counter = t.id + 2;
        s.saved_version = t.version;
        n.saved.push_back(s);
      }
      out_.push_back(std::move(n));
      forward_nodes_.push_back(node_id);
    }
    op.values = std::move(values);
    clock_ += Jitter(3000, 2000);
    op.end_ns = clock_;
    out_.push_back(std::move(op));
    ++ops_;
    return node_id;
  }

  Tensor UnaryOp(const std::string& name, const Tensor& x, bool node, std::vector<Value> values) {
    Op(name, 0, {x}, 1, std::move(values), node);
    return last_outputs_[0];
  }
  Tensor BinaryOp(const std::string& name, const Tensor& a, const Tensor& b) {
    Op(name, 0, {a, b}, 1, {}, true);
    return last_outputs_[0];
  }

  // aten::linear and the ops it runs inside (recorded first: an op is written at its end).
  Tensor Linear(const Tensor& x, const Tensor& weight, bool requires_grad) {
    ObjectId linear = NewId();
    int64_t start = clock_;
    Op("aten::t", linear, {weight}, 1, {}, false);
    Tensor t = last_outputs_[0];
    Op("aten::matmul", linear, {x, t}, 1, {}, requires_grad);
    Tensor y = last_outputs_[0];
    OpRecord op;
    op.op = linear;
    op.name = Intern("aten::linear");
    op.thread = 1;
    op.stack = StackFor("linear");
    op.start_ns = start;
    op.end_ns = clock_ + Jitter(500, 200);
    op.inputs = {TensorUse{x.id, 0, 0, 0, TensorUse::kNotInList},
                 TensorUse{weight.id, weight.version, weight.version, 1, TensorUse::kNotInList}};
    op.outputs = {TensorUse{y.id, 0, 0, 0, TensorUse::kNotInList}};
    out_.push_back(std::move(op));
    ++ops_;
    return y;
  }

  struct LoraLinear {
    Tensor weight;  // Frozen.
    Tensor a, b;    // Trained.
    ObjectId accumulate_a = 0, accumulate_b = 0;
    Tensor exp_avg_a, exp_avg_sq_a, exp_avg_b, exp_avg_sq_b;
  };

  Tensor FrozenLinear(const std::string&, const Tensor& x, const Tensor& weight) {
    return Linear(x, weight, false);
  }

  Tensor Lora(const LoraLinear& p, const Tensor& x) {
    Tensor base = Linear(x, p.weight, false);
    Tensor dropped = UnaryOp("aten::dropout", x, true, {DoubleValue(1, 0.05)});
    Tensor down = Linear(dropped, p.a, true);
    Tensor up = Linear(down, p.b, true);
    Tensor scaled = UnaryOp("aten::mul", up, true, {DoubleValue(1, 2.0)});
    return BinaryOp("aten::add", base, scaled);
  }

  Tensor RmsNorm(const Tensor& x, const Tensor& weight) {
    Tensor sq = UnaryOp("aten::pow", x, true, {IntValue(1, 2)});
    Tensor mean = UnaryOp("aten::mean", sq, true, {IntValue(1, -1)});
    Tensor eps = UnaryOp("aten::add", mean, true, {DoubleValue(1, 1e-6)});
    Tensor r = UnaryOp("aten::rsqrt", eps, true, {});
    Tensor n = BinaryOp("aten::mul", x, r);
    return BinaryOp("aten::mul", n, weight);
  }

  Tensor Block(int l, const Tensor& x) {
    const auto& p = layer_params_[static_cast<size_t>(l)];
    Tensor h = RmsNorm(x, p.norm1);
    Tensor q = Lora(p.proj[0], h);
    Tensor k = Lora(p.proj[1], h);
    Tensor v = Lora(p.proj[2], h);
    Tensor kt = UnaryOp("aten::transpose", k, true, {IntValue(1, -2), IntValue(2, -1)});
    Tensor scores = BinaryOp("aten::matmul", q, kt);
    Tensor scaled = UnaryOp("aten::div", scores, true, {DoubleValue(1, 11.3137)});
    Tensor probs = UnaryOp("aten::softmax", scaled, true, {IntValue(1, -1)});
    Tensor attn = BinaryOp("aten::matmul", probs, v);
    Tensor o = Lora(p.proj[3], attn);
    Tensor r1 = BinaryOp("aten::add", x, o);
    Tensor h2 = RmsNorm(r1, p.norm2);
    Tensor gate = Lora(p.proj[4], h2);
    Tensor up = Lora(p.proj[5], h2);
    Tensor act = UnaryOp("aten::silu", gate, true, {});
    Tensor prod = BinaryOp("aten::mul", act, up);
    Tensor down = Lora(p.proj[6], prod);
    return BinaryOp("aten::add", r1, down);
  }

  void Backward(const Tensor& loss) {
    Op("aten::ones_like", 0, {loss}, 1, {}, false);
    for (size_t i = forward_nodes_.size(); i-- > 0;) {
      ObjectId node = forward_nodes_[i];
      int64_t start = clock_ + Jitter(300, 200);
      ObjectId op = Op("MulBackward0", 0, {last_outputs_.empty() ? loss : last_outputs_[0]}, 1, {},
                       false, false, OpScope::kBackwardFunction);
      (void)op;
      // The op record above has the timing; the exec ties it to the node.
      const auto& rec = std::get<OpRecord>(out_.back());
      out_.push_back(NodeExecRecord{node, rec.op, 2, start, clock_, false});
    }
    for (auto& l : layer_params_) {
      for (auto& p : l.proj) {
        for (ObjectId acc : {p.accumulate_a, p.accumulate_b}) {
          int64_t start = clock_;
          Op("torch::autograd::AccumulateGrad", 0, {p.a}, 0, {}, false, false,
             OpScope::kBackwardFunction);
          const auto& rec = std::get<OpRecord>(out_.back());
          out_.push_back(NodeExecRecord{acc, rec.op, 2, start, clock_, false});
        }
      }
    }
  }

  void Optimizer() {
    for (auto& l : layer_params_) {
      for (auto& p : l.proj) {
        for (int which = 0; which < 2; ++which) {
          Tensor& param = which == 0 ? p.a : p.b;
          Tensor& m = which == 0 ? p.exp_avg_a : p.exp_avg_b;
          Tensor& v = which == 0 ? p.exp_avg_sq_a : p.exp_avg_sq_b;
          Tensor grad = NewTensor({16, kHidden}, 0, false, true);
          Op("aten::mul_", 0, {m}, 0, {DoubleValue(1, 0.9)}, false, true);
          ++m.version;
          Op("aten::add_", 0, {m, grad}, 0, {DoubleValue(2, 0.1)}, false, true);
          ++m.version;
          Op("aten::mul_", 0, {v}, 0, {DoubleValue(1, 0.999)}, false, true);
          ++v.version;
          Op("aten::addcmul_", 0, {v, grad, grad}, 0, {DoubleValue(3, 0.001)}, false, true);
          ++v.version;
          Tensor denom = UnaryOp("aten::sqrt", v, false, {});
          Op("aten::add_", 0, {denom}, 0, {DoubleValue(1, 1e-8)}, false, true);
          Op("aten::addcdiv_", 0, {param, m, denom}, 0, {DoubleValue(3, -1e-4)}, false, true);
          ++param.version;
        }
      }
    }
  }

  void Setup() {
    auto param = [&](std::vector<int64_t> shape, bool trained) {
      return NewTensor(std::move(shape), 0, trained, true);
    };
    params_.push_back(param({32000, kHidden}, false));
    head_ = param({32000, kHidden}, false);
    final_norm_ = param({kHidden}, false);
    for (int l = 0; l < layers_; ++l) {
      Layer layer;
      layer.norm1 = param({kHidden}, false);
      layer.norm2 = param({kHidden}, false);
      for (auto& p : layer.proj) {
        p.weight = param({kHidden, kHidden}, false);
        p.a = param({16, kHidden}, true);
        p.b = param({kHidden, 16}, true);
        p.accumulate_a = NewId();
        p.accumulate_b = NewId();
        p.exp_avg_a = param({16, kHidden}, false);
        p.exp_avg_sq_a = param({16, kHidden}, false);
        p.exp_avg_b = param({kHidden, 16}, false);
        p.exp_avg_sq_b = param({kHidden, 16}, false);
      }
      layer_params_.push_back(layer);
    }
  }

  struct Layer {
    Tensor norm1, norm2;
    LoraLinear proj[7];  // q, k, v, o, gate, up, down
  };

  int layers_;
  std::mt19937_64 rng_;
  std::vector<Record> out_;
  uint64_t ops_ = 0;
  ObjectId next_id_ = 1;
  int64_t clock_ = 1'000'000'000;
  int64_t sequence_nr_ = 0;
  uint32_t frames_ = 0;
  std::map<std::string, InternId> strings_;
  std::map<std::string, InternId> stacks_;
  std::vector<Tensor> params_;
  Tensor head_, final_norm_;
  std::vector<Layer> layer_params_;
  std::vector<ObjectId> forward_nodes_;
  std::vector<Tensor> last_outputs_;
};

struct RunResult {
  uint64_t ops = 0;
  uint64_t records = 0;
  uint64_t file_bytes = 0;
  uint64_t raw_bytes = 0;
  double seconds = 0;
  uint64_t first_step_ops = 0;
  double read_seconds = 0;
  double append_bytes_seconds = 0;  // AppendRecordBytes of every record.
  double read_bytes_seconds = 0;    // RecordBytesReader over them.
};

RunResult Run(int steps, int layers, int level, bool step_coding) {
  LoraStepGenerator generator(layers);
  std::string file;
  // A warm sink, like the kernel's page cache behind FileSink: first-touch page faults of a fresh
  // 64 MiB string are not the writer's cost.
  file.resize(64u << 20);
  file.clear();
  WriterOptions options;
  options.zstd_level = level;
  options.step_coding = step_coding;
  auto writer = TraceWriter::ToString(&file, FileInfo{"0.1.0", "2.4.1", "12.1", "bench", 1, -1,
                                                      0, 0, {"bench_format"}},
                                      options);
  RunResult result;
  using Clock = std::chrono::steady_clock;
  Clock::duration timed{};
  Clock::duration append_bytes{};
  Clock::duration read_bytes{};
  ByteBuffer queue;
  RecordBytesReader queue_reader;
  for (int step = 0; step < steps; ++step) {
    const std::vector<Record>& records = generator.Step();
    if (step == 0) result.first_step_ops = generator.ops();
    result.ops += generator.ops();
    result.records += records.size();
    auto start = Clock::now();
    for (const Record& r : records) {
      if (!writer->Append(r).ok()) std::abort();
    }
    timed += Clock::now() - start;

    queue.clear();
    start = Clock::now();
    for (const Record& r : records) AppendRecordBytes(r, queue);
    auto appended = Clock::now();
    size_t pos = 0;
    size_t read = 0;
    while (queue_reader.Next(queue.view(), &pos) != nullptr) ++read;
    read_bytes += Clock::now() - appended;
    append_bytes += appended - start;
    if (read != records.size()) std::abort();
  }
  auto start = Clock::now();
  if (!writer->Close().ok()) std::abort();
  timed += Clock::now() - start;
  result.seconds = std::chrono::duration<double>(timed).count();
  result.append_bytes_seconds = std::chrono::duration<double>(append_bytes).count();
  result.read_bytes_seconds = std::chrono::duration<double>(read_bytes).count();
  if (const char* dump = std::getenv("TORCHRR_BENCH_DUMP")) {
    FILE* f = std::fopen(dump, "wb");
    std::fwrite(file.data(), 1, file.size(), f);
    std::fclose(f);
  }
  result.file_bytes = file.size();
  result.raw_bytes = writer->raw_bytes_written();
  start = Clock::now();
  Trace check = ReadTraceBytesAll(file);
  result.read_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!check.summary.status.ok() || check.records.size() != result.records) {
    fmt::print(stderr, "bench_format: the trace does not read back: {}\n",
               check.summary.status.message());
    std::exit(1);
  }
  return result;
}

}  // namespace
}  // namespace torchrr::format

namespace torchrr::format {
namespace {

// Writes the records of a recorded trace again, step coding off then on; prints bytes per op.
int Rewrite(const std::string& path, int level) {
  Trace trace = ReadTraceFileAll(path);
  if (!trace.summary.status.ok()) {
    fmt::print(stderr, "bench_format: {}: {}\n", path, trace.summary.status.message());
    return 1;
  }
  const double ops = static_cast<double>(trace.summary.records_per_kind[Record(OpRecord{}).index()]);
  fmt::print("  {:<48}{:>10.0f} ops", path, ops);
  for (bool step_coding : {false, true}) {
    std::string file;
    WriterOptions options;
    options.zstd_level = level;
    options.step_coding = step_coding;
    auto writer = TraceWriter::ToString(&file, trace.summary.info, options);
    for (const Record& r : trace.records) {
      if (!writer->Append(r).ok()) return 1;
    }
    if (!writer->Close().ok()) return 1;
    fmt::print("  {:>10} bytes {:>6.2f} B/op (steps {})", file.size(), file.size() / ops,
               step_coding ? "on" : "off");
  }
  fmt::print("\n");
  return 0;
}

}  // namespace
}  // namespace torchrr::format

int main(int argc, char** argv) {
  int steps = 50, layers = 16, level = torchrr::format::WriterOptions{}.zstd_level;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--level") == 0) level = std::atoi(argv[i + 1]);
  }
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--trace") == 0) return torchrr::format::Rewrite(argv[i + 1], level);
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--layers") == 0) layers = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--level") == 0) level = std::atoi(argv[i + 1]);
  }
  using torchrr::format::Run;
  using torchrr::format::RunResult;
  struct Figures {
    RunResult one, all;
    double steady = 0;
  };
  // Best of three: the machine may be shared; the fastest run is the code's own speed. The runs
  // of the two codings alternate, so that a slow moment of the machine costs both alike.
  Figures f[2];
  for (int coding = 0; coding < 2; ++coding) {
    f[coding].one = Run(1, layers, level, coding == 1);
    f[coding].all = Run(steps, layers, level, coding == 1);
  }
  for (int i = 0; i < 2; ++i) {
    for (Figures& c : f) {
      // The same records, the same file: only times vary.
      auto again = Run(steps, layers, level, &c == &f[1]);
      c.all.seconds = std::min(c.all.seconds, again.seconds);
      c.all.read_seconds = std::min(c.all.read_seconds, again.read_seconds);
      c.all.append_bytes_seconds = std::min(c.all.append_bytes_seconds, again.append_bytes_seconds);
      c.all.read_bytes_seconds = std::min(c.all.read_bytes_seconds, again.read_bytes_seconds);
    }
  }
  for (Figures& c : f) {
    c.steady = static_cast<double>(c.all.file_bytes - c.one.file_bytes) /
               static_cast<double>(c.all.ops - c.one.ops);
  }
  const RunResult& all = f[1].all;
  fmt::print("bench_format: LoRA-shaped step, {} layers, {} ops/step ({} records), {} steps, "
             "zstd level {}\n",
             layers, all.first_step_ops, all.records / steps, steps, level);
  fmt::print("  {:<34}{:>14}{:>14}\n", "metric", "steps off", "steps on");
  auto row = [&](const char* name, auto value, const char* format, const char* note = "") {
    fmt::print("  {:<34}", name);
    for (const Figures& c : f) fmt::print(fmt::runtime(format), value(c));
    fmt::print("{}\n", note);
  };
  row("op records / s (millions)",
      [](const Figures& c) { return static_cast<double>(c.all.ops) / c.all.seconds / 1e6; },
      "{:>14.2f}", "   (target >= 2.00, best of 3)");
  row("records / s (millions)",
      [](const Figures& c) { return static_cast<double>(c.all.records) / c.all.seconds / 1e6; },
      "{:>14.2f}");
  row("raw FlatBuffers MB/s", [](const Figures& c) { return c.all.raw_bytes / c.all.seconds / 1e6; },
      "{:>14.1f}");
  row("file MB/s", [](const Figures& c) { return c.all.file_bytes / c.all.seconds / 1e6; },
      "{:>14.1f}");
  row("raw bytes / op",
      [](const Figures& c) { return static_cast<double>(c.all.raw_bytes) / c.all.ops; },
      "{:>14.1f}");
  row("file bytes / op, first step",
      [](const Figures& c) { return static_cast<double>(c.one.file_bytes) / c.one.ops; },
      "{:>14.2f}");
  row("file bytes / op, overall",
      [](const Figures& c) { return static_cast<double>(c.all.file_bytes) / c.all.ops; },
      "{:>14.2f}");
  row("file bytes / op, steady state", [](const Figures& c) { return c.steady; }, "{:>14.2f}",
      "   (target <= 10)");
  row("file bytes", [](const Figures& c) { return c.all.file_bytes; }, "{:>14}");
  row("read: records / s (millions)",
      [](const Figures& c) { return static_cast<double>(c.all.records) / c.all.read_seconds / 1e6; },
      "{:>14.2f}");
  row("RecordBytes append: ns / record",
      [](const Figures& c) { return c.all.append_bytes_seconds / c.all.records * 1e9; },
      "{:>14.1f}");
  row("RecordBytes read: ns / record",
      [](const Figures& c) { return c.all.read_bytes_seconds / c.all.records * 1e9; },
      "{:>14.1f}");
  return 0;
}
