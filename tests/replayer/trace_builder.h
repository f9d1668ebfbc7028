// TraceBuilder: record sequences shaped like the recorder's, written by hand in tests.
//
// It keeps the bookkeeping the recorder does (ids from one counter, interned strings and stacks,
// version counters, sequence numbers, AccumulateGrad nodes for leaves) so a test reads like the
// Python it mimics:
//
//   auto x = b.Leaf({4, 8});
//   auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
//   b.Inplace("aten::mul_", y.out, {}, b.At(12));
//   b.Backward({loss.node, y.node});
#ifndef TORCHRR_TESTS_REPLAYER_TRACE_BUILDER_H_
#define TORCHRR_TESTS_REPLAYER_TRACE_BUILDER_H_

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torchrr/format/records.h"

namespace torchrr::testing {

using format::InternId;
using format::ObjectId;
using format::Record;

inline constexpr ObjectId kOutput = ~ObjectId{0};  // SavedSpec: the op's own output.
inline constexpr format::DType kFloat32 = 6;

struct FrameSpec {
  std::string file;
  uint32_t line = 0;
  std::string function;
  bool framework = false;
  // A frame in generated code: the user's line it came from (FrameDef.origin), when given.
  std::string origin_file;
  uint32_t origin_line = 0;
  std::string origin_function;
};

struct SavedSpec {
  std::string name;
  ObjectId tensor = 0;  // kOutput: the op's output.
  bool has_hooks = false;
  bool checked = true;  // false: kept where PyTorch checks nothing (a ctx attribute, "ctx.w").
};

struct Forwarded {
  ObjectId out = 0;
  ObjectId op = 0;
  ObjectId node = 0;
};

struct OpSpec {
  std::string name;
  std::vector<ObjectId> inputs;
  std::vector<ObjectId> outputs;
  std::vector<ObjectId> writes;              // Tensors this op bumps, once each.
  std::map<ObjectId, uint32_t> started_at;   // Enclosing ops: a tensor's version at the start.
  ObjectId id = 0;                           // 0: a new id.
  ObjectId parent = 0;
  format::OpScope scope = format::OpScope::kFunction;
  InternId stack = 0;
  int64_t sequence_nr = -1;
  uint32_t thread = 1;
  bool grad_mode = true;
  bool threw = false;
  int64_t start_ns = 0;                      // 0: it starts when it ends, on a fresh tick.
};

class TraceBuilder {
 public:
  std::vector<Record> records;
  // Give storages addresses (as --verify-saved traces have them): new storages get distinct ones.
  bool addresses = false;
  // The thread Forward() and InplaceForward() run on, and their nodes' forward thread.
  uint32_t forward_thread = 1;

  ObjectId NewId() { return ++next_id_; }

  InternId Str(const std::string& text) {
    auto [it, inserted] = strings_.try_emplace(text, static_cast<InternId>(strings_.size() + 1));
    if (inserted) records.push_back(format::StringDef{it->second, text});
    return it->second;
  }

  // A stack, innermost frame first.
  InternId Stack(const std::vector<FrameSpec>& frames) {
    format::StackDef stack;
    stack.id = ++next_stack_;
    for (const FrameSpec& f : frames) {
      format::FrameDef frame;
      if (!f.origin_file.empty()) {
        format::FrameDef origin;
        origin.id = ++next_frame_;
        origin.kind = format::FrameKind::kPython;
        origin.function = Str(f.origin_function);
        origin.file = Str(f.origin_file);
        origin.line = f.origin_line;
        records.push_back(origin);
        frame.origin = origin.id;
      }
      frame.id = ++next_frame_;
      frame.kind = format::FrameKind::kPython;
      frame.function = Str(f.function);
      frame.file = Str(f.file);
      frame.line = f.line;
      frame.framework = f.framework;
      records.push_back(frame);
      stack.frames.push_back(frame.id);
    }
    records.push_back(stack);
    return stack.id;
  }

  // The usual stack of a call from the training script: torch's frame, then train.py:line.
  InternId At(uint32_t line, const std::string& file = "train.py",
              const std::string& function = "forward") {
    return Stack({{"torch/_tensor.py", 40, "wrapped", true}, {file, line, function, false}});
  }

  format::TensorInfo& Info(ObjectId tensor) { return tensors_.at(tensor); }
  uint32_t Version(ObjectId tensor) { return versions_[Info(tensor).version_counter]; }

  // A new tensor with its own storage and counter; TensorInfo written.
  ObjectId Tensor(std::vector<int64_t> shape, bool requires_grad = false, ObjectId grad_fn = 0,
                  uint32_t output_nr = 0) {
    format::TensorInfo t;
    t.tensor = NewId();
    t.storage = NewId();
    t.version_counter = NewId();
    t.dtype = kFloat32;
    t.shape = shape;
    t.strides = Contiguous(shape);
    t.requires_grad = requires_grad || grad_fn != 0;
    t.is_leaf = grad_fn == 0;
    t.grad_fn = grad_fn;
    t.output_nr = output_nr;
    t.storage_nbytes = 4 * Numel(shape);
    if (addresses) t.storage_address = 0x100000 * t.storage;
    Emit(t);
    return t.tensor;
  }

  // torch::from_blob(base.data_ptr(), ...) or a DLPack alias: another storage and counter over the
  // same memory.
  ObjectId Alias(ObjectId base) {
    format::TensorInfo t = Detached(base);
    t.storage = NewId();
    Emit(t);
    return t.tensor;
  }

  ObjectId Leaf(std::vector<int64_t> shape) { return Tensor(std::move(shape), true); }

  // A view of `base`: same storage and counter.
  ObjectId View(ObjectId base, std::vector<int64_t> shape, std::vector<int64_t> strides,
                int64_t storage_offset) {
    format::TensorInfo t = Info(base);
    t.tensor = NewId();
    t.shape = std::move(shape);
    t.strides = std::move(strides);
    t.storage_offset = storage_offset;
    Emit(t);
    return t.tensor;
  }

  // `base.data`: same storage, a fresh counter, no autograd history.
  ObjectId Data(ObjectId base) {
    format::TensorInfo t = Detached(base);
    Emit(t);
    return t.tensor;
  }

  // A wrapper subclass over `inner` (a DTensor over its shard): a leaf that requires grad, with a
  // storage of no bytes and a counter of its own, naming `inner` (TensorInfo.inner).
  ObjectId Wrapper(ObjectId inner) {
    format::TensorInfo t = Info(inner);
    t.tensor = NewId();
    t.storage = NewId();
    t.version_counter = NewId();
    t.storage_nbytes = 0;
    t.requires_grad = true;
    t.is_leaf = true;
    t.grad_fn = 0;
    t.inner = inner;
    Emit(t);
    return t.tensor;
  }

  // One OpRecord; versions from the builder's counters.
  ObjectId Op(OpSpec spec) {
    format::OpRecord op;
    op.op = spec.id != 0 ? spec.id : NewId();
    op.name = Str(spec.name);
    op.parent = spec.parent;
    op.thread = spec.thread;
    op.scope = spec.scope;
    op.sequence_nr = spec.sequence_nr;
    op.start_ns = op.end_ns = ++clock_;
    if (spec.start_ns != 0) op.start_ns = spec.start_ns;
    op.stack = spec.stack;
    op.threw = spec.threw;
    op.grad_mode = spec.grad_mode;
    std::map<ObjectId, uint32_t> before;
    auto all = spec.inputs;
    all.insert(all.end(), spec.outputs.begin(), spec.outputs.end());
    for (ObjectId t : all) {
      auto it = spec.started_at.find(t);
      before[t] = it != spec.started_at.end() ? it->second : Version(t);
    }
    for (ObjectId t : spec.writes) ++versions_[Info(t).version_counter];
    auto use = [&](ObjectId t, uint16_t position) {
      return format::TensorUse{t, before[t], Version(t), position};
    };
    for (size_t i = 0; i < spec.inputs.size(); ++i) op.inputs.push_back(use(spec.inputs[i], i));
    for (size_t i = 0; i < spec.outputs.size(); ++i) op.outputs.push_back(use(spec.outputs[i], i));
    records.push_back(op);
    ops_[op.op] = op;
    return op.op;
  }

  // An out-of-place forward op under autograd: output tensor, op, node (saving `saved`).
  Forwarded Forward(const std::string& op_name, const std::string& node_name,
                    const std::vector<ObjectId>& inputs, const std::vector<SavedSpec>& saved,
                    InternId stack, std::vector<int64_t> out_shape = {}) {
    Forwarded f;
    f.node = NewId();
    if (out_shape.empty()) out_shape = Info(inputs.at(0)).shape;
    f.out = Tensor(out_shape, true, f.node);
    int64_t seq = sequence_nr_++;
    f.op = Op({.name = op_name, .inputs = inputs, .outputs = {f.out}, .stack = stack,
               .sequence_nr = seq, .thread = forward_thread});
    EmitNode(f.node, node_name, seq, f.op, EdgesTo(inputs), saved, f.out);
    return f;
  }

  // A Python Function's apply whose forward ran the ops `inner` (their parent set to the apply):
  // their records, then the node it made (`<name>Backward`, saving `saved`), then the apply's op,
  // in the recorder's order.
  Forwarded FunctionApply(const std::string& name, const std::vector<ObjectId>& inputs,
                          const std::vector<SavedSpec>& saved, InternId stack,
                          std::vector<OpSpec> inner) {
    Forwarded f;
    f.node = NewId();
    f.op = NewId();
    f.out = Tensor(Info(inputs.at(0)).shape, true, f.node);
    int64_t seq = sequence_nr_++;
    for (OpSpec& spec : inner) {
      spec.parent = f.op;
      Op(std::move(spec));
    }
    EmitNode(f.node, name + "Backward", seq, f.op, EdgesTo(inputs), saved, f.out);
    Op({.name = name, .inputs = inputs, .outputs = {f.out}, .id = f.op, .stack = stack,
        .sequence_nr = seq, .thread = forward_thread});
    return f;
  }

  // An in-place op under autograd on `target` (gets a new grad_fn, as PyTorch rebases history).
  Forwarded InplaceForward(const std::string& op_name, const std::string& node_name,
                           ObjectId target, const std::vector<ObjectId>& others, InternId stack,
                           const std::vector<SavedSpec>& saved = {}) {
    Forwarded f;
    f.node = NewId();
    f.out = target;
    std::vector<ObjectId> inputs{target};
    inputs.insert(inputs.end(), others.begin(), others.end());
    auto edges = EdgesTo(inputs);
    int64_t seq = sequence_nr_++;
    f.op = Op({.name = op_name, .inputs = inputs, .outputs = {target}, .writes = {target},
               .stack = stack, .sequence_nr = seq, .thread = forward_thread});
    format::TensorInfo& t = Info(target);
    t.grad_fn = f.node;
    t.output_nr = 0;
    t.is_leaf = false;
    t.requires_grad = true;
    records.push_back(t);
    EmitNode(f.node, node_name, seq, f.op, edges, saved, target);
    return f;
  }

  // An in-place op autograd does not track (no_grad, or a tensor that needs no grad).
  ObjectId Inplace(const std::string& op_name, ObjectId target, const std::vector<ObjectId>& others,
                   InternId stack, bool grad_mode = true) {
    std::vector<ObjectId> inputs{target};
    inputs.insert(inputs.end(), others.begin(), others.end());
    return Op({.name = op_name, .inputs = inputs, .outputs = {target}, .writes = {target},
               .stack = stack, .grad_mode = grad_mode});
  }

  // Runs nodes in backward, in the given order; `threw`: the node whose execution throws
  // (with PyTorch's message as a C++ error of that op, when given).
  void Backward(const std::vector<ObjectId>& nodes, ObjectId threw = 0,
                const std::string& message = "", uint32_t thread = 1) {
    for (ObjectId node : nodes) {
      bool throws = node == threw;
      for (auto& r : before_exec_[node]) records.push_back(std::move(r));
      before_exec_.erase(node);
      ObjectId op = Op({.name = node_names_.at(node), .scope = format::OpScope::kBackwardFunction,
                        .sequence_nr = node_seq_.at(node), .thread = thread, .threw = throws});
      format::NodeExecRecord exec;
      exec.node = node;
      exec.op = op;
      exec.thread = thread;
      exec.threw = throws;
      records.push_back(exec);
      if (throws) {
        if (!message.empty()) {
          format::ErrorRecord error;
          error.kind = format::ErrorKind::kCppException;
          error.op = op;
          error.thread = thread;
          error.type = Str("c10::Error");
          error.message = message;
          records.push_back(error);
        }
        return;
      }
    }
  }

  // Runs `node` in backward with an op inside its backward function for each tensor of `reads`,
  // taking it as input (a Python Function's backward, whose ops are recorded).
  void BackwardReading(ObjectId node, const std::vector<ObjectId>& reads, uint32_t thread = 1) {
    for (auto& r : before_exec_[node]) records.push_back(std::move(r));
    before_exec_.erase(node);
    const ObjectId op = NewId();
    for (ObjectId t : reads) {
      Op({.name = "aten::mul", .inputs = {t}, .parent = op, .thread = thread, .grad_mode = false});
    }
    Op({.name = node_names_.at(node), .id = op, .scope = format::OpScope::kBackwardFunction,
        .sequence_nr = node_seq_.at(node), .thread = thread});
    format::NodeExecRecord exec;
    exec.node = node;
    exec.op = op;
    exec.thread = thread;
    records.push_back(exec);
  }

  // --verify-saved's fingerprint of node's saved `name`: at save, written now; at use, written
  // just before the node's next execution (as the recorder does, at the backward op's start).
  void FingerprintAtSave(ObjectId node, const std::string& name, uint64_t hash) {
    records.push_back(MakeFingerprint(node, name, format::FingerprintWhen::kAtSave, hash));
  }
  void FingerprintAtUse(ObjectId node, const std::string& name, uint64_t hash) {
    before_exec_[node].push_back(MakeFingerprint(node, name, format::FingerprintWhen::kAtUse, hash));
  }
  int64_t Now() { return ++clock_; }

  // torch._C._autograd._unsafe_set_version_counter: not an op, so nothing is recorded.
  void SetVersion(ObjectId tensor, uint32_t version) {
    versions_[Info(tensor).version_counter] = version;
  }

  void PythonError(const std::string& message) {
    format::ErrorRecord error;
    error.kind = format::ErrorKind::kPythonException;
    error.type = Str("RuntimeError");
    error.message = message;
    records.push_back(error);
  }

  ObjectId AccumulateGradOf(ObjectId leaf) {
    auto it = accumulate_.find(leaf);
    if (it != accumulate_.end()) return it->second;
    ObjectId node = NewId();
    accumulate_[leaf] = node;
    format::NodeRecord r;
    r.node = node;
    r.name = Str("torch::autograd::AccumulateGrad");
    r.sequence_nr = INT64_MAX;
    r.variable = leaf;
    r.saved_kind = format::SavedSetKind::kNone;
    records.push_back(r);
    node_names_[node] = "torch::autograd::AccumulateGrad";
    node_seq_[node] = INT64_MAX;
    return node;
  }

 private:
  // A new tensor over `base`'s bytes with a fresh counter and no autograd history (not emitted).
  format::TensorInfo Detached(ObjectId base) {
    format::TensorInfo t = Info(base);
    t.tensor = NewId();
    t.version_counter = NewId();
    t.requires_grad = false;
    t.is_leaf = true;
    t.grad_fn = 0;
    return t;
  }

  format::FingerprintRecord MakeFingerprint(ObjectId node, const std::string& name,
                                            format::FingerprintWhen when, uint64_t hash) {
    format::FingerprintRecord r;
    r.node = node;
    r.saved_name = Str(name);
    r.when = when;
    r.hash = hash;
    r.time_ns = ++clock_;
    return r;
  }

  std::map<ObjectId, std::vector<Record>> before_exec_;

  static std::vector<int64_t> Contiguous(const std::vector<int64_t>& shape) {
    std::vector<int64_t> strides(shape.size(), 1);
    for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
    return strides;
  }
  static int64_t Numel(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }

  void Emit(const format::TensorInfo& t) {
    tensors_[t.tensor] = t;
    versions_.try_emplace(t.version_counter, 0);
    records.push_back(t);
  }

  std::vector<format::Edge> EdgesTo(const std::vector<ObjectId>& inputs) {
    std::vector<format::Edge> edges;
    for (ObjectId t : inputs) {
      const format::TensorInfo& info = Info(t);
      if (info.grad_fn != 0) {
        edges.push_back({info.grad_fn, info.output_nr});
      } else if (info.requires_grad) {
        edges.push_back({AccumulateGradOf(t), 0});
      } else {
        edges.push_back({0, 0});
      }
    }
    return edges;
  }

  void EmitNode(ObjectId id, const std::string& name, int64_t seq, ObjectId created_by,
                std::vector<format::Edge> edges, const std::vector<SavedSpec>& saved,
                ObjectId output) {
    format::NodeRecord r;
    r.node = id;
    r.name = Str(name);
    r.forward_thread = forward_thread;
    r.sequence_nr = seq;
    r.created_by = created_by;
    r.saved_kind = saved.empty() ? format::SavedSetKind::kNone : format::SavedSetKind::kExact;
    r.edges = std::move(edges);
    for (const SavedSpec& s : saved) {
      ObjectId tensor = s.tensor == kOutput ? output : s.tensor;
      const format::TensorInfo& info = Info(tensor);
      format::SavedTensor st;
      st.name = Str(s.name);
      st.tensor = tensor;
      st.storage = info.storage;
      st.version_counter = info.version_counter;
      st.saved_version = Version(tensor);
      st.is_output = s.tensor == kOutput;
      st.has_hooks = s.has_hooks;
      st.checked = s.checked && !s.has_hooks;
      st.is_leaf = info.is_leaf && !st.is_output;
      st.output_nr = st.is_output ? 0 : info.output_nr;
      if (st.has_hooks) {
        // What a pack hook keeps is not a tensor the recorder can name.
        st.tensor = st.storage = st.version_counter = 0;
      }
      r.saved.push_back(st);
    }
    records.push_back(r);
    node_names_[id] = name;
    node_seq_[id] = seq;
  }

  ObjectId next_id_ = 0;
  InternId next_stack_ = 0;
  InternId next_frame_ = 0;
  int64_t clock_ = 0;
  int64_t sequence_nr_ = 0;
  std::map<std::string, InternId> strings_;
  std::map<ObjectId, format::TensorInfo> tensors_;
  std::map<ObjectId, uint32_t> versions_;  // By version counter.
  std::map<ObjectId, format::OpRecord> ops_;
  std::map<ObjectId, ObjectId> accumulate_;
  std::map<ObjectId, std::string> node_names_;
  std::map<ObjectId, int64_t> node_seq_;
};

// The user line of a culprit or victim (a replayer::OpRef), 0 when there is none. A template:
// this header is also built without the replayer (make_golden).
template <typename OpRef>
uint32_t Line(const std::optional<OpRef>& op) {
  return op && op->user_frame ? op->user_frame->line : 0;
}

}  // namespace torchrr::testing

#endif  // TORCHRR_TESTS_REPLAYER_TRACE_BUILDER_H_
