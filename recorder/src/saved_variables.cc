#include "saved_variables.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/tensor.h>

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
