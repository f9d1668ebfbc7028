// StandInCall: a custom node's op (an autograd.Function's apply, a compiled region's) as a small
// autograd.Function that keeps the recorded save and its version semantics.
#include <algorithm>
#include <cctype>
#include <optional>
#include <string_view>
#include <unordered_set>

#include "repro/python_call.h"
#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer::repro {
namespace {

using format::OpRecord;
using format::TensorInfo;
using format::TensorUse;

const char* const kStandInHelpersText = R"(

def output(seed, shape, dtype, device):
    """A stand-in's output: seeded values of the recorded metadata."""
    values = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return values.to(dtype=dtype, device=device)


def standin_backward(ctx, *grads):
    """A stand-in's backward: reads back what its forward saved (PyTorch checks their versions
    here) and returns gradients that depend on the saved values, so that a write to them shows."""
    saved = list(ctx.saved_tensors) + list(getattr(ctx, "unchecked", ()))
    total = sum(float(t.double().sum()) for t in saved if t is not None and t.is_floating_point())
    total += sum(float(g.double().sum()) for g in grads if g is not None and g.is_floating_point())
    return tuple(torch.full(shape, total, dtype=dtype, device=device) if needed else None
                 for (shape, dtype, device), needed in zip(ctx.input_meta, ctx.needs_input_grad))


def standin_write(t, bumps):
    """Writes t in place `bumps` times, one version bump each, as the op outside aten did; under
    no_grad, so that autograd's record of t stays the one its message names."""
    with torch.no_grad():
        for _ in range(bumps):
            t.logical_not_() if t.dtype == torch.bool else t.add_(1)
)";

// Names the script defines, and Python's keywords: a class of one of these names would shadow
// what the script calls, or not parse.
bool Taken(std::string_view name) {
  static constexpr std::string_view kTaken[] = {
      "torch", "sys", "aten", "call", "leaf", "output", "standin_backward", "standin_write",
      "run", "gen",
      "DEVICE", "False", "None", "True", "and", "as", "assert", "async", "await", "break",
      "class", "continue", "def", "del", "elif", "else", "except", "finally", "for", "from",
      "global", "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise",
      "return", "try", "while", "with", "yield"};
  for (std::string_view taken : kTaken) {
    if (name == taken) return true;
  }
  // The script's tensors: t14.
  return name.size() > 1 && name[0] == 't' &&
         name.find_first_not_of("0123456789", 1) == std::string_view::npos;
}

// The Function's class name: autograd names its node `<class>Backward`, so the stand-in's node,
// which PyTorch's message may name as a saved output's grad_fn, is named as the recorded one.
// "StandIn" when the recorded name is not a plain identifier.
std::string ClassName(const std::string& node_name) {
  std::string name = node_name;
  if (name.ends_with("Backward")) name.resize(name.size() - 8);
  return name.size() <= 64 && Identifier(name) && !Taken(name) ? name : "StandIn";
}

// The standin_write calls for what `op` wrote into `inputs` (its inputs, or those a stand-in
// takes), `expr(k)` naming input k, each line after `indent`: one per version counter, as a tensor
// passed twice, or a view and its base, share one and each of their uses records the counter's
// whole change. nullopt, with `why` set, when a tensor it wrote is not in the trace.
template <typename Expr>
std::optional<std::string> WritesOf(const OpRecord& op, const std::vector<TensorUse>& inputs,
                     const TraceIndex& index, Expr expr, std::string_view indent,
                     std::string* why) {
  const size_t at = index.IndexOf(op.op);
  std::string writes;
  std::unordered_set<format::ObjectId> counters;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const TensorUse& use = inputs[k];
    if (use.version_after <= use.version_before) continue;
    const TensorInfo* info = index.InfoBefore(use.tensor, at);
    if (info == nullptr) {
      *why = "a tensor " + Printable(index.Str(op.name)) + " wrote is not in the trace";
      return std::nullopt;
    }
    if (info->version_counter != 0 && !counters.insert(info->version_counter).second) continue;
    writes += std::string(indent) + "standin_write(" + expr(k) + ", " +
              std::to_string(use.version_after - use.version_before) + ")\n";
  }
  return writes;
}

std::string Meta(const TensorInfo& info) {
  return Ints(info.shape) + ", " + TorchDType(info.dtype) + ", " + DeviceExpr(info.device);
}

}  // namespace

const char* const kStandInHelpers = kStandInHelpersText;

std::string StandInCall(const OpRecord& op, const format::NodeRecord& node,
                        const TraceIndex& index, ObjectId counter, std::string* why) {
  const size_t at = index.IndexOf(op.op);
  const std::string name = ClassName(index.Str(node.name));
  const std::vector<TensorUse> inputs = index.CallInputs(op, counter);
  std::vector<const TensorInfo*> input_info;
  for (const TensorUse& use : inputs) input_info.push_back(index.InfoBefore(use.tensor, at));
  const std::vector<ObjectId> outputs = index.Outputs(op);
  std::vector<const TensorInfo*> output_info;
  for (ObjectId tensor : outputs) {
    output_info.push_back(tensor == 0 ? nullptr : index.OutputInfo(op, tensor));
  }
  if (outputs.empty()) {
    *why = Printable(index.Str(op.name)) + "'s outputs are not in the trace";
    return "";
  }

  std::string made;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const TensorInfo* info = output_info[k];
    if (info != nullptr && std::string_view(DTypeName(info->dtype)) == "unknown") {
      *why = "an output's dtype (" + std::to_string(info->dtype) + ") is not one torch names";
      return "";
    }
    made += std::string(k ? ", " : "") + "output(" + std::to_string(k + 1) + ", " +
            (info != nullptr ? Meta(*info) : "[], torch.float32, 'cpu'") + ")";
  }

  // What the node saved of the violation's counter: each as the input or output it is, a view of
  // one (the same version counter), or the same bytes. Its other saves are left out: no write
  // the script makes reaches them (a compiled region saves every parameter and activation).
  std::string saved, unchecked;
  for (const format::SavedTensor& s : node.saved) {
    if (!s.defined || s.version_counter != counter) continue;
    std::string expr;
    for (size_t k = 0; expr.empty() && k < inputs.size(); ++k) {
      if (inputs[k].tensor == s.tensor) expr = "inputs[" + std::to_string(k) + "]";
    }
    for (size_t k = 0; expr.empty() && k < outputs.size(); ++k) {
      if (outputs[k] != 0 && outputs[k] == s.tensor) expr = "outputs[" + std::to_string(k) + "]";
    }
    // An alias of an input or output (AOTAutograd saves detached ones): the base itself where
    // the layout is the same, else a view of its detached alias, which shares the counter
    // without being a view made under no_grad that autograd would refuse to see written; or the
    // same bytes under another counter.
    const TensorInfo* info = expr.empty() ? index.InfoBefore(s.tensor, at + 1) : nullptr;
    auto alias = [&](const std::string& base_expr, const TensorInfo* base) -> std::string {
      if (base == nullptr) return "";
      // The base's bytes under a counter of its own (inductor hands a saved view back so):
      // `.data` is such a tensor.
      if (base->version_counter != info->version_counter) {
        if (base->storage != info->storage || base->dtype != info->dtype) return "";
        return base_expr + ".data.as_strided(" + Ints(info->shape) + ", " + Ints(info->strides) +
               ", " + std::to_string(info->storage_offset) + ")";
      }
      if (base->shape == info->shape && base->strides == info->strides &&
          base->storage_offset == info->storage_offset) {
        return base_expr;
      }
      return base_expr + ".detach().as_strided(" + Ints(info->shape) + ", " +
             Ints(info->strides) + ", " + std::to_string(info->storage_offset) + ")";
    };
    for (size_t k = 0; expr.empty() && info != nullptr && k < inputs.size(); ++k) {
      expr = alias("inputs[" + std::to_string(k) + "]", input_info[k]);
    }
    for (size_t k = 0; expr.empty() && info != nullptr && k < outputs.size(); ++k) {
      expr = alias("outputs[" + std::to_string(k) + "]", output_info[k]);
    }
    if (expr.empty()) {
      *why = "the tensor " + Printable(index.Str(node.name)) +
             " saved is not one of its op's inputs or outputs, or a view of one";
      return "";
    }
    // Kept on ctx with no version check (AOTAutograd's `_tensors_no_vc_check` for a tensor an
    // autograd.Function stashed on its ctx), the stand-in keeps it so too.
    std::string& into = s.checked ? saved : unchecked;
    into += (into.empty() ? "" : ", ") + expr;
  }

  std::string call_args;
  for (const TensorUse& use : inputs) {
    call_args += (call_args.empty() ? "" : ", ") + Var(use.tensor);
  }
  // What its body wrote into its inputs (a Function whose forward writes in place: the culprit),
  // before what it saved, as the body did.
  const std::optional<std::string> writes = WritesOf(
      op, inputs, index, [](size_t k) { return "inputs[" + std::to_string(k) + "]"; },
      "        ", why);
  if (!writes) return "";
  std::string targets;
  for (ObjectId tensor : outputs) {
    targets += (targets.empty() ? "" : ", ") + (tensor == 0 ? std::string("_") : Var(tensor));
  }
  if (outputs.size() == 1) targets += ",";

  std::string text =
      "# A stand-in for " + Printable(index.Str(op.name)) +
      ",\n# whose body the script cannot call (an autograd.Function's, a compiled region's,\n"
      "# checkpointing's): it returns seeded tensors of the recorded outputs' metadata and\n"
      "# saves what " + Printable(index.Str(node.name)) +
      " saved that the write reaches,\n# so that backward checks its version as it did.\n"
      "class " + name + "(torch.autograd.Function):\n"
      "    @staticmethod\n"
      "    def forward(ctx, *inputs):\n"
      "        ctx.input_meta = [(x.shape, x.dtype, x.device) for x in inputs]\n" + *writes +
      "        outputs = [" + made + "]\n"
      "        ctx.save_for_backward(" + saved + ")\n" +
      (unchecked.empty() ? ""
                         : "        ctx.unchecked = (" + unchecked +
                               ",)  # saved with no version check, as recorded\n") +
      "        return tuple(outputs)\n"
      "\n"
      "    backward = staticmethod(standin_backward)\n"
      "\n\n";
  return text + targets + " = " + name + ".apply(" + call_args + ")";
}

std::string ForeignCall(const OpRecord& op, const TraceIndex& index, std::string* why) {
  std::string made, targets;
  for (const TensorUse& use : op.outputs) {
    // An output that is one of its inputs (a mutable schema's `Tensor(a!)`) is that tensor.
    if (std::any_of(op.inputs.begin(), op.inputs.end(),
                    [&](const TensorUse& in) { return in.tensor == use.tensor; })) {
      continue;
    }
    const TensorInfo* info = index.OutputInfo(op, use.tensor);
    if (info == nullptr || std::string_view(DTypeName(info->dtype)) == "unknown") {
      *why = "an output of " + Printable(index.Str(op.name)) + " has no metadata torch can make";
      return "";
    }
    targets += (targets.empty() ? "" : ", ") + Var(use.tensor);
    made += (made.empty() ? "" : ", ") + std::string("output(") + std::to_string(use.tensor) +
            ", " + Meta(*info) + ")" + (info->requires_grad ? ".requires_grad_()" : "");
  }
  const std::optional<std::string> writes =
      WritesOf(op, op.inputs, index, [&](size_t k) { return Var(op.inputs[k].tensor); }, "", why);
  if (!writes) return "";
  std::string text = "# A stand-in for " + Printable(index.Str(op.name)) +
                     ", an op outside aten (a torch.library or extension op)\n"
                     "# the script cannot call: it makes the op's outputs as seeded tensors of "
                     "the recorded\n# metadata and writes what the op wrote, one version bump "
                     "for each recorded.\n";
  if (!targets.empty()) text += targets + " = " + made + "\n";
  if (targets.empty() && writes->empty()) text += "pass  # it returned nothing and wrote nothing\n";
  text += *writes;
  text.pop_back();
  return text;
}

}  // namespace torchrr::replayer::repro
