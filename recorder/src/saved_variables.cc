#include "saved_variables.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/tensor.h>
#ifdef TORCHRR_WITH_PYTHON_HEADERS
#include <torch/csrc/autograd/python_function.h>
#endif

#include <cstring>

namespace torchrr::recorder {

format::SavedSetKind VisitSavedVariables(torch::autograd::Node& node,
                                         const SavedVariableVisitor& visit) {
  const auto& table = GeneratedNodes();
  auto it = table.find(std::type_index(typeid(node)));
  if (it != table.end()) {
    it->second(node, visit);
    return format::SavedSetKind::kExact;
  }
  // An in-place op on a view: autograd wraps the op's node in CopySlices, which runs it in
  // backward; what that node saved is what CopySlices needs.
  if (auto* copy_slices = dynamic_cast<torch::autograd::CopySlices*>(&node)) {
    if (copy_slices->fn) return VisitSavedVariables(*copy_slices->fn, visit);
    return format::SavedSetKind::kNone;
  }
#ifdef TORCHRR_WITH_PYTHON_HEADERS
  // A Python torch.autograd.Function: what ctx.save_for_backward was given, kept by its
  // THPFunction. Compared by the mangled type name: PyNode's type information lives in
  // libtorch_python, which a C++ program does not load.
  if (std::strcmp(typeid(node).name(), "N5torch8autograd6PyNodeE") == 0) {
    auto& py_node = static_cast<torch::autograd::PyNode&>(node);
    auto* function = reinterpret_cast<THPFunction*>(py_node.obj);
    if (function != nullptr) {
      for (size_t i = 0; i < function->saved_variables.size(); ++i) {
        visit("saved_tensors", static_cast<uint32_t>(i), function->saved_variables[i]);
      }
    }
    return format::SavedSetKind::kCustom;
  }
#endif
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

}  // namespace torchrr::recorder
