// libtorchrr_python_nodes.so's functions, as the recorder calls them (capture/saved_variables.cc,
// through dlsym, TORCHRR_PYTHON_NODES_FUNCTION) and as the library defines them (python/*.cc):
// one declaration for both sides of the dlopen, so that a changed signature fails to compile.
// The library reads Python objects and needs Python's symbols: it is loaded only by a recorder
// running inside Python.
#ifndef TORCHRR_RECORDER_PYTHON_NODES_H_
#define TORCHRR_RECORDER_PYTHON_NODES_H_

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>

#include "capture/saved_variables.h"
#include "internals/torch_compat.h"
#include "torchrr/format/records.h"

extern "C" {

void torchrr_visit_py_node(torch::autograd::Node& node,
                           const torchrr::recorder::SavedVariableVisitor& visit);

// What the saved-tensor hooks of `saved` packed. Takes the GIL: the caller holds no lock that a
// thread holding the GIL could wait for.
void torchrr_read_saved_hook(const torch::autograd::SavedVariable& saved,
                             torchrr::recorder::SavedHookFacts* out);

// What the node's wrapped unpack hooks returned on this thread that differs from what it saved
// (TakeUnpackedTensors). Takes neither the GIL nor a lock: thread-local.
void torchrr_take_unpacked(const void* node, std::vector<torchrr::format::UnpackedTensor>* out);

// Starts or stops recording _CheckpointFrame.save_inputs calls (FollowCheckpointInputs); starting
// wraps it the first time.
void torchrr_follow_checkpoint_inputs(int follow);

// Starts or stops noting the ctxs Python Functions make (BackwardCFunction.__init__ is wrapped
// the first time); the ctxs noted stay until taken, or dropped when the stack is full.
void torchrr_follow_function_nodes(int follow);

// Whether this thread has a ctx noted and not taken. Takes neither the GIL nor a lock.
int torchrr_function_ctx_pending();

// At the end of an op numbered `sequence_nr` (a Function's apply shows its node's number): that
// node, when the innermost ctx noted on this thread is its; ctxs made inside it whose applies
// did not end recorded are dropped on the way. Takes the GIL.
void torchrr_take_function_node(int64_t sequence_nr, torchrr::recorder::compat::NodePtr* out);

// The tensors a Python node's ctx holds outside its SavedVariables (ReadUncheckedTensors):
// AOTAutograd's `ctx._tensors_no_vc_check` (what a user Function inside a compiled region stashed
// on its ctx), and what a Function's forward left in the ctx's attributes. Read under the GIL;
// Python's error state is left as it was.
void torchrr_read_unchecked_tensors(torch::autograd::Node& node,
                                    std::vector<torchrr::recorder::UncheckedTensor>* out);

// Where backward uses each tensor a torch.compile region's node saved (kSavedUsesSource): the id
// of what was read of the node's class (the same for every node of that class while it lives; 0
// for any other node), and, when `traces` is given, the tracebacks themselves. Takes the GIL;
// Python's error state is left as it was.
uint64_t torchrr_read_saved_uses(torch::autograd::Node& node, std::vector<std::string>* traces);

// The first tensor a wrapper subclass's `__tensor_flatten__` names (a DTensor's `_local_tensor`),
// into `out`; `out` is left as it was for any other tensor. Takes the GIL: the caller holds no
// lock that a thread holding the GIL could wait for. Python's error state is left as it was.
void torchrr_read_inner_tensor(const at::Tensor& wrapper, at::Tensor* out);

}  // extern "C"

// The library's function `name`, looked up once (nullptr when the library or the function is
// missing), typed by its declaration above.
#define TORCHRR_PYTHON_NODES_FUNCTION(name) \
  reinterpret_cast<decltype(&name)>(::torchrr::recorder::PythonNodesSymbol(#name))

namespace torchrr::recorder {
// dlsym in libtorchrr_python_nodes.so, beside the recorder (saved_variables.cc).
void* PythonNodesSymbol(const char* name);
}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_PYTHON_NODES_H_
