#include "capture/saved_variables.h"

#include "capture/checkpoint_inputs.h"
#include "internals/torch_internals.h"
#include "python/python_nodes.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/tensor.h>
#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

#include <c10/util/flat_hash_map.h>

namespace torchrr::recorder {

// libtorchrr_python_nodes.so reads THPFunction and Python objects, which needs Python's headers
// and symbols; it sits beside this library and is loaded only in a process that has Python (where
// PyNodes and Python hooks exist). nullptr when it cannot be loaded.
void* PythonNodesSymbol(const char* name) {
  static void* handle = [] () -> void* {
    Dl_info self{};
    if (dladdr(reinterpret_cast<void*>(&VisitSavedVariables), &self) == 0 ||
        self.dli_fname == nullptr) {
      return nullptr;
    }
    std::string path = self.dli_fname;
    path = path.substr(0, path.rfind('/') + 1) + "libtorchrr_python_nodes.so";
    return dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }();
  return handle != nullptr ? dlsym(handle, name) : nullptr;
}

namespace {

auto PythonNodeVisitor() {
  static auto visitor = TORCHRR_PYTHON_NODES_FUNCTION(torchrr_visit_py_node);
  return visitor;
}

}  // namespace

bool IsPythonNode(const std::type_info& type) {
  return std::strcmp(type.name(), "N5torch8autograd6PyNodeE") == 0;
}

format::SavedSetKind VisitSavedVariables(torch::autograd::Node& node,
                                         const SavedVariableVisitor& visit) {
  // The generated table's entry for the node's type, looked up once per type_info and thread: a
  // std::type_index lookup hashes the type's mangled name on every call.
  thread_local ska::flat_hash_map<const std::type_info*, SavedVariableVisitFn> by_type;
  const std::type_info* type = &typeid(node);
  auto cached = by_type.find(type);
  if (cached == by_type.end()) {
    const auto& table = GeneratedNodes();
    auto it = table.find(std::type_index(*type));
    cached = by_type.emplace(type, it != table.end() ? it->second : nullptr).first;
  }
  if (cached->second != nullptr) {
    cached->second(node, visit);
    return format::SavedSetKind::kExact;
  }
  // An in-place op on a view: autograd wraps the op's node in CopySlices, which runs it in
  // backward; what that node saved is what CopySlices needs.
  if (auto* copy_slices = dynamic_cast<torch::autograd::CopySlices*>(&node)) {
    if (copy_slices->fn) return VisitSavedVariables(*copy_slices->fn, visit);
    return format::SavedSetKind::kNone;
  }
  // A Python torch.autograd.Function: what ctx.save_for_backward was given, kept by its
  // THPFunction.
  if (IsPythonNode(*type)) {
    if (auto visit_py_node = PythonNodeVisitor()) visit_py_node(node, visit);
    return format::SavedSetKind::kCustom;
  }
  // Checkpointing's inputs (2.12 on): what the checkpoint frame holds.
  if (IsCheckpointInputs(node)) {
    for (const auto& [index, saved] : static_cast<CheckpointInputs&>(node).saved()) {
      visit("saved_args", index, *saved);
    }
    return format::SavedSetKind::kCustom;
  }
  // A C++ torch::autograd::Function<T>: what ctx->save_for_backward() saved.
  if (std::strstr(typeid(node).name(), "N5torch8autograd7CppNodeI") == typeid(node).name()) {
    const auto& saved = CppNodeSavedVariables(node);
    for (size_t i = 0; i < saved.size(); ++i) {
      visit("saved_variables", static_cast<uint32_t>(i), saved[i]);
    }
    return format::SavedSetKind::kCustom;
  }
  if (dynamic_cast<torch::autograd::AccumulateGrad*>(&node) != nullptr ||
      dynamic_cast<torch::autograd::GraphRoot*>(&node) != nullptr ||
      dynamic_cast<torch::autograd::Error*>(&node) != nullptr ||
      dynamic_cast<torch::autograd::DelayedError*>(&node) != nullptr ||
      dynamic_cast<torch::autograd::UndefinedGrad*>(&node) != nullptr ||
      dynamic_cast<torch::autograd::UndefinedGradBackward*>(&node) != nullptr) {
    return format::SavedSetKind::kNone;
  }
  return format::SavedSetKind::kUnknown;
}

void ReadUncheckedTensors(torch::autograd::Node& node, std::vector<UncheckedTensor>& out) {
  static auto read = TORCHRR_PYTHON_NODES_FUNCTION(torchrr_read_unchecked_tensors);
  if (read != nullptr && IsPythonNode(typeid(node))) read(node, &out);
}

std::shared_ptr<const SavedUses> ReadSavedUses(torch::autograd::Node& node) {
  static auto read = TORCHRR_PYTHON_NODES_FUNCTION(torchrr_read_saved_uses);
  if (read == nullptr || !IsPythonNode(typeid(node))) return nullptr;
  const uint64_t id = read(node, nullptr);
  if (id == 0) return nullptr;
  // Parsed once per region's reading: its tracebacks never change, and the code ids they get
  // are the process's.
  static std::mutex mu;
  static auto* parsed = new std::unordered_map<uint64_t, std::shared_ptr<const SavedUses>>();
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = parsed->find(id);
    if (it != parsed->end()) return it->second;
  }
  std::vector<std::string> traces;
  if (read(node, &traces) != id) return nullptr;
  auto uses = std::make_shared<SavedUses>();
  constexpr size_t kMaxFrames = 64;
  std::unordered_map<std::string_view, std::vector<PythonFrame>> by_trace;  // Many share one.
  std::vector<PythonCode> codes;
  for (const std::string& trace : traces) {
    auto [it, created] = by_trace.try_emplace(trace);
    if (created && !trace.empty()) {
      it->second.resize(kMaxFrames);
      it->second.resize(TracebackStack(trace, it->second.data(), kMaxFrames, &codes));
    }
    uses->stacks.push_back(it->second);
  }
  std::unordered_set<uint32_t> described;
  for (PythonCode& code : codes) {
    if (described.insert(code.code).second) uses->codes.push_back(std::move(code));
  }
  std::lock_guard<std::mutex> lock(mu);
  if (parsed->size() >= 4096) parsed->clear();  // Regions compiled and dropped: read again.
  return parsed->emplace(id, std::move(uses)).first->second;
}

SavedHookFacts ReadSavedHook(torch::autograd::Node& node,
                             const torch::autograd::SavedVariable& saved, uint32_t saved_index) {
  static auto read =
      TORCHRR_PYTHON_NODES_FUNCTION(torchrr_read_saved_hook);
  SavedHookFacts facts;
  if (read == nullptr) return facts;
  // What CopySlices saved is its wrapped node's: outputs are that node's.
  torch::autograd::Node* owner = &node;
  if (auto* copy_slices = dynamic_cast<torch::autograd::CopySlices*>(&node)) {
    owner = copy_slices->fn.get();
  }
  UnpackExpectation expect;
  c10::ScalarType dtype{};
  if (owner != nullptr && SavedTensorMetadata(*owner, saved, &dtype, &expect.shape)) {
    expect.node = &node;
    expect.saved_index = saved_index;
    expect.dtype = static_cast<format::DType>(dtype);
    facts.expect = std::move(expect);
  }
  read(saved, &facts);
  if (facts.hook_code != nullptr) {
    facts.unpack_hook = CodeDefinition(facts.hook_code, facts.hook_line, &facts.new_codes);
    facts.hook_code = nullptr;
  }
  return facts;
}

void FollowCheckpointInputs(bool follow) {
  // Without Python there is no checkpoint to follow: libtorchrr_python_nodes is not loaded.
  if (!PythonInterpreterRunning()) return;
  static auto set =
      TORCHRR_PYTHON_NODES_FUNCTION(torchrr_follow_checkpoint_inputs);
  if (set != nullptr) set(follow ? 1 : 0);
}

void FollowFunctionNodes(bool follow) {
  if (!PythonInterpreterRunning()) return;
  static auto set = TORCHRR_PYTHON_NODES_FUNCTION(torchrr_follow_function_nodes);
  if (set != nullptr) set(follow ? 1 : 0);
}

compat::NodePtr TakeFunctionNode(int64_t sequence_nr) {
  compat::NodePtr node;
  if (sequence_nr < 0 || !PythonInterpreterRunning()) return node;
  static auto pending =
      TORCHRR_PYTHON_NODES_FUNCTION(torchrr_function_ctx_pending);
  static auto take = TORCHRR_PYTHON_NODES_FUNCTION(torchrr_take_function_node);
  if (pending != nullptr && take != nullptr && pending() != 0) take(sequence_nr, &node);
  return node;
}

void TakeUnpackedTensors(const void* node, std::vector<format::UnpackedTensor>& out) {
  static auto take = TORCHRR_PYTHON_NODES_FUNCTION(torchrr_take_unpacked);
  if (take != nullptr) take(node, &out);
}

}  // namespace torchrr::recorder
