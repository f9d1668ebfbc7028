#include "internals/torch_internals.h"

#include <functional>
#include <variant>

#include <torch/csrc/autograd/custom_function.h>

#include "internals/private_access.h"

namespace torchrr::recorder {

// torch's private members, through MemberAccess (private_access.h).
struct VersionCounterTag { friend constexpr auto GetMember(VersionCounterTag); };
template struct MemberAccess<VersionCounterTag, &c10::VariableVersion::version_counter_>;

struct SavedDataTag { friend constexpr auto GetMember(SavedDataTag); };
struct SavedVersionTag { friend constexpr auto GetMember(SavedVersionTag); };
struct OutputNrTag { friend constexpr auto GetMember(OutputNrTag); };
struct DefaultConstructedTag { friend constexpr auto GetMember(DefaultConstructedTag); };
struct SavedOriginalTag { friend constexpr auto GetMember(SavedOriginalTag); };
struct IsLeafTag { friend constexpr auto GetMember(IsLeafTag); };
struct IsOutputTag { friend constexpr auto GetMember(IsOutputTag); };
struct HooksTag { friend constexpr auto GetMember(HooksTag); };
struct GradFnTag { friend constexpr auto GetMember(GradFnTag); };
struct GradAccumulatorTag { friend constexpr auto GetMember(GradAccumulatorTag); };
template struct MemberAccess<SavedDataTag, &torch::autograd::SavedVariable::data_>;
template struct MemberAccess<SavedVersionTag, &torch::autograd::SavedVariable::saved_version_>;
template struct MemberAccess<OutputNrTag, &torch::autograd::SavedVariable::output_nr_>;
template struct MemberAccess<DefaultConstructedTag,
                             &torch::autograd::SavedVariable::was_default_constructed_>;
template struct MemberAccess<SavedOriginalTag, &torch::autograd::SavedVariable::saved_original_>;
template struct MemberAccess<IsLeafTag, &torch::autograd::SavedVariable::is_leaf_>;
template struct MemberAccess<IsOutputTag, &torch::autograd::SavedVariable::is_output_>;
template struct MemberAccess<HooksTag, &torch::autograd::SavedVariable::hooks_>;
template struct MemberAccess<GradFnTag, &torch::autograd::SavedVariable::grad_fn_>;
template struct MemberAccess<GradAccumulatorTag,
                             &torch::autograd::SavedVariable::grad_accumulator_>;

struct ContextSavedTag { friend constexpr auto GetMember(ContextSavedTag); };
template struct MemberAccess<ContextSavedTag, &torch::autograd::AutogradContext::saved_variables_>;

struct StepCallbacksTag { friend constexpr auto GetMember(StepCallbacksTag); };
struct FnTag { friend constexpr auto GetMember(FnTag); };
template struct MemberAccess<StepCallbacksTag, &at::RecordFunction::step_callbacks_>;
template struct MemberAccess<FnTag, &at::RecordFunction::fn_>;

namespace {

using torch::autograd::SavedVariable;

// A stand-in for the T of CppNode<T>; never run.
struct StandInFunction : torch::autograd::Function<StandInFunction> {};

const auto& CounterPtr(const c10::TensorImpl& impl) {
  return impl.version_counter().*GetMember(VersionCounterTag{});
}

}  // namespace

const c10::FunctionSchema* SchemaOf(const at::RecordFunction& fn) {
  const auto* schema =
      std::get_if<std::reference_wrapper<const c10::FunctionSchema>>(&(fn.*GetMember(FnTag{})));
  return schema != nullptr ? &schema->get() : nullptr;
}

void SkipOutputsIfOnlyCallback(const at::RecordFunction& fn) {
  // The guards the dispatcher and autograd start callbacks on are never const objects.
  at::StepCallbacks& callbacks = const_cast<at::RecordFunction&>(fn).*GetMember(StepCallbacksTag{});
  if (callbacks.callbacks_.size() == 1) callbacks.needs_outputs_ = false;
}

const c10::intrusive_ptr_target* VersionCounterOf(const c10::TensorImpl& impl) {
  return CounterPtr(impl).get();
}

c10::weak_intrusive_ptr<c10::intrusive_ptr_target> WeakVersionCounter(const c10::TensorImpl& impl) {
  const auto& counter = CounterPtr(impl);  // The caller checked VersionCounterOf() != nullptr.
  // intrusive_ptr<Derived> -> weak_intrusive_ptr<Base>: the refcounts live in the base.
  c10::intrusive_ptr<c10::intrusive_ptr_target> base(counter);
  return c10::weak_intrusive_ptr<c10::intrusive_ptr_target>(base);
}

c10::intrusive_ptr<c10::intrusive_ptr_target> StrongVersionCounter(const c10::TensorImpl& impl) {
  if (!CounterPtr(impl)) return {};
  return c10::intrusive_ptr<c10::intrusive_ptr_target>(CounterPtr(impl));
}

uint32_t ReadVersionCounter(const c10::intrusive_ptr_target* counter) {
  if (counter == nullptr) return 0;
  // VersionCounter is { intrusive_ptr_target; std::atomic<uint32_t> version_; }.
  using CounterType = std::remove_cv_t<std::remove_reference_t<
      decltype(*(std::declval<const c10::VariableVersion&>().*GetMember(VersionCounterTag{})))>>;
  return static_cast<const CounterType*>(counter)->version_.load();
}

SavedVariableFacts ReadSavedVariable(const SavedVariable& saved) {
  SavedVariableFacts facts;
  const auto& hooks = saved.*GetMember(HooksTag{});
  const at::Tensor& data = saved.*GetMember(SavedDataTag{});
  facts.has_hooks = static_cast<bool>(hooks);
  facts.defined = facts.has_hooks || data.defined();
  facts.is_output = saved.*GetMember(IsOutputTag{});
  facts.saved_original = saved.*GetMember(SavedOriginalTag{});
  facts.is_leaf = saved.*GetMember(IsLeafTag{});
  facts.saved_version = saved.*GetMember(SavedVersionTag{});
  facts.output_nr = saved.*GetMember(OutputNrTag{});
  facts.data = data.defined() ? &data : nullptr;
  return facts;
}

bool SavedTensorMetadata(const torch::autograd::Node& node, const SavedVariable& saved,
                         c10::ScalarType* dtype, std::vector<int64_t>* shape) {
  // Under hooks, SavedVariable keeps no tensor, only what unpack needs to rebuild its autograd
  // meta: the node and output number of a saved output, the grad_fn or accumulator of an input.
  const torch::autograd::Node* owner = nullptr;
  uint32_t index = 0;
  // An output that needs no gradient (scaled_dot_product_attention's logsumexp) is a leaf: its
  // output_nr is the 0 of a tensor without history, not its place among the node's outputs, and
  // the node keeps no metadata of it. It has no grad accumulator either: no expectation.
  if (saved.*GetMember(IsOutputTag{}) && !(saved.*GetMember(IsLeafTag{}))) {
    owner = &node;
    index = saved.*GetMember(OutputNrTag{});
  } else if (const auto& grad_fn = saved.*GetMember(GradFnTag{})) {
    owner = grad_fn.get();
    index = saved.*GetMember(OutputNrTag{});
  } else if (const auto& accumulator = saved.*GetMember(GradAccumulatorTag{})) {
    owner = accumulator.get();
  }
  if (owner == nullptr || index >= owner->num_inputs()) return false;
  const torch::autograd::InputMetadata& meta = owner->input_metadata(index);
  if (meta.was_default_constructed() || meta.is_nested_tensor() || meta.is_tensor_subclass()) {
    return false;
  }
  shape->clear();
  for (const c10::SymInt& size : meta.shape_as_dim_vector()) {
    std::optional<int64_t> n = size.maybe_as_int();
    if (!n) return false;
    shape->push_back(*n);
  }
  *dtype = c10::typeMetaToScalarType(meta.dtype());
  return true;
}

const std::vector<SavedVariable>& CppNodeSavedVariables(torch::autograd::Node& node) {
  auto& cpp_node = static_cast<torch::autograd::CppNode<StandInFunction>&>(node);
  return cpp_node.ctx_.*GetMember(ContextSavedTag{});
}

}  // namespace torchrr::recorder
