// libtorchrr_python_nodes.so: what a Python torch.autograd.Function saved (ctx.save_for_backward),
// read from its THPFunction. Separate from the recorder because torch's python_function.h needs
// Python's symbols: this library is dlopen'ed only by a recorder running inside Python.
#include <torch/csrc/autograd/python_function.h>

#include "saved_variables.h"

extern "C" void torchrr_visit_py_node(torch::autograd::Node& node,
                                      const torchrr::recorder::SavedVariableVisitor& visit) {
  auto& py_node = static_cast<torch::autograd::PyNode&>(node);
  auto* function = reinterpret_cast<THPFunction*>(py_node.obj);
  if (function == nullptr) return;
  for (size_t i = 0; i < function->saved_variables.size(); ++i) {
    visit("saved_tensors", static_cast<uint32_t>(i), function->saved_variables[i]);
  }
}
