// The one place that reaches into torch internals that have no public accessor.
//
// autograd keeps the facts torchrr needs private: the identity of a tensor's version counter
// (c10::VariableVersion::version_counter_) and what a SavedVariable holds (its saved version, its
// data, whether it saved an output, whether hooks replaced the data). RecordFunction keeps two
// private: the op's schema (fn_; operator_schema() returns a copy) and whether the dispatcher is
// to box the op's outputs (step_callbacks_). They are read here through
// pointers to members obtained by explicit template instantiation, which C++ allows to name
// private members ([temp.spec]/6); the layouts are those of the headers of the torch we are built
// against, so a torch that renames a member fails to compile here instead of misreading memory.
#ifndef TORCHRR_RECORDER_TORCH_INTERNALS_H_
#define TORCHRR_RECORDER_TORCH_INTERNALS_H_

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/record_function.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>

namespace torchrr::recorder {

// The registered schema of an ATen op, or nullptr for a RecordFunction named by a string (C++'s
// RECORD_FUNCTION, autograd's engine wrappers). No copy: the schema lives as long as the op's
// registration.
const c10::FunctionSchema* SchemaOf(const at::RecordFunction& fn);

// Tells the dispatcher not to box `fn`'s outputs into IValues (an allocation and a reference count
// per tensor), when torchrr's is the op's only callback: another may want them. Called from the
// start callback, before the dispatcher reads the flag.
void SkipOutputsIfOnlyCallback(const at::RecordFunction& fn);

// The counter object a tensor's VariableVersion points at; tensors that share it (views, detach())
// get the same pointer. nullptr for inference tensors (no counter).
const c10::intrusive_ptr_target* VersionCounterOf(const c10::TensorImpl& impl);

// A weak reference that keeps the counter's memory from being reused while torchrr tracks it.
c10::weak_intrusive_ptr<c10::intrusive_ptr_target> WeakVersionCounter(const c10::TensorImpl& impl);

// A strong reference used to read the counter's value at an op's end even if the tensor is gone.
c10::intrusive_ptr<c10::intrusive_ptr_target> StrongVersionCounter(const c10::TensorImpl& impl);
uint32_t ReadVersionCounter(const c10::intrusive_ptr_target* counter);

// The facts of one SavedVariable, as autograd will check them at unpack.
struct SavedVariableFacts {
  bool defined = false;        // False when nothing was saved (default constructed or released).
  bool has_hooks = false;      // Saved-tensor hooks: PyTorch skips the version check.
  bool is_output = false;
  bool saved_original = false; // data is the very tensor the program had (not a shallow copy).
  bool is_leaf = false;
  uint32_t saved_version = 0;
  uint32_t output_nr = 0;
  const at::Tensor* data = nullptr;  // Valid while the node is alive; null when !defined.
};
SavedVariableFacts ReadSavedVariable(const torch::autograd::SavedVariable& saved);

// The dtype and shape autograd keeps for the tensor `saved` stands for, which backward needs an
// unpack hook to return for it: for a saved output, `node`'s input metadata; for a saved input,
// that of the input's grad_fn or gradient accumulator (an input that needs no gradient has none).
// False when unknown, or not plain sizes (nested, a tensor subclass, symbolic sizes).
bool SavedTensorMetadata(const torch::autograd::Node& node,
                         const torch::autograd::SavedVariable& saved, c10::ScalarType* dtype,
                         std::vector<int64_t>* shape);

// For a node of a C++ custom Function (torch::autograd::Function<T>'s CppNode<T>): what
// ctx->save_for_backward() saved. The caller has checked the node's type; CppNode<T>'s members do
// not depend on T, so the node is read as a CppNode of a stand-in T.
const std::vector<torch::autograd::SavedVariable>& CppNodeSavedVariables(
    torch::autograd::Node& node);

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_TORCH_INTERNALS_H_
