// The one place where the recorder adapts to the torch it is compiled against. torchrr supports a
// range of torch releases (TORCHRR_TORCH_MIN to TORCHRR_TORCH_MAX, cmake/TorchrrDeps.cmake), and
// torch's C++ internals change shape within it:
//   - autograd nodes were owned through std::shared_ptr<Node> (Node derived from
//     enable_shared_from_this) and are owned through c10::intrusive_ptr<Node> from 2.13;
//   - a Python autograd.Function's node (PyNode) held its THPFunction in `obj`, and reaches it
//     through `pyobj()` from 2.13;
//   - PySavedVariableHooks held its hooks as PyObject* (owning a reference), and holds them as
//     std::optional<c10::SafePyObject> in 2.15;
//   - c10::Stream::native_handle() appeared after 2.9;
//   - non-reentrant torch.utils.checkpoint kept a checkpointed call's inputs through an autograd
//     node (_NoopSaveInputsBackward, reached as frame.input_saver) and keeps them as standalone
//     SavedVariables (frame.saved_args, made by _CheckpointFrame.save_inputs) from 2.12: a Python
//     shape, followed in python/checkpoint_frames.cc by testing for the attribute, with
//     checkpoint_inputs.h.
// Each adapter tests for the shape it needs (a C++20 requires-expression, in a template so that
// only the branch taken is compiled), not for a version number, so a release that keeps a shape
// needs nothing here; a shape this file does not know stops the build with a message that names
// it. The members read through explicit instantiation
// (SavedVariable, RecordFunction, VariableVersion: torch_internals.cc) fail to compile by name
// when a release renames one.
#ifndef TORCHRR_RECORDER_TORCH_COMPAT_H_
#define TORCHRR_RECORDER_TORCH_COMPAT_H_

#include <memory>
#include <type_traits>
#include <utility>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR != 2 || TORCH_VERSION_MINOR < TORCHRR_TORCH_MIN_MINOR || \
    TORCH_VERSION_MINOR > TORCHRR_TORCH_MAX_MINOR
#error "torchrr: this torch is outside the range torchrr supports (cmake/TorchrrDeps.cmake); \
recorder/src/internals/torch_compat.h does not know its autograd internals"
#endif

namespace torchrr::recorder::compat {

// An owning pointer to an autograd node, as autograd's own edges hold one.
using NodePtr = std::remove_cvref_t<decltype(std::declval<torch::autograd::Edge>().function)>;

namespace detail {
template <typename Ptr>
struct WeakOf;
template <>
struct WeakOf<std::shared_ptr<torch::autograd::Node>> {
  using type = std::weak_ptr<torch::autograd::Node>;
};
template <>
struct WeakOf<c10::intrusive_ptr<torch::autograd::Node>> {
  using type = c10::weak_intrusive_ptr<torch::autograd::Node>;
};
}  // namespace detail

// A non-owning reference to a node that knows when the node is gone (lock() gives an empty
// NodePtr then). A build error here: autograd owns its nodes through a pointer type this file
// does not know.
using WeakNodePtr = typename detail::WeakOf<NodePtr>::type;

// A weak reference to `node`, which autograd owns (a node being created, or reached through an
// edge or a tensor's grad_fn). `Node` is torch::autograd::Node.
template <typename Node>
WeakNodePtr WeakRef(Node* node) {
  if constexpr (requires { node->weak_from_this(); }) {
    return node->weak_from_this();
  } else {
    return WeakNodePtr(c10::intrusive_ptr<Node>::reclaim_copy(node));
  }
}

// A new node of type `T` (derived from torch::autograd::Node), owned as autograd owns its nodes.
template <typename T, typename... Args>
NodePtr MakeNode(Args&&... args) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

// The Python object (a THPFunction) of a Python autograd.Function's node; `PyNode` is
// torch::autograd::PyNode, a template parameter so that only python/*.cc, which have Python's
// headers, instantiate it.
// Before 2.13 Node::pyobj() also exists, but is another object (the node's own Python wrapper,
// unset for a PyNode): `obj` is tested first.
template <typename PyNode>
auto* PythonObjectOf(PyNode& node) {
  if constexpr (requires { node.obj; }) {
    return node.obj;
  } else {
    return node.pyobj();
  }
}

// The node of a Python autograd.Function's ctx (THPFunction::cdata: a weak pointer to its PyNode
// before 2.13, an owning pointer after), or an empty NodePtr; `Function` is THPFunction.
template <typename Function>
NodePtr NodeOfFunction(Function& function) {
  if constexpr (requires { function.cdata.lock(); }) {
    return NodePtr(function.cdata.lock());
  } else {
    return NodePtr(function.cdata);
  }
}

// The object in a Python-object member of autograd's Python classes (PySavedVariableHooks'
// unpack_hook_), or nullptr: `Slot` is PyObject* or std::optional<c10::SafePyObject>;
// `Interpreter` is c10::impl::PyInterpreter. A borrowed reference.
template <typename Slot, typename Interpreter>
auto* SlotObject(const Slot& slot, const Interpreter* interpreter) {
  if constexpr (std::is_pointer_v<Slot>) {
    return slot;
  } else {
    return slot ? slot->ptr(interpreter) : nullptr;
  }
}

// Puts `object` in such a member, which takes the caller's reference to it, and drops the
// member's reference to what it held (through `decref`, Py_DecRef, or the SafePyObject's own).
// Holds the GIL.
template <typename Slot, typename Object, typename Interpreter, typename Decref>
void SetSlotObject(Slot& slot, Object* object, Interpreter* interpreter, Decref decref) {
  if constexpr (std::is_pointer_v<Slot>) {
    Object* old = slot;
    slot = object;
    if (old != nullptr) decref(old);
  } else {
    slot.emplace(object, interpreter);
  }
}

// The native handle (a cudaStream_t) of the stream the program's work on `device` is queued on,
// for a kernel of ours to run after that work. Where c10::Stream cannot give the handle, the
// stream is synchronized and nullptr (the legacy default stream) is returned: the same order, at
// the cost of a wait.
// `Guard` is c10::impl::DeviceGuardImplInterface.
template <typename Guard>
void* StreamToFollow(const Guard& guard, c10::Device device) {
  auto stream = guard.getStream(device);
  if constexpr (requires { stream.native_handle(); }) {
    return stream.native_handle();
  } else {
    guard.synchronizeStream(stream);
    return nullptr;
  }
}

}  // namespace torchrr::recorder::compat

#endif  // TORCHRR_RECORDER_TORCH_COMPAT_H_
