#include "gradient_cut.h"

#include <algorithm>
#include <string_view>
#include <tuple>

namespace torchrr::replayer {
namespace {

using format::InternId;
using format::ObjectId;
using format::OpScope;

// PyTorch's words when the tensor backward was called on has no history
// (torch/csrc/autograd/autograd.cpp), and the warning a reentrant checkpoint gives first.
constexpr std::string_view kNoGradFnPhrase = "does not require grad and does not have a grad_fn";
constexpr std::string_view kCheckpointPhrase = "None of the inputs have requires_grad=True";

// Floating point and complex c10::ScalarTypes: Half, Float, Double, the complex ones, BFloat16,
// the float8 ones. Other outputs (indices, masks) carry no gradient by nature.
bool IsFloating(format::DType dtype) {
  return (dtype >= 5 && dtype <= 10) || dtype == 15 || (dtype >= 23 && dtype <= 28);
}

// The argument at `position` of the ATen op `name`, for the ops that take a module's parameters.
const char* ParameterArgument(std::string_view name, uint16_t position) {
  if (name == "aten::linear" || name == "aten::conv1d" || name == "aten::conv2d" ||
      name == "aten::conv3d" || name == "aten::convolution" || name == "aten::batch_norm" ||
      name == "aten::conv_transpose1d" || name == "aten::conv_transpose2d") {
    return position == 1 ? "weight" : position == 2 ? "bias" : nullptr;
  }
  if (name == "aten::embedding") return position == 0 ? "weight" : nullptr;
  if (name == "aten::layer_norm" || name == "aten::group_norm") {
    return position == 2 ? "weight" : position == 3 ? "bias" : nullptr;
  }
  if (name == "aten::rms_norm") return position == 2 ? "weight" : nullptr;
  return nullptr;
}

// "layers.1.mlp (LlamaMLP)" -> "layers.1.mlp"; "(Net)" -> "".
std::string PathOf(const std::string& module) {
  size_t space = module.rfind(" (");
  std::string path = space == std::string::npos ? module : module.substr(0, space);
  return path.starts_with("(") ? std::string() : path;
}

}  // namespace

const char* CutCauseName(CutCause cause) {
  switch (cause) {
    case CutCause::kNoGrad: return "no_grad";
    case CutCause::kInferenceMode: return "inference_mode";
    case CutCause::kDetach: return "detach";
    case CutCause::kItem: return "item";
    case CutCause::kNumpy: return "numpy";
    case CutCause::kReentrantCheckpoint: return "reentrant_checkpoint";
    case CutCause::kNoBackward: return "no_backward";
    case CutCause::kNoParameter: return "no_parameter";
  }
  return "unknown";
}

std::string CutParameterSummary(const std::vector<CutParameter>& parameters, uint64_t count) {
  if (count == 0) return "";
  std::vector<std::string> kinds;
  std::string numbered;  // "layers"
  std::vector<uint64_t> indices;
  bool one_numbered = true;
  for (const CutParameter& p : parameters) {
    std::vector<std::string> parts;
    for (size_t begin = 0; begin <= p.name.size();) {
      size_t dot = p.name.find('.', begin);
      if (dot == std::string::npos) dot = p.name.size();
      parts.push_back(p.name.substr(begin, dot - begin));
      begin = dot + 1;
    }
    auto is_index = [](const std::string& part) {
      return !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
        return c >= '0' && c <= '9';
      });
    };
    if (!parts.empty() && (parts.back() == "weight" || parts.back() == "bias")) parts.pop_back();
    std::string kind;
    for (auto it = parts.rbegin(); it != parts.rend() && kind.empty(); ++it) {
      if (!is_index(*it) && *it != "default") kind = *it;
    }
    if (kind.empty()) kind = "parameter";
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
    for (size_t i = 1; i < parts.size(); ++i) {
      if (!is_index(parts[i])) continue;
      if (numbered.empty()) numbered = parts[i - 1];
      one_numbered = one_numbered && numbered == parts[i - 1];
      uint64_t index = std::stoull(parts[i].substr(0, 18));
      if (std::find(indices.begin(), indices.end(), index) == indices.end()) {
        indices.push_back(index);
      }
      break;
    }
  }
  std::string text = std::to_string(count) + " ";
  for (size_t i = 0; i < kinds.size() && i < 4; ++i) text += (i ? "/" : "") + kinds[i];
  if (kinds.size() > 4) text += "/...";
  if (!indices.empty() && one_numbered) {
    std::sort(indices.begin(), indices.end());
    text += " in " + numbered + " " + NumberRanges(indices);
  }
  return text;
}

std::string CutHelp(CutCause cause) {
  switch (cause) {
    case CutCause::kNoGrad:
      return "this op ran under torch.no_grad() (or set_grad_enabled(False)): run the part that "
             "trainable parameters feed outside it";
    case CutCause::kInferenceMode:
      return "this op ran under torch.inference_mode(), whose tensors never carry a gradient: run "
             "the training forward outside it";
    case CutCause::kDetach:
      return "detach() stops the gradient here: use the tensor itself in what the loss computes";
    case CutCause::kItem:
      return ".item() made the values a Python number, and a tensor made from it has no history: "
             "keep the tensor in what the loss computes";
    case CutCause::kNumpy:
      return "the values left autograd here (detach() for .numpy(), or a raw pointer) and came "
             "back as a new tensor with no history: compute that part with torch ops";
    case CutCause::kReentrantCheckpoint:
      return "checkpoint(use_reentrant=True) runs its function under no_grad, and its output has "
             "no grad_fn when none of its inputs requires grad (a frozen embedding before "
             "adapters): call model.enable_input_require_grads() before training, or checkpoint "
             "with use_reentrant=False (gradient_checkpointing_enable(gradient_checkpointing_"
             "kwargs={\"use_reentrant\": False}))";
    case CutCause::kNoBackward:
      return "this op's output has no autograd node though an input requires grad (a buffer a raw "
             "kernel fills, a kernel without backward): give it a backward "
             "(torch.autograd.Function, torch.library.register_autograd)";
    case CutCause::kNoParameter:
      return "no recorded op connects the loss to a tensor that requires grad: every parameter it "
             "reads is frozen (requires_grad=False), or its values came from outside autograd; "
             "unfreeze what should train";
  }
  return "";
}

void GradientCutWatch::OnString(const format::StringDef& r) {
  if (r.text == "aten::detach") detach_ = r.id;
  if (r.text == "aten::detach_") detach_inplace_ = r.id;
  if (r.text == "aten::item") item_ = r.id;
  if (r.text == "aten::_local_scalar_dense") local_scalar_ = r.id;
  if (r.text == "aten::tolist") tolist_ = r.id;
  if (r.text == "CheckpointFunction") checkpoint_function_ = r.id;
}

void GradientCutWatch::Set(uint32_t slot, uint32_t cut) {
  if (slot >= tainted_.size()) {
    tainted_.resize(std::max<size_t>(slot + 1, tainted_.size() * 2), 0);
    cut_.resize(tainted_.size(), 0);
  }
  tainted_[slot] = 1;
  cut_[slot] = cut;
}

// Under no_grad, or inference_mode: an inference tensor has no version counter.
CutCause GradientCutWatch::NoGradCause(const format::OpRecord& r) const {
  for (const format::TensorUse& out : r.outputs) {
    const TensorState* t = state_.FindTensor(out.tensor);
    if (t != nullptr) return t->counter == 0 ? CutCause::kInferenceMode : CutCause::kNoGrad;
  }
  return CutCause::kNoGrad;
}

uint32_t GradientCutWatch::NewCut(const format::OpRecord& r, CutCause cause) {
  // One cut per line and cause: a loop over layers cuts at the same line each time. Ops without
  // a stack are told apart by id, up to a bound on what a trace can make us keep.
  const uint64_t where = r.stack != 0 ? r.stack : (uint64_t{1} << 40) + r.op;
  auto key = std::make_pair(where, static_cast<uint8_t>(cause));
  if (auto it = cut_by_line_.find(key); it != cut_by_line_.end()) return it->second + 1;
  // 64 Ki cuts: far more lines than a program has; a trace past that shares the last one.
  if (cuts_.size() >= (1u << 16)) return static_cast<uint32_t>(cuts_.size());
  cuts_.push_back({cause, r.op, 0});
  cut_by_line_[key] = static_cast<uint32_t>(cuts_.size() - 1);
  return static_cast<uint32_t>(cuts_.size());
}

void GradientCutWatch::NoteParameterUse(const format::OpRecord& r, const format::TensorUse& use) {
  auto [it, inserted] = parameters_.try_emplace(use.tensor);
  Parameter& p = it->second;
  if (inserted) {
    // 1 Mi parameters: more tensors than any model has; past that they go unnamed in reports.
    if (parameter_order_.size() < (1u << 20)) parameter_order_.push_back(use.tensor);
    p.module = r.module_path;
    p.name = PathOf(state_.Str(r.module_path));
  }
  if (!p.named_by_argument) {
    if (const char* argument = ParameterArgument(state_.Str(r.name), use.position)) {
      const std::string path = PathOf(state_.Str(r.module_path));
      p.name = path.empty() ? argument : path + "." + argument;
      p.module = r.module_path;
      p.named_by_argument = true;
    }
  }
  if (!r.grad_mode) {
    const uint32_t cut = NewCut(r, NoGradCause(r));
    if (std::find(p.cuts.begin(), p.cuts.end(), cut) == p.cuts.end()) {
      if (p.cuts.size() == Parameter::kMaxCuts) p.cuts.erase(p.cuts.begin());
      p.cuts.push_back(cut);
    }
  }
}

void GradientCutWatch::OnOp(const format::OpRecord& r) {
  if (r.scope == OpScope::kBackwardFunction) {
    escapes_.clear();
    return;
  }
  if (r.scope != OpScope::kFunction) return;
  bool tainted_input = false;
  bool requires_grad_input = false;
  uint32_t input_cut = 0;
  for (const format::TensorUse& use : r.inputs) {
    uint32_t slot = state_.index.Find(use.tensor, IdKind::kTensor);
    if (slot == IdIndex::kAbsent) continue;
    const TensorState& t = state_.tensors[slot];
    bool parameter = t.is_leaf && t.requires_grad;
    if (parameter && !OwnsCounter(t, use.tensor)) {
      // A view made under no_grad reads as a leaf that requires grad too; it shares the
      // version counter of its base, which required grad before it.
      parameter = false;
      Set(slot, CutOf(slot));
    }
    if (parameter) NoteParameterUse(r, use);
    if (!parameter && !Tainted(slot)) continue;
    tainted_input = true;
    requires_grad_input = requires_grad_input || t.requires_grad;
    if (input_cut == 0 && !t.requires_grad) input_cut = CutOf(slot);
  }
  if (r.name != 0 && (r.name == item_ || r.name == local_scalar_ || r.name == tolist_) &&
      requires_grad_input && escapes_.size() < 64) {
    escapes_.emplace_back(r.op, CutCause::kItem);
  }
  const bool detach = r.name != 0 && (r.name == detach_ || r.name == detach_inplace_);
  if (detach && requires_grad_input && r.grad_mode && escapes_.size() < 64) {
    escapes_.emplace_back(r.op, CutCause::kDetach);
  }
  for (const format::TensorUse& use : r.outputs) {
    uint32_t slot = state_.index.Find(use.tensor, IdKind::kTensor);
    if (slot == IdIndex::kAbsent) continue;
    const TensorState& t = state_.tensors[slot];
    if (t.requires_grad) {
      OwnsCounter(t, use.tensor);
      Set(slot, 0);  // Computed from a leaf that requires grad, and still carrying it.
    } else if (tainted_input && IsFloating(t.dtype)) {
      uint32_t cut = input_cut;
      if (cut == 0 && requires_grad_input) {
        cut = NewCut(r, !r.grad_mode ? NoGradCause(r)
                        : detach     ? CutCause::kDetach
                                     : CutCause::kNoBackward);
      }
      Set(slot, cut);
    }
    if (r.parent == 0 && IsFloating(t.dtype) && !t.requires_grad) {
      last_output_[r.thread] = {r.op, use.tensor};
      last_output_thread_ = r.thread;
    }
  }
}

void GradientCutWatch::OnError(const format::ErrorRecord& r) {
  if (r.message.find(kNoGradFnPhrase) == std::string::npos &&
      r.message.find(kCheckpointPhrase) == std::string::npos) {
    return;
  }
  RaisedError error;
  error.message = r.message;
  auto it = last_output_.find(r.thread);
  // The error's thread when it has one of its own, else the thread of the latest such op.
  if (it == last_output_.end()) it = last_output_.find(last_output_thread_);
  if (it != last_output_.end()) std::tie(error.loss_op, error.loss_tensor) = it->second;
  error.escapes = escapes_;
  raised_ = std::move(error);
}

ObjectId GradientCutWatch::CheckpointAround(ObjectId op) const {
  if (checkpoint_function_ == 0) return 0;
  for (int depth = 0; op != 0 && depth < 256; ++depth) {
    const OpInfo* info = state_.FindOp(op);
    if (info == nullptr) return 0;
    if (info->name == checkpoint_function_) return op;
    op = info->parent;
  }
  return 0;
}

bool GradientCutWatch::OwnsCounter(const TensorState& t, ObjectId tensor) {
  if (t.counter == 0) return true;
  uint32_t slot = state_.index.Find(t.counter, IdKind::kCounter);
  if (slot == IdIndex::kAbsent) return true;
  ObjectId& first = state_.counters[slot].first_grad_tensor;
  if (first == 0) first = tensor;
  return first == tensor;
}

uint64_t GradientCutWatch::UserLineOf(ObjectId op) const {
  const OpInfo* info = state_.FindOp(op);
  if (info == nullptr || info->stack == 0) return (uint64_t{1} << 63) + op;
  if (info->stack < state_.stacks.size()) {
    for (InternId frame : state_.stacks[info->stack]) {
      if (frame == 0 || frame >= state_.frames.size()) continue;
      const format::FrameDef& f = state_.frames[frame];
      if (!f.framework && f.file != 0) return (uint64_t{f.file} << 32) | f.line;
    }
  }
  return (uint64_t{1} << 62) + info->stack;
}

void GradientCutWatch::AddFinding(CutFinding finding, const std::vector<ObjectId>& ids) {
  finding.parameter_count = ids.size();
  for (ObjectId id : ids) {
    if (finding.parameters.size() >= GradientCut::kMaxListed) break;
    const Parameter& p = parameters_.at(id);
    finding.parameters.push_back({id, p.name, p.module});
  }
  state_.cut_findings.push_back(std::move(finding));
}

void GradientCutWatch::Finish() {
  // Causes: an op under no_grad inside a CheckpointFunction is the reentrant checkpoint's.
  for (Cut& cut : cuts_) {
    if (cut.cause != CutCause::kNoGrad) continue;
    cut.checkpoint = CheckpointAround(cut.op);
    if (cut.checkpoint != 0) cut.cause = CutCause::kReentrantCheckpoint;
  }
  // What a report groups by: the line of the checkpoint call, else of the cutting op.
  auto group_of = [&](uint32_t cut) -> std::pair<uint64_t, uint8_t> {
    const Cut& c = cuts_[cut - 1];
    ObjectId op = c.checkpoint != 0 ? c.checkpoint : c.op;
    return std::make_pair(UserLineOf(op), static_cast<uint8_t>(c.cause));
  };
  std::unordered_map<ObjectId, bool> reached;
  for (const NodeState& node : state_.nodes) {
    if (node.variable != 0 && node.last_pass != UINT64_MAX) reached[node.variable] = true;
  }
  // Frozen since (requires_grad_(False) after it was used, as when a model is built and then
  // its base frozen): not trainable, whatever it was then. And only what an op takes as a
  // module's weight or bias is named a parameter: a view of an activation that a checkpoint's
  // no_grad forward made reads as a leaf that requires grad too.
  for (ObjectId id : parameter_order_) {
    const TensorState* t = state_.FindTensor(id);
    if (t == nullptr || !t->requires_grad || !parameters_.at(id).named_by_argument) {
      reached[id] = true;
    }
  }
  auto unreached_in = [&](std::pair<uint64_t, uint8_t> group) {
    std::vector<ObjectId> ids;
    for (ObjectId id : parameter_order_) {
      const Parameter& p = parameters_.at(id);
      if (reached.contains(id)) continue;
      for (uint32_t cut : p.cuts) {
        if (group_of(cut) == group) {
          ids.push_back(id);
          break;
        }
      }
    }
    return ids;
  };

  std::optional<std::pair<uint64_t, uint8_t>> raised_group;
  if (raised_) {
    CutFinding finding;
    finding.raised = true;
    finding.message = raised_->message;
    finding.loss_op = raised_->loss_op;
    finding.cause = CutCause::kNoParameter;
    std::vector<ObjectId> ids;
    uint32_t slot = state_.index.Find(raised_->loss_tensor, IdKind::kTensor);
    uint32_t cut = slot == IdIndex::kAbsent ? 0 : CutOf(slot);
    if (cut != 0) {
      const Cut& c = cuts_[cut - 1];
      finding.cause = c.cause;
      finding.op = c.op;
      finding.checkpoint = c.checkpoint;
      raised_group = group_of(cut);
      ids = unreached_in(*raised_group);
    } else if (!raised_->escapes.empty() && (slot == IdIndex::kAbsent || !Tainted(slot))) {
      // The loss's values left autograd on the way (a Python number, a NumPy array) and came
      // back as a tensor no recorded op made from a parameter: the last exit is the cut.
      const auto& [op, how] = raised_->escapes.back();
      finding.cause = how == CutCause::kDetach ? CutCause::kNumpy : how;
      finding.op = op;
    }
    AddFinding(std::move(finding), ids);
  }
  // A backward that ran and never reached parameters a reentrant checkpoint cut off.
  if (state_.pass_count == 0) return;
  std::vector<std::pair<std::pair<uint64_t, uint8_t>, uint32_t>> groups;  // With a cut of each.
  for (ObjectId id : parameter_order_) {
    const Parameter& p = parameters_.at(id);
    if (reached.contains(id)) continue;
    for (uint32_t cut : p.cuts) {
      if (cuts_[cut - 1].cause != CutCause::kReentrantCheckpoint) continue;
      auto group = group_of(cut);
      if (group == raised_group) continue;
      if (std::find_if(groups.begin(), groups.end(), [&](const auto& g) {
            return g.first == group;
          }) == groups.end()) {
        groups.emplace_back(group, cut);
      }
    }
  }
  for (const auto& [group, cut_index] : groups) {
    std::vector<ObjectId> ids = unreached_in(group);
    const Cut& c = cuts_[cut_index - 1];
    CutFinding finding;
    finding.cause = c.cause;
    finding.op = c.op;
    finding.checkpoint = c.checkpoint;
    finding.backward_passes = state_.pass_count;
    AddFinding(std::move(finding), ids);
  }
}

}  // namespace torchrr::replayer
