// The recorder on small programs whose truth is known. Where the truth is autograd's (what a node
// saved), the test asks autograd itself: a tensor the trace says was saved makes backward raise
// when modified, and one it says was not saved does not.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "torchrr/format/reader.h"
#include "torchrr/kernels/fingerprint.h"
#include "torchrr/recorder.h"
#include "capture/object_ids.h"
#include "stacks/python_stacks.h"

namespace torchrr {
namespace {

namespace fs = std::filesystem;
using format::NodeRecord;
using format::OpRecord;

std::string TempTrace(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("torchrr_recorder_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  return (dir / (name + ".trr")).string();
}

// A trace read back, with its records indexed the way the tests ask about them.
struct Indexed {
  format::Trace trace;
  std::map<format::InternId, std::string> strings;
  std::map<format::ObjectId, format::TensorInfo> tensors;  // Latest metadata.
  std::vector<OpRecord> ops;
  std::map<format::ObjectId, NodeRecord> nodes;
  std::vector<format::NodeExecRecord> execs;
  std::vector<format::ErrorRecord> errors;
  std::vector<format::FingerprintRecord> fingerprints;

  explicit Indexed(const std::string& path) : trace(format::ReadTraceFileAll(path)) {
    for (const auto& record : trace.records) {
      if (auto* s = std::get_if<format::StringDef>(&record)) strings[s->id] = s->text;
      if (auto* t = std::get_if<format::TensorInfo>(&record)) tensors[t->tensor] = *t;
      if (auto* o = std::get_if<OpRecord>(&record)) ops.push_back(*o);
      if (auto* n = std::get_if<NodeRecord>(&record)) nodes[n->node] = *n;
      if (auto* e = std::get_if<format::NodeExecRecord>(&record)) execs.push_back(*e);
      if (auto* e = std::get_if<format::ErrorRecord>(&record)) errors.push_back(*e);
      if (auto* f = std::get_if<format::FingerprintRecord>(&record)) fingerprints.push_back(*f);
    }
  }
  std::string Name(format::InternId id) const {
    auto it = strings.find(id);
    return it == strings.end() ? "" : it->second;
  }
  // Custom Functions' nodes (what ctx->save_for_backward() saved).
  std::vector<NodeRecord> CustomNodes() const {
    std::vector<NodeRecord> out;
    for (const auto& [id, node] : nodes) {
      if (node.saved_kind == format::SavedSetKind::kCustom) out.push_back(node);
    }
    return out;
  }
  // Top-level ops of that name (the ones the program called, not those they ran inside).
  std::vector<OpRecord> OpsNamed(const std::string& name) const {
    std::vector<OpRecord> out;
    for (const auto& op : ops) {
      if (Name(op.name) == name && op.parent == 0) out.push_back(op);
    }
    return out;
  }
  std::vector<NodeRecord> NodesNamed(const std::string& name) const {
    std::vector<NodeRecord> out;
    for (const auto& [id, node] : nodes) {
      if (Name(node.name) == name) out.push_back(node);
    }
    return out;
  }
  format::ObjectId CounterOf(format::ObjectId tensor) const {
    return tensors.at(tensor).version_counter;
  }
};

// SPEC.md's order on the records as written: every string, stack and tensor an op names is
// defined before it. Returns what breaks it (the first few).
std::vector<std::string> OrderProblems(const format::Trace& trace) {
  std::set<uint64_t> strings{0}, stacks{0}, described{0};
  std::vector<std::string> problems;
  auto need = [&](const std::set<uint64_t>& defined, uint64_t id, const char* what,
                  const OpRecord& op) {
    if (defined.count(id) == 0 && problems.size() < 5) {
      problems.push_back("op " + std::to_string(op.op) + " names " + what + " " +
                         std::to_string(id) + " before its definition");
    }
  };
  for (const auto& record : trace.records) {
    if (auto* s = std::get_if<format::StringDef>(&record)) strings.insert(s->id);
    if (auto* s = std::get_if<format::StackDef>(&record)) stacks.insert(s->id);
    if (auto* t = std::get_if<format::TensorInfo>(&record)) described.insert(t->tensor);
    auto* op = std::get_if<OpRecord>(&record);
    if (op == nullptr) continue;
    need(strings, op->name, "string", *op);
    need(strings, op->overload, "string", *op);
    need(stacks, op->stack, "stack", *op);
    for (const auto& use : op->inputs) need(described, use.tensor, "tensor", *op);
    for (const auto& use : op->outputs) need(described, use.tensor, "tensor", *op);
  }
  return problems;
}

// Which Python stack walker each CPython takes (python_stacks.h): the frame structs are read
// directly on 3.11 only; 3.10 (no Py_Version), 3.12 and 3.13 take the API walk.
TEST(PythonStacks, WalkerPerPythonVersion) {
  using recorder::PythonStackWalkerFor;
  EXPECT_STREQ(PythonStackWalkerFor(0, false, false), "api");            // 3.10.
  EXPECT_STREQ(PythonStackWalkerFor(0x030b07f0, true, false), "frames");  // 3.11.7.
  EXPECT_STREQ(PythonStackWalkerFor(0x030b07f0, true, true), "api");  // TORCHRR_PYTHON_WALKER=api
  EXPECT_STREQ(PythonStackWalkerFor(0x030b07f0, false, false), "api");
  EXPECT_STREQ(PythonStackWalkerFor(0x030c01f0, true, false), "api");    // 3.12.1.
  EXPECT_STREQ(PythonStackWalkerFor(0x030d00f0, true, false), "api");    // 3.13.0.
}

// The origins of a torch.fx module's lines, from the comments torch.fx writes above them (the
// shape of torch 2.15's graph.py: annotations before "File:", the backward graph's prefix, "No
// stacktrace found", a path holding ':' and " in ").
TEST(PythonStacks, GeneratedLineOrigins) {
  const char* source =
      "\n"
      "\n"
      "def forward(self, L_x_ : torch.Tensor):\n"            // 3
      "    l_x_ = L_x_\n"                                    // 4: before any comment
      "    \n"
      "     # File: /home/a b/train.py:68 in forward, code: h = x.relu_()\n"
      "    relu_ = l_x_.relu_();  l_x_ = None\n"            // 7
      "    \n"
      "     # File: /w/x:1 in y/t.py:12 in mlp.forward, code: return h * 2\n"
      "    mul = relu_ * 2\n"                                // 10
      "    sum_1 = mul.sum()\n"                              // 11
      "     # No stacktrace found for following nodes\n"
      "    _ = torch.ops.aten.detach.default(mul)\n"         // 13
      "     # seq_nr: 5 # ac_graph_id: 1 Backward of forward node: File: t.py:3 in f, code: y\n"
      "    mul_1 = sum_1 * 3\n"                              // 15
      "     # other annotation\n"
      "    return (mul_1,)\n";                               // 17
  std::vector<recorder::PythonLineOrigin> origins = recorder::GeneratedLineOrigins(source);
  std::vector<std::tuple<int32_t, std::string, int32_t, std::string>> got;
  for (const auto& o : origins) got.emplace_back(o.line, o.file, o.origin_line, o.function);
  using T = std::tuple<int32_t, std::string, int32_t, std::string>;
  EXPECT_EQ(got, (std::vector<T>{T{7, "/home/a b/train.py", 68, "forward"},
                                 T{10, "/w/x:1 in y/t.py", 12, "mlp.forward"},
                                 T{11, "/w/x:1 in y/t.py", 12, "mlp.forward"},
                                 T{15, "t.py", 3, "f"}, T{17, "t.py", 3, "f"}}));
  ASSERT_NE(recorder::OriginOfLine(origins, 11), nullptr);
  EXPECT_EQ(recorder::OriginOfLine(origins, 11)->origin_line, 12);
  EXPECT_EQ(recorder::OriginOfLine(origins, 13), nullptr);
  EXPECT_EQ(recorder::OriginOfLine(origins, 4), nullptr);
  EXPECT_TRUE(recorder::GeneratedLineOrigins("").empty());
  EXPECT_TRUE(recorder::GeneratedLineOrigins("# File: nothing here\nx = 1\n").empty());
}

// The frames of a graph node's traceback as torch.fx keeps it (node.meta["stack_trace"]).
TEST(PythonStacks, TracebackFrames) {
  const char* trace =
      "  File \"/home/a/train.py\", line 189, in train\n"
      "    logits = model(input_ids=input_ids).logits\n"
      "  File \"/x/site-packages/transformers/models/llama/modeling_llama.py\", line 12, in "
      "forward\n"
      "    return self.mlp(x)\n"
      "  File \"/home/a/odd\", line 3, in x.py\", line 68, in mlp_forward\n"
      "    act.mul_(gate)\n"
      "  File \"<frozen x>\", line nope, in f\n";
  std::vector<std::tuple<std::string, int32_t, std::string>> got;
  for (const auto& f : recorder::TracebackFrames(trace)) {
    got.emplace_back(f.file, f.origin_line, f.function);
  }
  using T = std::tuple<std::string, int32_t, std::string>;
  EXPECT_EQ(got, (std::vector<T>{
                     T{"/home/a/train.py", 189, "train"},
                     T{"/x/site-packages/transformers/models/llama/modeling_llama.py", 12,
                       "forward"},
                     T{"/home/a/odd\", line 3, in x.py", 68, "mlp_forward"}}));
  EXPECT_TRUE(recorder::TracebackFrames("").empty());
  EXPECT_TRUE(recorder::TracebackFrames("no frames here\n").empty());
}

TEST(Recorder, SigmoidSavesItsOutputAndMulInPlaceBumpsIt) {
  std::string path = TempTrace("sigmoid");
  auto x = torch::randn({4, 8}, torch::requires_grad());
  torch::Tensor y;
  {
    RecorderOptions options;
    options.path = path;
    Recorder recorder(options);
    ASSERT_TRUE(recorder.recording());
    y = torch::sigmoid(x);
    y.mul_(2);
  }
  // Autograd agrees the output was saved: backward now raises.
  EXPECT_THROW(y.sum().backward(), c10::Error);

  Indexed trace(path);
  ASSERT_TRUE(trace.trace.summary.status.ok()) << trace.trace.summary.status.message();
  auto sigmoid = trace.OpsNamed("aten::sigmoid");
  ASSERT_EQ(sigmoid.size(), 1u);
  ASSERT_EQ(sigmoid[0].outputs.size(), 1u);
  auto nodes = trace.NodesNamed("SigmoidBackward0");
  ASSERT_EQ(nodes.size(), 1u);
  const NodeRecord& node = nodes[0];
  EXPECT_EQ(node.created_by, sigmoid[0].op);
  EXPECT_EQ(node.saved_kind, format::SavedSetKind::kExact);
  ASSERT_EQ(node.saved.size(), 1u);
  EXPECT_EQ(trace.Name(node.saved[0].name), "result");
  EXPECT_TRUE(node.saved[0].is_output);
  EXPECT_EQ(node.saved[0].saved_version, 0u);
  EXPECT_EQ(node.saved[0].tensor, sigmoid[0].outputs[0].tensor);
  EXPECT_EQ(node.saved[0].version_counter, trace.CounterOf(sigmoid[0].outputs[0].tensor));
  // Its edge goes to the AccumulateGrad of the leaf x.
  ASSERT_EQ(node.edges.size(), 1u);
  const NodeRecord& accumulate = trace.nodes.at(node.edges[0].node);
  EXPECT_EQ(trace.Name(accumulate.name), "torch::autograd::AccumulateGrad");
  EXPECT_EQ(accumulate.variable, sigmoid[0].inputs[0].tensor);

  auto mul = trace.OpsNamed("aten::mul_");
  ASSERT_EQ(mul.size(), 1u);
  ASSERT_EQ(mul[0].inputs.size(), 1u);
  EXPECT_EQ(mul[0].inputs[0].tensor, sigmoid[0].outputs[0].tensor);
  EXPECT_EQ(mul[0].inputs[0].version_before, 0u);
  EXPECT_EQ(mul[0].inputs[0].version_after, 1u);
  EXPECT_NE(mul[0].stack, 0u);
}

TEST(Recorder, SavedSetsMatchAutograd) {
  std::string path = TempTrace("saved_sets");
  auto leaf = torch::randn({3, 5}, torch::requires_grad());
  auto frozen = torch::randn({5, 2});  // A frozen weight: requires_grad false.
  torch::Tensor a, b, x, mm, sum;
  {
    RecorderOptions options;
    options.path = path;
    Recorder recorder(options);
    x = leaf * 1;                 // A non-leaf input.
    mm = torch::mm(x, frozen);    // Saves the weight only (x's gradient needs it).
    a = leaf + 1;
    sum = a + x;                  // add saves nothing.
  }
  Indexed trace(path);
  auto mm_nodes = trace.NodesNamed("MmBackward0");
  ASSERT_EQ(mm_nodes.size(), 1u);
  std::set<std::string> defined;
  for (const auto& s : mm_nodes[0].saved) {
    if (s.defined) defined.insert(trace.Name(s.name));
  }
  EXPECT_EQ(defined, std::set<std::string>({"mat2"}));
  auto add_nodes = trace.NodesNamed("AddBackward0");
  ASSERT_FALSE(add_nodes.empty());
  for (const auto& node : add_nodes) {
    for (const auto& s : node.saved) EXPECT_FALSE(s.defined);
  }

  // Autograd's own verdicts: modifying the input mm did not save is fine...
  x.add_(1);
  EXPECT_NO_THROW(mm.sum().backward(/*gradient=*/{}, /*retain_graph=*/true));
  // ...modifying the weight it saved is not.
  frozen.add_(1);
  EXPECT_THROW(mm.sum().backward(), c10::Error);
  // add saved nothing: its inputs may change.
  EXPECT_NO_THROW(sum.sum().backward());
}

TEST(Recorder, VersionCountersFollowAutograd) {
  std::string path = TempTrace("counters");
  torch::Tensor base, view, detached, data;
  {
    RecorderOptions options;
    options.path = path;
    Recorder recorder(options);
    base = torch::zeros({4, 4});
    base.add_(1);
    base.add_(1);
    view = base.select(0, 1);
    view.mul_(3);
    detached = base.detach();
    detached.add_(1);
    data = base.variable_data();  // What Python's .data gives: a fresh counter.
    data.add_(1);
  }
  Indexed trace(path);
  auto adds = trace.OpsNamed("aten::add_");
  ASSERT_EQ(adds.size(), 4u);
  EXPECT_EQ(adds[0].inputs[0].version_before, 0u);
  EXPECT_EQ(adds[0].inputs[0].version_after, 1u);
  EXPECT_EQ(adds[1].inputs[0].version_before, 1u);
  EXPECT_EQ(adds[1].inputs[0].version_after, 2u);
  auto base_id = adds[0].inputs[0].tensor;
  auto select = trace.OpsNamed("aten::select");
  ASSERT_EQ(select.size(), 1u);
  auto view_id = select[0].outputs[0].tensor;
  EXPECT_NE(view_id, base_id);
  EXPECT_EQ(trace.CounterOf(view_id), trace.CounterOf(base_id));       // Views share.
  EXPECT_EQ(trace.OpsNamed("aten::mul_")[0].inputs[0].version_after, 3u);
  auto detached_id = adds[2].inputs[0].tensor;
  EXPECT_EQ(trace.CounterOf(detached_id), trace.CounterOf(base_id));   // detach() shares.
  EXPECT_EQ(adds[2].inputs[0].version_after, 4u);
  auto data_id = adds[3].inputs[0].tensor;
  EXPECT_NE(trace.CounterOf(data_id), trace.CounterOf(base_id));       // .data does not...
  EXPECT_EQ(trace.tensors.at(data_id).storage, trace.tensors.at(base_id).storage);  // ...but
  EXPECT_EQ(adds[3].inputs[0].version_after, 1u);                     // shares the storage.
  EXPECT_EQ(base._version(), 4);
}

// Records what `body` runs (without C++ stacks) into the trace `name` and returns its path.
template <typename Body>
std::string RecordWithoutStacks(const std::string& name, Body&& body) {
  std::string path = TempTrace(name);
  RecorderOptions options;
  options.path = path;
  options.native_stacks = false;
  Recorder recorder(options);
  body();
  return path;
}

TEST(Recorder, TensorIdsNeverAliasReusedMemory) {
  std::string path = RecordWithoutStacks("ids", [] {
    // Freed at once: its memory is reused by the next one. More than the tensor table's
    // recheck distance and its first sweep, so that dead entries are removed on both paths.
    for (int i = 0; i < 3000; ++i) {
      auto t = torch::ones({16});
      (void)t;
    }
  });
  Indexed trace(path);
  std::set<format::ObjectId> ids;
  for (const auto& op : trace.OpsNamed("aten::ones")) ids.insert(op.outputs.at(0).tensor);
  EXPECT_EQ(ids.size(), 3000u);
}

// A storage's id comes back for a later storage at its address once it died (the storage table
// keeps nothing allocated), never while it lives: a saved tensor's storage, alive from the save to
// its node's run, shares its id with no other storage, and storages alive together have distinct
// ids.
TEST(Recorder, AStorageIdIsNoOtherStoragesWhileItLives) {
  auto x = torch::randn({16}, torch::requires_grad());
  std::vector<torch::Tensor> kept;
  std::string path = RecordWithoutStacks("storage_ids", [&] {
    auto y = x.sigmoid();  // Saves its output.
    for (int i = 0; i < 3000; ++i) {
      auto t = torch::ones({16});  // Freed at once: its storage's address comes back.
      (void)t;
      if (i % 10 == 0) kept.push_back(torch::zeros({16}));
    }
    y.sum().backward();
  });
  Indexed trace(path);
  auto storage_of = [&](const OpRecord& op) {
    return trace.tensors.at(op.outputs.at(0).tensor).storage;
  };
  const std::vector<OpRecord> sigmoid = trace.OpsNamed("aten::sigmoid");
  ASSERT_EQ(sigmoid.size(), 1u);
  const format::ObjectId saved = storage_of(sigmoid[0]);
  ASSERT_NE(saved, 0u);
  std::set<format::ObjectId> freed, live;
  for (const auto& op : trace.OpsNamed("aten::ones")) freed.insert(storage_of(op));
  for (const auto& op : trace.OpsNamed("aten::zeros")) live.insert(storage_of(op));
  EXPECT_EQ(freed.count(saved), 0u);
  EXPECT_EQ(live.count(saved), 0u);
  EXPECT_EQ(live.size(), 300u);
  EXPECT_LT(freed.size(), 3000u);  // Addresses came back, with their ids.
}

// A saved tensor's storage id is never given to another storage, even once the node is gone
// without running (the replayer watches the storage until the node runs: one that never runs stays
// watched, and a storage given its id would land in that watch).
TEST(Recorder, ASavedStoragesIdIsNeverGivenAgain) {
  auto x = torch::randn({16}, torch::requires_grad());
  std::string path = RecordWithoutStacks("saved_storage_ids", [&] {
    for (int i = 0; i < 2000; ++i) {
      auto y = x.sigmoid();  // Saves its output; the graph is freed without a backward.
      (void)y;
    }
  });
  Indexed trace(path);
  std::set<format::ObjectId> saved;
  size_t sigmoids = 0;
  for (const auto& op : trace.OpsNamed("aten::sigmoid")) {
    ++sigmoids;
    saved.insert(trace.tensors.at(op.outputs.at(0).tensor).storage);
  }
  EXPECT_EQ(sigmoids, 2000u);
  EXPECT_EQ(saved.size(), 2000u);
}

TEST(Recorder, ATensorThatChangesStorageNamesEachOne) {
  std::vector<torch::Tensor> storages_kept;
  std::string path = RecordWithoutStacks("set_storage", [&] {
    torch::Tensor t = torch::zeros({4});
    // Each set_ moves t to a new storage; the old ones are kept alive, so each is a different
    // storage with its own id (a freed one's id may come back: AStorageIdIsNoOtherStoragesWhileItLives).
    for (int i = 0; i < 300; ++i) {
      storages_kept.push_back(torch::full({4}, static_cast<double>(i)));
      t.set_(storages_kept.back());
      t.add_(1);
    }
  });
  Indexed trace(path);
  std::map<format::ObjectId, format::ObjectId> storage_of;  // Tensor -> storage, as last written.
  std::set<format::ObjectId> tensors, storages;
  int adds = 0;
  for (const auto& record : trace.trace.records) {
    if (auto* info = std::get_if<format::TensorInfo>(&record)) storage_of[info->tensor] = info->storage;
    auto* op = std::get_if<OpRecord>(&record);
    if (op == nullptr || op->parent != 0 || trace.Name(op->name) != "aten::add_") continue;
    ++adds;
    tensors.insert(op->inputs.at(0).tensor);
    storages.insert(storage_of.at(op->inputs.at(0).tensor));
  }
  EXPECT_EQ(adds, 300);
  EXPECT_EQ(tensors.size(), 1u);     // The same tensor throughout...
  EXPECT_EQ(storages.size(), 300u);  // ...on a new storage each time.
}

TEST(ObjectIdTable, RecheckRemovesDeadObjectsSoonAndKeepsLiveIds) {
  using Weak = c10::weak_intrusive_ptr<c10::TensorImpl>;
  recorder::ObjectIdTable<Weak> table(/*recheck=*/8);
  format::ObjectId next_id = 0;
  bool created = false;
  auto weak = [](const torch::Tensor& t) { return [&t] { return Weak(t.getIntrusivePtr()); }; };
  torch::Tensor kept = torch::ones({1});
  format::ObjectId kept_id = table.Lookup(kept.unsafeGetTensorImpl(), weak(kept), next_id, created).id;
  std::set<format::ObjectId> ids;
  for (int i = 0; i < 100; ++i) {
    torch::Tensor t = torch::ones({1});  // Dies before the next one: its address comes back.
    ids.insert(table.Lookup(t.unsafeGetTensorImpl(), weak(t), next_id, created).id);
    EXPECT_TRUE(created);
  }
  EXPECT_EQ(ids.size(), 100u);   // A reused address still gets a new id.
  EXPECT_LE(table.size(), 10u);  // Dead entries went 8 insertions later, not at a sweep.
  EXPECT_EQ(table.sweeps(), 0u);
  EXPECT_EQ(table.Find(kept.unsafeGetTensorImpl()), kept_id);  // A live entry stays.

  // The generation at an address changes when its entry is removed, so that an id cached by
  // address is not trusted across the removal.
  torch::Tensor dying = torch::ones({1});
  const void* address = dying.unsafeGetTensorImpl();
  table.Lookup(address, weak(dying), next_id, created);
  uint64_t before = table.Generation(address);
  dying.reset();
  std::vector<torch::Tensor> live;
  for (int i = 0; i < 8; ++i) {
    live.push_back(torch::ones({1}));
    table.Lookup(live.back().unsafeGetTensorImpl(), weak(live.back()), next_id, created);
  }
  EXPECT_EQ(table.Find(address), 0u);
  EXPECT_NE(table.Generation(address), before);
}

TEST(Recorder, BackwardExecutionsNameTheirNodes) {
  std::string path = TempTrace("backward");
  auto x = torch::randn({8}, torch::requires_grad());
  auto w = torch::randn({8}, torch::requires_grad());
  {
    RecorderOptions options;
    options.path = path;
    Recorder recorder(options);
    auto loss = (x * 2).sigmoid().sum();
    loss.backward();
    // Two roots: the engine runs a GraphRoot first, a node no op created.
    auto a = (w * 3).sum();
    auto b = w.exp().sum();
    torch::autograd::backward({a, b});
  }
  Indexed trace(path);
  std::vector<std::string> executed;
  std::vector<format::ObjectId> accumulated;  // The leaves whose AccumulateGrad ran, in order.
  for (const auto& exec : trace.execs) {
    ASSERT_NE(exec.node, 0u) << "an execution with no node";
    const NodeRecord& node = trace.nodes.at(exec.node);
    executed.push_back(trace.Name(node.name));
    if (node.variable != 0) accumulated.push_back(node.variable);
    EXPECT_FALSE(exec.threw);
  }
  ASSERT_EQ(executed.size(), 10u);
  EXPECT_EQ(std::vector<std::string>(executed.begin(), executed.begin() + 4),
            std::vector<std::string>({"SumBackward0", "SigmoidBackward0", "MulBackward1",
                                      "torch::autograd::AccumulateGrad"}));
  EXPECT_EQ(executed[4], "torch::autograd::GraphRoot");
  EXPECT_EQ(executed.back(), "torch::autograd::AccumulateGrad");
  std::multiset<std::string> second(executed.begin() + 5, executed.end() - 1);
  EXPECT_EQ(second, std::multiset<std::string>(
                        {"SumBackward0", "SumBackward0", "MulBackward1", "ExpBackward0"}))
      << "the second pass";
  // The accumulators are those of x, then w (the trace's ids of the leaves the ops used).
  std::vector<OpRecord> muls = trace.OpsNamed("aten::mul");  // x * 2, then w * 3.
  ASSERT_EQ(accumulated.size(), 2u);
  ASSERT_EQ(muls.size(), 2u);
  EXPECT_EQ(accumulated[0], muls[0].inputs.at(0).tensor);
  EXPECT_EQ(accumulated[1], muls[1].inputs.at(0).tensor);
}

// Ops named by a string, not a schema, hand the recorder a name whose memory the next such op
// reuses: autograd's "evaluate_function: <node>" around each node it runs, C++ RECORD_FUNCTION.
// Each must keep its own name (the node inside an evaluate_function says which it is). A tensor
// hook on every tensor runs an op inside each evaluate_function, before its node's backward
// function: each is recorded, as the backward function's parent.
TEST(Recorder, OpsNamedByStringsKeepTheirNames) {
  std::string path = TempTrace("string_names");
  auto x = torch::randn({8}, torch::requires_grad());
  std::vector<std::string> ranges;
  {
    RecorderOptions options;
    options.path = path;
    Recorder recorder(options);
    auto hooked = [](at::Tensor t) {
      t.register_hook([](const at::Tensor& grad) { return grad * 1.0; });
      return t;
    };
    hooked(x);
    auto loss = hooked(hooked(hooked(hooked(x * 2).sigmoid()) + hooked(x.exp())).tanh()).mean();
    hooked(loss).backward();
    for (int i = 0; i < 6; ++i) {
      ranges.push_back("torchrr_test::a_range_named_by_a_long_string_" + std::to_string(i));
      RECORD_FUNCTION(ranges.back(), c10::ArrayRef<const c10::IValue>{});
    }
  }
  Indexed trace(path);
  std::map<format::ObjectId, std::string> evaluate;  // op -> the node its name says it runs.
  const std::string prefix = "autograd::engine::evaluate_function: ";
  std::vector<std::string> recorded_ranges;
  for (const auto& op : trace.ops) {
    std::string name = trace.Name(op.name);
    if (name.rfind(prefix, 0) == 0) evaluate[op.op] = name.substr(prefix.size());
    if (name.rfind("torchrr_test::", 0) == 0) recorded_ranges.push_back(name);
  }
  EXPECT_EQ(recorded_ranges, ranges);
  size_t checked = 0;
  for (const auto& op : trace.ops) {
    if (op.scope != format::OpScope::kBackwardFunction) continue;
    auto parent = evaluate.find(op.parent);
    if (parent == evaluate.end()) continue;
    EXPECT_EQ(parent->second, trace.Name(op.name));
    ++checked;
  }
  EXPECT_GE(checked, 6u);  // Mean, Tanh, Add, Sigmoid, Mul, Exp and the accumulators.
}

// A hook that runs a backward of its own: the engine's wrappers nest, and each one an op runs in is
// recorded with the wrapper around it as its parent.
TEST(Recorder, NestedEngineWrappersAreRecordedWithTheirParents) {
  auto x = torch::randn({4}, torch::requires_grad());
  auto y = torch::randn({4}, torch::requires_grad());
  std::string path = RecordWithoutStacks("nested_wrappers", [&] {
    auto a = x * 2;
    a.register_hook([&y](const at::Tensor& grad) {
      torch::AutoGradMode grad_mode(true);  // Hooks run with grad mode off.
      auto b = y * 3;
      b.register_hook([](const at::Tensor& inner) { return inner * 5.0; });
      torch::autograd::grad({b.sum()}, {y});
      return grad;
    });
    a.sum().backward();
  });
  Indexed trace(path);
  std::map<format::ObjectId, const OpRecord*> by_id;
  for (const auto& op : trace.ops) by_id[op.op] = &op;
  auto is_wrapper = [&](format::ObjectId id) {
    auto it = by_id.find(id);
    return it != by_id.end() &&
           trace.Name(it->second->name).starts_with("autograd::engine::evaluate_function: ");
  };
  size_t checked = 0;
  for (const auto& op : trace.ops) {
    // The inner hook's multiplication by 5: inside the inner wrapper, inside the outer one.
    if (trace.Name(op.name) != "aten::mul" || op.values.empty() || op.values[0].d != 5.0) continue;
    ASSERT_TRUE(is_wrapper(op.parent));
    const OpRecord& inner = *by_id.at(op.parent);
    ASSERT_TRUE(is_wrapper(inner.parent));
    EXPECT_EQ(by_id.at(inner.parent)->parent, 0u);
    ++checked;
  }
  EXPECT_EQ(checked, 1u);
}

// SPEC.md's order: a definition comes before every record that names it, and a tensor's latest
// TensorInfo is its metadata now, also around nested ops: a composite op (linear, matmul, to)
// interns names and sees inputs at its start, then the ops nested in it end, and are written,
// before it; an in-place op nested in a composite one changes its input's grad_fn.
// With the folded ops (all_ops) and without.
TEST(Recorder, DefinitionsComeBeforeUseAndTheLatestMetadataIsCurrent) {
  for (bool all_ops : {false, true}) {
  SCOPED_TRACE(all_ops ? "all ops" : "folded ops left out");
  std::string path = TempTrace(all_ops ? "order_all_ops" : "order");
  auto w = torch::randn({8, 8}, torch::requires_grad());
  torch::Tensor y;
  {
    RecorderOptions options;
    options.path = path;
    options.all_ops = all_ops;
    Recorder recorder(options);
    auto x = torch::randn({4, 8}, torch::kDouble).to(torch::kFloat);
    auto h = torch::nn::functional::linear(x, w);
    y = torch::matmul(h, w) * 2.0;
    // A composite in-place op on a tensor no op has named yet: hardtanh_ runs clamp_ inside it,
    // which gives y a new grad_fn while the outer op is still running.
    torch::nn::functional::hardtanh(y, torch::nn::functional::HardtanhFuncOptions().inplace(true));
    y.sum().backward();
  }
  format::Trace trace = format::ReadTraceFileAll(path);
  ASSERT_TRUE(trace.summary.status.ok());
  EXPECT_EQ(OrderProblems(trace), std::vector<std::string>());
  std::map<format::ObjectId, format::ObjectId> latest_grad_fn;
  for (const auto& record : trace.records) {
    if (auto* t = std::get_if<format::TensorInfo>(&record)) latest_grad_fn[t->tensor] = t->grad_fn;
  }
  // y's latest TensorInfo names the grad_fn it has now (the hardtanh_ ran last on it).
  Indexed indexed(path);
  std::vector<OpRecord> hardtanh = indexed.OpsNamed("aten::hardtanh_");
  ASSERT_EQ(hardtanh.size(), 1u);
  ASSERT_EQ(hardtanh[0].outputs.size(), 1u);
  format::ObjectId y_id = hardtanh[0].outputs[0].tensor;
  ASSERT_NE(latest_grad_fn[y_id], 0u);
  EXPECT_EQ(indexed.Name(indexed.nodes.at(latest_grad_fn[y_id]).name),
            y.grad_fn()->name());
  }
}

// Folded by default into the op around them (SPEC.md, Which ops), since they create no node and
// bump no version: the ops a kernel runs below autograd (the CPU `_to_copy` kernel's allocation and
// copy), the ops of a backward formula that write no argument, ops that write nothing and return no
// tensor (item's `_local_scalar_dense`), and the engine's wrapper around a node in which nothing
// else ran. Recorded with all_ops and verify_saved. Recorded either way: the
// ops a composite op runs at autograd's level (matmul's mm, which creates a node), every node, and
// the writes (add_ at autograd's level, a gradient accumulated in place).
TEST(Recorder, OpsThatChangeNothingAutogradSeesAreFoldedIntoTheOpAroundThem) {
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto w = torch::randn({3, 8}, torch::requires_grad());
  struct Counts {
    size_t ops = 0, nodes = 0, inside_to_copy = 0, inside_matmul = 0, inside_item = 0;
    // ATen ops in a backward function that bump no version (a C++ RECORD_FUNCTION range, such as
    // the "detach" around aten::detach, has no schema to tell: it is recorded).
    size_t inside_backward_reading = 0;
    size_t accumulations = 0;            // In-place adds inside AccumulateGrad.
    size_t engine_wrappers = 0;          // autograd::engine::evaluate_function: X
  };
  auto record = [&](const std::string& name, bool all_ops, bool verify_saved) {
    x.mutable_grad() = at::Tensor();
    w.mutable_grad() = at::Tensor();
    std::string path = TempTrace(name);
    {
      RecorderOptions options;
      options.path = path;
      options.native_stacks = false;
      options.all_ops = all_ops;
      options.verify_saved = verify_saved;
      Recorder recorder(options);
      auto h = x.to(torch::kDouble).to(torch::kFloat) * 1.0;
      h.add_(1.0);  // In place, at autograd's level: bumps h's version once.
      auto loss = torch::matmul(h, w.t()).sum();
      EXPECT_TRUE(std::isfinite(loss.item<float>()));
      loss.backward({}, /*retain_graph=*/true);
      loss.backward();  // Accumulates into x.grad and w.grad in place.
    }
    Indexed trace(path);
    std::map<format::ObjectId, const OpRecord*> by_id;
    for (const auto& op : trace.ops) by_id[op.op] = &op;
    Counts counts;
    counts.ops = trace.ops.size();
    counts.nodes = trace.nodes.size();
    for (const auto& op : trace.ops) {
      if (trace.Name(op.name).starts_with("autograd::engine::evaluate_function: ")) {
        ++counts.engine_wrappers;
      }
      auto parent = by_id.find(op.parent);
      if (parent == by_id.end()) continue;
      const std::string parent_name = trace.Name(parent->second->name);
      if (parent_name == "aten::_to_copy") ++counts.inside_to_copy;
      if (parent_name == "aten::matmul") ++counts.inside_matmul;
      if (parent_name == "aten::item") ++counts.inside_item;
      if (parent->second->scope != format::OpScope::kBackwardFunction) continue;
      bool bumps = false;
      for (const auto& in : op.inputs) bumps |= in.version_after != in.version_before;
      if (!bumps && trace.Name(op.name).starts_with("aten::")) ++counts.inside_backward_reading;
      if (bumps && trace.Name(op.name) == "aten::add_" &&
          parent_name == "torch::autograd::AccumulateGrad") {
        ++counts.accumulations;
      }
    }
    size_t adds_outside_backward = 0;
    for (const auto& add : trace.OpsNamed("aten::add_")) {
      if (add.parent != 0) continue;
      ++adds_outside_backward;
      if (!add.inputs.empty()) {
        EXPECT_EQ(add.inputs[0].version_after, add.inputs[0].version_before + 1) << name;
      }
    }
    EXPECT_EQ(adds_outside_backward, 1u) << name;
    EXPECT_EQ(trace.OpsNamed("aten::item").size(), 1u) << name;
    EXPECT_EQ(counts.accumulations, 2u) << name;
    EXPECT_EQ(OrderProblems(trace.trace), std::vector<std::string>()) << name;
    return counts;
  };
  Counts folded = record("fold_default", false, false);
  Counts all = record("fold_none", true, false);
  Counts verified = record("fold_verify_saved", false, true);
  EXPECT_EQ(folded.inside_to_copy, 0u);
  EXPECT_GT(all.inside_to_copy, 0u);
  EXPECT_GT(verified.inside_to_copy, 0u);
  EXPECT_GT(folded.inside_matmul, 0u);
  EXPECT_EQ(folded.inside_matmul, all.inside_matmul);
  EXPECT_EQ(folded.inside_item, 0u);
  EXPECT_GT(all.inside_item, 0u);
  EXPECT_EQ(folded.inside_backward_reading, 0u);
  // No hook, no gradient to accumulate between nodes: nothing but each node's backward function
  // runs in the engine's wrappers, which are left out but with all_ops.
  EXPECT_EQ(folded.engine_wrappers, 0u);
  EXPECT_GT(all.engine_wrappers, 0u);
  EXPECT_GT(all.inside_backward_reading, 0u);
  EXPECT_GT(verified.inside_backward_reading, 0u);
  EXPECT_EQ(folded.nodes, all.nodes);
  EXPECT_LT(folded.ops, all.ops);
}

TEST(Recorder, AFailingBackwardIsMarked) {
  std::string path = TempTrace("failing");
  auto x = torch::randn({8}, torch::requires_grad());
  {
    RecorderOptions options;
    options.path = path;
    Recorder recorder(options);
    auto y = x.sigmoid();
    y.add_(1);
    try {
      y.sum().backward();
      ADD_FAILURE() << "backward should have raised";
    } catch (const c10::Error& e) {
      recorder.RecordError("c10::Error", e.what_without_backtrace());
    }
  }
  Indexed trace(path);
  bool sigmoid_threw = false;
  for (const auto& exec : trace.execs) {
    if (exec.node != 0 && trace.Name(trace.nodes.at(exec.node).name) == "SigmoidBackward0") {
      sigmoid_threw = exec.threw;
    }
  }
  EXPECT_TRUE(sigmoid_threw);
  ASSERT_EQ(trace.errors.size(), 1u);
  EXPECT_NE(trace.errors[0].message.find("modified by an inplace operation"), std::string::npos);
}

TEST(Recorder, ManyThreadsAtOnce) {
  std::string path = TempTrace("threads");
  constexpr int kThreads = 4;
  constexpr int kOps = 300;
  {
    RecorderOptions options;
    options.path = path;
    auto shared = torch::ones({32});  // Made before the recording: described at first use.
    Recorder recorder(options);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&shared] {
        auto a = torch::ones({32});
        for (int i = 0; i < kOps; ++i) a = a + shared;
      });
    }
    for (auto& th : threads) th.join();
  }
  Indexed trace(path);
  ASSERT_TRUE(trace.trace.summary.status.ok());
  // Names and the shared tensor are defined by whichever thread used them first, before any
  // thread's records name them.
  EXPECT_EQ(OrderProblems(trace.trace), std::vector<std::string>());
  auto adds = trace.OpsNamed("aten::add");
  EXPECT_EQ(adds.size(), static_cast<size_t>(kThreads * kOps));
  std::set<uint32_t> threads;
  std::map<format::ObjectId, uint32_t> thread_of;
  for (const auto& op : trace.ops) thread_of[op.op] = op.thread;
  for (const auto& op : adds) {
    threads.insert(op.thread);
    if (op.parent != 0) EXPECT_EQ(thread_of.at(op.parent), op.thread);
  }
  EXPECT_EQ(threads.size(), static_cast<size_t>(kThreads));
}

TEST(Recorder, AnUnwritablePathWarnsAndChangesNothing) {
  auto run = [] {
    torch::manual_seed(7);
    auto w = torch::randn({16, 16}, torch::requires_grad());
    auto loss = torch::tanh(torch::mm(w, w)).sum();
    loss.backward();
    return std::make_pair(loss.item<float>(), w.grad().clone());
  };
  auto plain = run();
  RecorderOptions options;
  options.path = "/nonexistent-torchrr-dir/sub/run.trr";
  testing::internal::CaptureStderr();
  Recorder recorder(options);
  auto recorded = run();
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(recorder.recording());
  EXPECT_NE(err.find("torchrr: warning"), std::string::npos) << err;
  EXPECT_EQ(plain.first, recorded.first);
  EXPECT_TRUE(torch::equal(plain.second, recorded.second));
}

TEST(Recorder, AKilledRunLeavesAReadableTrace) {
  std::string path = TempTrace("killed");
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    RecorderOptions options;
    options.path = path;
    Recorder recorder(options);
    auto a = torch::ones({8});
    for (int i = 0; i < 100; ++i) a = a * 1.5;
    // On disk, then killed without any chance to close the trace.
    if (!recorder.Flush()) _exit(3);
    raise(SIGKILL);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  Indexed trace(path);
  EXPECT_EQ(trace.trace.summary.status.code(), format::StatusCode::kTruncated)
      << trace.trace.summary.status.message();
  EXPECT_FALSE(trace.trace.summary.has_index);
  EXPECT_EQ(trace.OpsNamed("aten::mul").size(), 100u);
}

// Forks a child that runs 50 aten::add and stops the recorder it inherited, then waits for it:
// the child's exit status is 0, or 10 when that recorder said it still recorded there.
int ForkChildThatAdds(Recorder& recorder, pid_t* pid) {
  *pid = fork();
  if (*pid < 0) return -1;
  if (*pid == 0) {  // No gtest assertion here: the exit status says what went wrong.
    int code = recorder.recording() ? 10 : 0;  // The parent's recording, stopped in the child.
    auto b = torch::ones({8});
    for (int i = 0; i < 50; ++i) b = b + 1;
    recorder.Stop();  // Closes the child's own trace, if it has one.
    _exit(code);
  }
  int status = 0;
  waitpid(*pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

RecorderOptions ForkTestOptions(const std::string& path, bool follow_forks) {
  RecorderOptions options;
  options.path = path;
  options.native_stacks = false;
  options.follow_forks = follow_forks;
  return options;
}

std::string ForkedChildTrace(const std::string& path, pid_t pid) {
  return fs::path(path).replace_extension().string() + ".pid" + std::to_string(pid) + ".trr";
}

// follow_forks: the child records into FILE.pidN.trr from its first op, its Recorder (the one it
// inherited) stops that recording, and the parent's trace holds only the parent's ops.
TEST(Recorder, AFollowedForkRecordsIntoATraceOfItsOwn) {
  std::string path = TempTrace("follow");
  pid_t pid = -1;
  {
    Recorder recorder(ForkTestOptions(path, /*follow_forks=*/true));
    auto a = torch::ones({8});
    for (int i = 0; i < 10; ++i) a = a * 2;
    EXPECT_EQ(ForkChildThatAdds(recorder, &pid), 0);
    for (int i = 0; i < 10; ++i) a = a * 2;
  }
  Indexed parent(path);
  ASSERT_TRUE(parent.trace.summary.status.ok()) << parent.trace.summary.status.message();
  EXPECT_EQ(parent.OpsNamed("aten::mul").size(), 20u);
  EXPECT_EQ(parent.OpsNamed("aten::add").size(), 0u);

  std::string child_path = ForkedChildTrace(path, pid);
  ASSERT_TRUE(fs::exists(child_path)) << child_path;
  Indexed child(child_path);
  ASSERT_TRUE(child.trace.summary.status.ok()) << child.trace.summary.status.message();
  ASSERT_TRUE(child.trace.summary.has_info);
  EXPECT_EQ(child.trace.summary.info.pid, static_cast<int64_t>(pid));
  EXPECT_EQ(child.OpsNamed("aten::add").size(), 50u);
  EXPECT_EQ(child.OpsNamed("aten::mul").size(), 0u);
}

// Without follow_forks a forked child that runs ops writes no trace at all.
TEST(Recorder, AForkNotFollowedWritesNoTrace) {
  std::string path = TempTrace("not_followed");
  pid_t pid = -1;
  {
    Recorder recorder(ForkTestOptions(path, /*follow_forks=*/false));
    EXPECT_EQ(ForkChildThatAdds(recorder, &pid), 0);
  }
  Indexed parent(path);
  ASSERT_TRUE(parent.trace.summary.status.ok()) << parent.trace.summary.status.message();
  EXPECT_EQ(parent.OpsNamed("aten::add").size(), 0u);
  EXPECT_FALSE(fs::exists(ForkedChildTrace(path, pid)));
}

}  // namespace
}  // namespace torchrr

namespace torchrr {
namespace {

// A queue bound far below what the run produces: with kDrop the recorder drops, says so in a
// data-loss record, and the trace still reads; with kWait nothing is lost.
TEST(Recorder, BoundedMemoryDropsAndSaysSo) {
  for (WhenFull when_full : {WhenFull::kDrop, WhenFull::kWait}) {
    std::string path = TempTrace(when_full == WhenFull::kDrop ? "drop" : "wait");
    constexpr int kOps = 20000;
    uint64_t dropped = 0;
    {
      RecorderOptions options;
      options.path = path;
      options.native_stacks = false;
      options.max_buffered_bytes = 16 << 10;
      options.when_full = when_full;
      Recorder recorder(options);
      auto a = torch::ones({4});
      for (int i = 0; i < kOps; ++i) a = a * 1.0001;
      recorder.Stop();
      dropped = recorder.records_dropped();
    }
    Indexed trace(path);
    ASSERT_TRUE(trace.trace.summary.status.ok()) << trace.trace.summary.status.message();
    uint64_t loss_records = 0, lost = 0;
    for (const auto& r : trace.trace.records) {
      if (auto* loss = std::get_if<format::DataLossRecord>(&r)) {
        ++loss_records;
        lost += loss->records;
      }
    }
    size_t muls = trace.OpsNamed("aten::mul").size();
    if (when_full == WhenFull::kDrop) {
      EXPECT_GT(dropped, 0u) << "the writer kept up with a 16 KiB queue: make the test harder";
      EXPECT_GT(loss_records, 0u);
      EXPECT_LE(lost, dropped);
      EXPECT_LT(muls, static_cast<size_t>(kOps));
    } else {
      EXPECT_EQ(dropped, 0u);
      EXPECT_EQ(loss_records, 0u);
      EXPECT_EQ(muls, static_cast<size_t>(kOps));
    }
  }
}

}  // namespace
}  // namespace torchrr

namespace torchrr {
namespace {

// A C++ custom Function: what ctx->save_for_backward() saved is recorded (marked custom), and
// autograd agrees it was saved.
struct CubeFunction : torch::autograd::Function<CubeFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x) {
    ctx->save_for_backward({x});
    return x * x * x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto x = ctx->get_saved_variables()[0];
    return {3 * x * x * grads[0]};
  }
};

TEST(Recorder, CustomCppFunctionSavedTensors) {
  std::string path = TempTrace("custom");
  auto leaf = torch::randn({6}, torch::requires_grad());
  torch::Tensor x, y;
  {
    RecorderOptions options;
    options.path = path;
    Recorder recorder(options);
    x = leaf * 2;
    y = CubeFunction::apply(x);
    auto z = y.sum();  // Reaches the custom node through its edges.
    (void)z;
  }
  Indexed trace(path);
  std::vector<NodeRecord> custom = trace.CustomNodes();
  ASSERT_EQ(custom.size(), 1u);
  ASSERT_EQ(custom[0].saved.size(), 1u);
  EXPECT_TRUE(custom[0].saved[0].defined);
  EXPECT_EQ(custom[0].saved[0].saved_version, 0u);
  auto mul = trace.OpsNamed("aten::mul");
  ASSERT_FALSE(mul.empty());
  EXPECT_EQ(custom[0].saved[0].version_counter, trace.CounterOf(mul[0].outputs[0].tensor));
  // apply() is not an op: the node is credited to the first op its forward ran, x * x (the
  // second top-level aten::mul, after leaf * 2), which took x as both inputs.
  ASSERT_GE(mul.size(), 2u);
  EXPECT_EQ(custom[0].created_by, mul[1].op);
  EXPECT_EQ(mul[1].inputs.at(0).tensor, mul[0].outputs.at(0).tensor);
  x.add_(1);  // Autograd agrees: the custom node saved x.
  EXPECT_THROW(y.sum().backward(), c10::Error);
}

}  // namespace
}  // namespace torchrr

namespace torchrr {
namespace {

// --verify-saved: a write through data_ptr (no op, no version bump) into a saved tensor changes
// its fingerprint between save and use; a saved tensor nobody touched keeps it. The hashes are
// those of kernels::FingerprintHost over the bytes autograd saved.
TEST(Recorder, VerifySavedFingerprintsSavedBytesAtSaveAndAtUse) {
  std::string path = TempTrace("verify_saved");
  auto x = torch::randn({6, 5}, torch::requires_grad());
  uint64_t y_before = 0, z_bytes = 0;
  {
    RecorderOptions options;
    options.path = path;
    options.native_stacks = false;
    options.verify_saved = true;
    Recorder recorder(options);
    auto y = x.sigmoid();            // Saves its output.
    auto z = x.tanh();               // Saves its output; untouched.
    y_before = kernels::FingerprintHost(y.const_data_ptr(), y.nbytes());
    z_bytes = kernels::FingerprintHost(z.const_data_ptr(), z.nbytes());
    y.data_ptr<float>()[7] = 42.0f;  // A raw write: autograd never sees it.
    (y.sum() + z.sum()).backward();
  }
  Indexed t(path);
  auto sigmoid = t.NodesNamed("SigmoidBackward0");
  auto tanh = t.NodesNamed("TanhBackward0");
  ASSERT_EQ(sigmoid.size(), 1u);
  ASSERT_EQ(tanh.size(), 1u);
  std::map<std::pair<format::ObjectId, int>, format::FingerprintRecord> by_node;
  for (const auto& f : t.fingerprints) {
    EXPECT_EQ(t.Name(f.saved_name), "result");
    by_node[{f.node, static_cast<int>(f.when)}] = f;
  }
  auto at = [&](format::ObjectId node, format::FingerprintWhen when) {
    auto it = by_node.find({node, static_cast<int>(when)});
    EXPECT_NE(it, by_node.end());
    return it == by_node.end() ? format::FingerprintRecord{} : it->second;
  };
  auto y_save = at(sigmoid[0].node, format::FingerprintWhen::kAtSave);
  auto y_use = at(sigmoid[0].node, format::FingerprintWhen::kAtUse);
  auto z_save = at(tanh[0].node, format::FingerprintWhen::kAtSave);
  auto z_use = at(tanh[0].node, format::FingerprintWhen::kAtUse);
  EXPECT_EQ(y_save.hash, y_before);
  EXPECT_NE(y_use.hash, y_save.hash);
  EXPECT_EQ(z_save.hash, z_bytes);
  EXPECT_EQ(z_use.hash, z_save.hash);
  EXPECT_EQ(y_save.byte_offset, 0u);
  EXPECT_EQ(y_save.byte_length, 6u * 5u * sizeof(float));
  EXPECT_LT(y_save.time_ns, y_use.time_ns);
  EXPECT_NE(y_save.storage, 0u);
  EXPECT_EQ(y_save.storage, y_use.storage);
}

// A custom Function saves its output. apply() is not an op: no op's outputs name its node, which
// is written when the first op takes the output (here detach(), as from_dlpack or numpy() would
// start), before a raw write through what that op made. Its fingerprint at save is of the bytes
// as the forward left them.
struct ExpFunction : torch::autograd::Function<ExpFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x) {
    auto y = x.exp();
    ctx->save_for_backward({y});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads[0] * ctx->get_saved_variables()[0]};
  }
};

TEST(Recorder, VerifySavedFingerprintsCustomFunctionBeforeWriteThroughAlias) {
  std::string path = TempTrace("verify_saved_custom");
  auto x = torch::randn({6}, torch::requires_grad());
  uint64_t y_before = 0;
  {
    RecorderOptions options;
    options.path = path;
    options.native_stacks = false;
    options.verify_saved = true;
    Recorder recorder(options);
    auto y = ExpFunction::apply(x);
    auto alias = y.detach();
    y_before = kernels::FingerprintHost(y.const_data_ptr(), y.nbytes());
    alias.data_ptr<float>()[3] = 42.0f;  // A raw write: autograd never sees it.
    (y * 2).sum().backward();
  }
  Indexed t(path);
  std::vector<NodeRecord> custom = t.CustomNodes();
  ASSERT_EQ(custom.size(), 1u);
  // The saved output is described by what autograd saved: no op's output names it.
  ASSERT_EQ(custom[0].saved.size(), 1u);
  EXPECT_NE(custom[0].saved[0].tensor, 0u);
  bool at_save = false, at_use = false;
  for (const auto& f : t.fingerprints) {
    if (f.node != custom[0].node) continue;
    if (f.when == format::FingerprintWhen::kAtSave) {
      at_save = true;
      EXPECT_EQ(f.hash, y_before);
    } else {
      at_use = true;
      EXPECT_NE(f.hash, y_before);
    }
  }
  EXPECT_TRUE(at_save);
  EXPECT_TRUE(at_use);
}

// Without the option, nothing is fingerprinted.
TEST(Recorder, NoFingerprintsUnlessAsked) {
  std::string path = TempTrace("no_verify");
  auto x = torch::randn({4}, torch::requires_grad());
  {
    RecorderOptions options;
    options.path = path;
    options.native_stacks = false;
    Recorder recorder(options);
    x.sigmoid().sum().backward();
  }
  EXPECT_TRUE(Indexed(path).fingerprints.empty());
}

}  // namespace
}  // namespace torchrr
