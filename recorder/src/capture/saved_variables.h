// What an autograd node saved for backward, read from the node itself.
//
// The node types generated from derivatives.yaml (torch/csrc/autograd/generated/Functions.h) keep
// their SavedVariables as named members; gen_saved_table.py turns that header into a visitor per
// type at build time, so the table always matches the torch being built against. Nodes outside it
// (CopySlices, AccumulateGrad, custom Functions) are handled in saved_variables.cc.
#ifndef TORCHRR_RECORDER_SAVED_VARIABLES_H_
#define TORCHRR_RECORDER_SAVED_VARIABLES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <typeindex>
#include <unordered_map>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>

#include "stacks/python_stacks.h"
#include "internals/torch_compat.h"
#include "torchrr/format/records.h"

namespace torchrr::recorder {

inline constexpr uint32_t kNotInList = format::TensorUse::kNotInList;

// Called once per SavedVariable: its member name ("self", "result"), its index within a
// std::vector<SavedVariable> member (kNotInList otherwise), and the SavedVariable.
using SavedVariableVisitor =
    std::function<void(const char* name, uint32_t list_index, const torch::autograd::SavedVariable&)>;
using SavedVariableVisitFn = void (*)(torch::autograd::Node&, const SavedVariableVisitor&);
using GeneratedSavedTable = std::unordered_map<std::type_index, SavedVariableVisitFn>;

// The generated table (saved_variables_table.cc).
const GeneratedSavedTable& GeneratedNodes();
size_t GeneratedNodeTypeCount();

// Whether `type` is a Python torch.autograd.Function's node (torch::autograd::PyNode). Compared by
// the mangled type name: PyNode's type information lives in libtorch_python, which a C++ program
// does not load.
bool IsPythonNode(const std::type_info& type);

// Visits every SavedVariable of `node` and says how exact that list is: kExact for generated
// nodes (an empty list means the node saved nothing), kNone for node types known to save nothing,
// kUnknown for types the recorder cannot look inside. CopySlices is looked through to the node it
// wraps. Must run while the node is alive; does not unpack anything (no version check, no hooks).
format::SavedSetKind VisitSavedVariables(torch::autograd::Node& node,
                                         const SavedVariableVisitor& visit);

// What the saved-tensor hooks of a SavedVariable packed (torch.autograd.graph.saved_tensors_hooks):
// a tensor (the saved tensor itself, or a copy, as save_on_cpu makes on a GPU), activation
// checkpointing's placeholder (recomputed in backward from what the checkpoint's input node
// saved), or an object the recorder cannot follow (kOpaque).
// What backward needs an unpack hook to hand back for one saved tensor: the dtype and shape
// autograd keeps for it (SavedTensorMetadata). PyTorch compares neither with what the hook
// returns; libtorchrr_python_nodes wraps the unpack hook to compare them.
struct UnpackExpectation {
  const void* node = nullptr;  // The node, by address: ties an unpack to the node's execution.
  uint32_t saved_index = 0;    // In the node's NodeRecord.saved (VisitSavedVariables' order).
  format::DType dtype = 0;
  std::vector<int64_t> shape;
};

// With the hooks' unpack function when it is a Python function (not checkpointing's): where it was
// defined, the frame a report names when backward fails on what it returned.
struct SavedHookFacts {
  format::SavedHook kind = format::SavedHook::kOpaque;
  at::Tensor packed;                                        // kPackedTensor.
  compat::NodePtr recompute_from;   // kCheckpoint.
  PythonFrame unpack_hook;  // Code id and first line; code 0 when unknown.
  std::vector<PythonCode> new_codes;  // For the interner: code objects described first here.
  // Set by libtorchrr_python_nodes, taken by ReadSavedHook: a new reference to the hook's code
  // object (PyCodeObject*), which ReadSavedHook turns into `unpack_hook`, and its first line.
  void* hook_code = nullptr;
  int32_t hook_line = 0;
  // In: set by ReadSavedHook when the metadata is known; the unpack hook of a packed tensor is
  // then wrapped to compare what it returns with it (TakeUnpackedTensors).
  std::optional<UnpackExpectation> expect;
};

// Reads it through Python, taking the GIL: never call it with a lock held that a thread holding
// the GIL could wait for. kOpaque outside Python. Drop the result without that lock too (the
// last reference to a Python node takes the GIL).
// `node` is the node that saved it (the one VisitSavedVariables was given) and `saved_index` its
// place in the node's saved list.
SavedHookFacts ReadSavedHook(torch::autograd::Node& node,
                             const torch::autograd::SavedVariable& saved, uint32_t saved_index);

// A tensor a Python node's ctx holds for backward outside its SavedVariables, which backward reads
// unchecked: an item of AOTAutograd's `_tensors_no_vc_check` (name "_tensors_no_vc_check",
// list_index its place; an undefined tensor for an item that is not one), or one a Function's
// forward stashed on its ctx, named by the path to it ("ctx.weight", "ctx.tensors" with
// list_index 1, "ctx.state.absmax", "ctx.cache['k']").
struct UncheckedTensor {
  at::Tensor tensor;
  std::string name;
  uint32_t list_index = format::TensorUse::kNotInList;
};

// The tensors a Python node's ctx holds for backward outside its SavedVariables (appended to
// `out`): AOTAutograd's `_tensors_no_vc_check`, and the tensors reachable from the ctx's
// attributes (directly, in tuples, lists and dicts, and one level into a plain object's
// attributes). Nothing for other nodes, or outside Python. Takes the GIL, as ReadSavedHook.
void ReadUncheckedTensors(torch::autograd::Node& node, std::vector<UncheckedTensor>& out);

// Where backward uses each tensor a torch.compile region's node saved, in the node's saved order
// (`saved_tensors`, then `_tensors_no_vc_check`): the Python frames, innermost first, of the
// user's line whose forward op the first backward graph node reading it differentiates (empty
// where unknown), with the descriptions of the codes they name. Read from AOTAutograd's backward
// graph (python/compiled_regions.cc) once per region, the first time one of its applies ends
// recorded.
struct SavedUses {
  std::vector<std::vector<PythonFrame>> stacks;
  std::vector<PythonCode> codes;
};
// Null for any other node, outside Python, or when torch kept no backward graph (a region loaded
// from AOTAutograd's cache). Takes the GIL.
std::shared_ptr<const SavedUses> ReadSavedUses(torch::autograd::Node& node);

// Python autograd.Functions: while `follow`, the ctx each apply() makes is noted (on its thread),
// so that the apply's end (an op numbered with the node's sequence number) can take its node:
// TakeFunctionNode. Outside Python, nothing. Following the first time takes the GIL (it wraps
// BackwardCFunction.__init__ once per process); stopping takes neither a lock nor the GIL.
void FollowFunctionNodes(bool follow);
// The node of the Function whose apply() is the op numbered `sequence_nr` ending on this thread,
// or an empty pointer. Takes the GIL only when a ctx is pending on this thread: call it with no
// lock held that a thread holding the GIL could wait for, and drop the node likewise.
compat::NodePtr TakeFunctionNode(int64_t sequence_nr);

// Non-reentrant checkpointing from torch 2.12 on (checkpoint_inputs.h): while `follow`, each
// _CheckpointFrame.save_inputs call is recorded as an op of that name that creates the frame's
// CheckpointInputs, which the frame's placeholders then name. Up to 2.11, and outside Python,
// nothing to do (the inputs' node is autograd's own). Following the first time takes the GIL
// (it wraps save_inputs, once per process): call it with no lock held that a thread holding the
// GIL could wait for. Stopping takes neither a lock nor the GIL; the wrapper stays, and calls
// save_inputs alone.
void FollowCheckpointInputs(bool follow);

// Moves into `out` what the wrapped unpack hooks of the node at `node` returned, on this thread,
// that differs from what was saved (UnpackedTensor.saved indexes the node's saved list). For a
// backward function's end: the node's execution unpacked them. Takes no lock, not the GIL.
void TakeUnpackedTensors(const void* node, std::vector<format::UnpackedTensor>& out);

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_SAVED_VARIABLES_H_
