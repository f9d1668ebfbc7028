#include "non_finite.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>

namespace torchrr::replayer {
namespace {

using format::ValueRange;

// Bounds the values kept: a long trace has a value per op output. Past it, finite values are no
// longer kept (an input not found reads as finite), non-finite ones still are.
constexpr size_t kMaxFiniteValues = size_t{1} << 23;

// c10::ScalarType codes (format::DType).
constexpr format::DType kHalf = 5;
constexpr format::DType kFloat = 6;
constexpr format::DType kDouble = 7;
constexpr format::DType kBFloat16 = 15;

bool HasNan(uint8_t flags) { return (flags & ValueRange::kNan) != 0; }
bool HasInf(uint8_t flags) { return (flags & (ValueRange::kPosInf | ValueRange::kNegInf)) != 0; }

bool NameIs(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string_view Bare(std::string_view name) {
  if (name.starts_with("aten::")) name.remove_prefix(6);
  while (name.ends_with('_')) name.remove_suffix(1);
  return name;
}

bool IsSoftmax(std::string_view name) {
  name = Bare(name);
  return NameIs(name, {"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax",
                       "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                       "_scaled_dot_product_efficient_attention",
                       "_scaled_dot_product_flash_attention_for_cpu"}) ||
         name.starts_with("SoftmaxBackward") || name.starts_with("LogSoftmaxBackward");
}

// Ops that give NaN or Inf at zero or below in their domain, forward or as a backward node.
bool IsDomainOp(std::string_view name) {
  name = Bare(name);
  for (std::string_view op : {"log", "log2", "log10", "log1p", "sqrt", "rsqrt", "div",
                              "reciprocal", "pow", "acos", "asin", "atanh", "xlogy", "true_divide",
                              "floor_divide", "remainder", "fmod", "digamma", "lgamma"}) {
    if (name == op) return true;
    // Backward nodes: "SqrtBackward0", "DivBackward0", "PowBackward1".
    std::string node(op);
    node[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(node[0])));
    if (name.starts_with(node + "Backward")) return true;
  }
  return false;
}

// Ops a program writes an infinity with on purpose (a -inf attention mask).
bool WritesFill(std::string_view name) {
  name = Bare(name);
  return NameIs(name, {"full", "fill", "masked_fill", "new_full", "full_like", "scalar_tensor",
                       "index_fill", "masked_scatter"});
}

}  // namespace

const char* NonFiniteCauseName(NonFiniteCause cause) {
  static constexpr std::array<const char*, 7> kNames = {
      "overflow", "domain", "masked_row", "where_trap", "data", "optimizer", "other"};
  const auto i = static_cast<size_t>(cause);
  return i < kNames.size() ? kNames[i] : "other";
}

double DTypeMax(format::DType dtype) {
  switch (dtype) {
    case kHalf: return 65504.0;
    case kBFloat16: return 3.3895313892515355e38;
    case kFloat: return 3.4028234663852886e38;
    case kDouble: return 1.7976931348623157e308;
    default: return 0;
  }
}

std::string NonFiniteHelp(NonFiniteCause cause) {
  switch (cause) {
    case NonFiniteCause::kOverflow:
      return "compute this op in float32 (upcast its inputs, or run it outside autocast), use "
             "bfloat16 instead of float16, or scale the values down before it (a GradScaler "
             "for gradients)";
    case NonFiniteCause::kDomain:
      return "keep the argument in the function's domain: clamp it (x.clamp_min(eps)) or add an "
             "epsilon before log, sqrt or a division";
    case NonFiniteCause::kMaskedRow:
      return "a row whose every score is masked gives NaN: mask with torch.finfo(dtype).min "
             "instead of -inf, or leave at least one position unmasked per row";
    case NonFiniteCause::kWhereTrap:
      return "torch.where keeps the gradient of both branches: make the untaken branch safe "
             "before the op (torch.where(mask, x, 1.0) inside log or sqrt), not after it";
    case NonFiniteCause::kData:
      return "the tensor held it when the step read it: check the batch (or buffer, or weight) "
             "where it is made, or filter it with torch.isfinite before the step";
    case NonFiniteCause::kOptimizer:
      return "the update itself overflowed: lower the learning rate, clip gradients "
             "(torch.nn.utils.clip_grad_norm_), or raise the optimizer's eps in half precision";
    case NonFiniteCause::kOther:
      return "the op made it from finite inputs: check its arguments at this line";
  }
  return "";
}

void NonFiniteWatch::OnOp(const format::OpRecord& r, uint64_t step, uint64_t marked_step) {
  const std::string_view name = state_.Str(r.name);
  ++order_;
  if (name == "WhereBackward0") {
    where_steps_.insert(step);
    where_marked_steps_.insert(marked_step);
  }
  const bool ranged_inputs = r.input_ranges.size() == r.inputs.size();
  if (!r.input_ranges.empty() || !r.output_ranges.empty()) state_.ranges_recorded = true;
  std::vector<uint64_t>& inputs = input_keys_;
  inputs.clear();
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const uint64_t key = Key(r.inputs[i].tensor, r.inputs[i].version_before);
    inputs.push_back(key);
    auto it = values_.find(key);
    if (it != values_.end()) {
      it->second.consumed = true;
      continue;
    }
    if (ranged_inputs && r.input_ranges[i].checked()) {
      const ValueRange& range = r.input_ranges[i];
      if (!range.finite() || values_.size() < kMaxFiniteValues) {
        values_[key] = Value{range.flags, range.max_abs, 0, true, r.op,
                             r.inputs[i].version_after != r.inputs[i].version_before};
      }
    }
  }
  // What the program read to the host, or started backward from.
  if (r.parent == 0 && NameIs(Bare(name), {"item", "_local_scalar_dense", "ones_like"})) {
    read_keys_.insert(inputs.begin(), inputs.end());
  }
  if (name == "aten::_amp_foreach_non_finite_check_and_unscale_") {
    scaler_checks_.push_back({{step, marked_step}, inputs});
  }
  if (r.scope == format::OpScope::kBackwardFunction) {
    exec_index_[r.op] = static_cast<uint32_t>(execs_.size());
    Exec exec{r.op, 0, r.name, order_, step, marked_step, -1, inputs};
    // The gradients' dtype, which the node's own output shares.
    for (const format::TensorUse& in : r.inputs) {
      if (const TensorState* t = state_.FindTensor(in.tensor)) {
        exec.dtype = t->dtype;
        break;
      }
    }
    execs_.push_back(std::move(exec));
    return;
  }
  if (r.output_ranges.size() != r.outputs.size()) return;
  // An allocation's outputs hold whatever the memory held until they are written, and a
  // collective's get their bytes at its work's wait() (recorders leave both unchecked).
  if (format::HasUnwrittenOutputs(name)) return;
  uint8_t out_flags = 0;
  for (const ValueRange& range : r.output_ranges) out_flags |= range.flags;
  const auto index = static_cast<uint32_t>(ops_.size());
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    const ValueRange& range = r.output_ranges[i];
    if (!range.checked()) continue;
    if (range.finite() && values_.size() >= kMaxFiniteValues) continue;
    values_[Key(r.outputs[i].tensor, r.outputs[i].version_after)] =
        Value{range.flags, range.max_abs, range.finite() ? 0 : index + 1, false, 0};
  }
  if ((out_flags & ValueRange::kNonFinite) == 0) return;
  Op op;
  op.op = r.op;
  op.name = r.name;
  op.order = order_;
  op.step = step;
  op.marked_step = marked_step;
  op.out_flags = out_flags;
  op.inputs = inputs;
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    const ValueRange& range = r.output_ranges[i];
    if (!range.checked() || range.finite()) continue;
    op.outputs.push_back(Key(r.outputs[i].tensor, r.outputs[i].version_after));
    if (const TensorState* t = state_.FindTensor(r.outputs[i].tensor)) {
      if (op.dtype < 0) op.dtype = t->dtype;
      // An in-place write into a leaf that requires grad: a parameter's update.
      if (t->is_leaf && t->requires_grad &&
          r.outputs[i].version_after != r.outputs[i].version_before) {
        op.writes_parameter = true;
      }
    }
  }
  if (WritesFill(name)) {
    for (const format::Value& v : r.values) {
      if (v.kind == format::ValueKind::kDouble && std::isinf(v.d)) op.writes_inf_on_purpose = true;
    }
  }
  op_index_[r.op] = index;
  ops_.push_back(std::move(op));
}

void NonFiniteWatch::OnNodeExec(const format::NodeExecRecord& r) {
  auto it = exec_index_.find(r.op);
  if (it != exec_index_.end()) execs_[it->second].node = r.node;
}

// An op that is, or runs inside, a collective: its outputs get their bytes at the work's wait(),
// after the op ended and was scanned.
bool NonFiniteWatch::InsideCollective(const Op& op) const {
  format::ObjectId id = op.op;
  for (int depth = 0; id != 0 && depth < 64; ++depth) {
    const OpInfo* info = state_.FindOp(id);
    if (info == nullptr) return false;
    if (format::IsCollectiveOp(state_.Str(info->name))) return true;
    id = info->parent;
  }
  return false;
}

uint8_t NonFiniteWatch::FlagsOf(uint64_t key) const {
  auto it = values_.find(key);
  return it == values_.end() ? 0 : it->second.flags;
}

NonFiniteWatch::Root NonFiniteWatch::DataRoot(uint64_t key, bool on_purpose) const {
  Root root;
  auto it = values_.find(key);
  if (it != values_.end() && it->second.overwritten) {
    return root;  // None: no data came in, the op wrote over whatever the memory held.
  }
  // First read through a view: a buffer made where no op was recorded (DDP's buckets, in its
  // C++ reducer) may be memory not yet written; data is what an op computes with.
  if (it != values_.end()) {
    if (const OpInfo* reader = state_.FindOp(it->second.reader)) {
      if (NameIs(Bare(state_.Str(reader->name)),
                 {"as_strided", "view", "_reshape_alias", "reshape", "slice", "select", "narrow",
                  "expand", "t", "transpose", "permute", "unsqueeze", "squeeze", "detach",
                  "alias", "split", "split_with_sizes", "chunk", "unbind", "unflatten",
                  "flatten", "view_as"})) {
        return root;
      }
    }
  }
  root.kind = Root::kData;
  root.data = key;
  root.on_purpose = on_purpose;
  auto value = values_.find(key);
  if (value != values_.end()) {
    auto reader = op_index_.find(value->second.reader);
    if (reader != op_index_.end()) root.order = ops_[reader->second].order;
    auto exec = exec_index_.find(value->second.reader);
    if (exec != exec_index_.end()) root.order = execs_[exec->second].order;
  }
  return root;
}

NonFiniteWatch::Root NonFiniteWatch::Earlier(const Root& a, const Root& b) {
  if (!a.valid()) return b;
  if (!b.valid()) return a;
  // A root written on purpose explains less than one that was not.
  if (a.on_purpose != b.on_purpose) return a.on_purpose ? b : a;
  return b.order < a.order ? b : a;
}

// The root of op `index`'s NaN (`nan`) or Inf, from its inputs' roots (computed before it: an
// op's inputs were made by ops recorded before it).
NonFiniteWatch::Root NonFiniteWatch::Follow(const Op& op, uint32_t index, bool nan,
                                            const std::vector<Root>& nan_roots,
                                            const std::vector<Root>& inf_roots) const {
  if (InsideCollective(op)) return Root{};
  Root carried, inf_source;
  bool over_garbage = false;
  bool unknown_source = false;  // An input held it, from nowhere this watch can name.
  for (uint64_t key : op.inputs) {
    auto it = values_.find(key);
    if (it == values_.end()) continue;
    const Value& v = it->second;
    // An op that returns its input as it was (lift_fresh): the value is its own output now.
    if (v.producer == index + 1) continue;
    over_garbage = over_garbage || (v.overwritten && (v.flags & ValueRange::kNonFinite) != 0);
    if (nan ? HasNan(v.flags) : HasInf(v.flags)) {
      // An Inf that came in is a mask the program made.
      const Root from = v.producer != 0 ? (nan ? nan_roots : inf_roots)[v.producer - 1]
                                        : DataRoot(key, !nan);
      carried = Earlier(carried, from);
      unknown_source = unknown_source || !from.valid();
    }
    if (nan && HasInf(v.flags)) {
      inf_source = Earlier(inf_source,
                           v.producer != 0 ? inf_roots[v.producer - 1] : DataRoot(key, true));
    }
  }
  if (carried.valid()) return carried;
  // It wrote into memory that held a NaN or Inf no op made (a buffer never written, filled part
  // by part, some of it by writes no op records, as FSDP2's all-gather does): what it left there
  // is not known to be its own.
  if (over_garbage || unknown_source) return Root{};
  // A NaN made of infinities: where the Inf was made, unless it was written on purpose.
  if (nan && inf_source.valid() && !inf_source.on_purpose) {
    inf_source.became_nan = index;
    return inf_source;
  }
  Root self;
  self.kind = Root::kOp;
  self.index = index;
  self.order = op.order;
  self.on_purpose = !nan && op.writes_inf_on_purpose;
  return self;
}

// The root of each execution's non-finite gradient input, in execution order: a gradient made by
// a forward op (the seed) is followed as a forward value; one no op made came from the nodes
// whose edges lead to this one and that ran before it: the first of those whose own inputs were
// finite made it.
void NonFiniteWatch::ExecRoots(std::vector<Root>& roots) const {
  roots.assign(execs_.size(), Root{});
  // Executions by the node their edges lead to, in order.
  std::unordered_map<format::ObjectId, std::vector<uint32_t>> senders;
  for (uint32_t i = 0; i < execs_.size(); ++i) {
    const Exec& e = execs_[i];
    uint32_t slot = state_.index.Find(e.node, IdKind::kNode);
    if (e.node == 0 || slot == IdIndex::kAbsent) continue;
    const NodeState& node = state_.nodes[slot];
    for (uint32_t k = 0; k < node.edges_count; ++k) {
      const format::ObjectId next = state_.edges[node.edges_begin + k];
      if (next != 0) senders[next].push_back(i);
    }
  }
  std::vector<bool> fed_non_finite(execs_.size(), false);
  // A node run once per step (a parameter's AccumulateGrad) hears only from the senders that ran
  // since its previous execution.
  std::unordered_map<format::ObjectId, uint32_t> previous;
  for (uint32_t i = 0; i < execs_.size(); ++i) {
    const Exec& e = execs_[i];
    auto [last, first_run] = previous.try_emplace(e.node, i);
    const int64_t since = first_run ? -1 : static_cast<int64_t>(last->second);
    last->second = i;
    Root root;
    bool unexplained = false;
    for (uint64_t key : e.inputs) {
      auto it = values_.find(key);
      if (it == values_.end() || (it->second.flags & ValueRange::kNonFinite) == 0) continue;
      fed_non_finite[i] = true;
      if (it->second.producer != 0) continue;  // A forward value: followed there.
      unexplained = true;
    }
    if (!unexplained) continue;
    auto from = senders.find(e.node);
    if (from != senders.end()) {
      for (uint32_t sender : from->second) {
        if (sender >= i) break;
        if (static_cast<int64_t>(sender) <= since) continue;
        Root made;
        if (fed_non_finite[sender] && roots[sender].valid()) {
          made = roots[sender];
        } else if (!fed_non_finite[sender]) {
          made.kind = Root::kExec;
          made.index = sender;
          made.order = execs_[sender].order;
        }
        root = Earlier(root, made);
      }
    }
    if (!root.valid()) {
      for (uint64_t key : e.inputs) {
        if ((FlagsOf(key) & ValueRange::kNonFinite) != 0) {
          root = Earlier(root, DataRoot(key, false));
        }
      }
    }
    roots[i] = root;
  }
}

void NonFiniteWatch::Finish() {
  const bool marked = state_.steps != 0;
  // Steps a GradScaler skipped: its check read a non-finite gradient.
  std::unordered_set<uint64_t> scaler;
  for (const auto& [steps, inputs] : scaler_checks_) {
    for (uint64_t key : inputs) {
      if ((FlagsOf(key) & ValueRange::kNonFinite) != 0) {
        scaler.insert(marked ? steps.second : steps.first);
        break;
      }
    }
  }
  state_.scaler_skipped_steps = scaler.size();
  if (ops_.empty() && execs_.empty()) return;

  std::vector<Root> nan_roots(ops_.size()), inf_roots(ops_.size()), exec_roots;
  for (uint32_t i = 0; i < ops_.size(); ++i) {
    if (HasNan(ops_[i].out_flags)) nan_roots[i] = Follow(ops_[i], i, true, nan_roots, inf_roots);
    if (HasInf(ops_[i].out_flags)) inf_roots[i] = Follow(ops_[i], i, false, nan_roots, inf_roots);
  }
  ExecRoots(exec_roots);

  // The sinks: what a non-finite value reached. The earliest root among them is the verdict.
  Root first;
  bool first_nan = false;
  const char* first_reached = "";
  std::unordered_set<uint64_t> sink_steps;
  auto consider = [&](const Root& root, bool nan, const char* reached, uint64_t step) {
    if (!root.valid()) return;
    sink_steps.insert(step);
    const Root earlier = Earlier(first, root);
    if (!first.valid() || !earlier.same(first)) {
      first = earlier;
      first_nan = nan;
      first_reached = reached;
    }
  };
  for (uint32_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    const uint64_t step = marked ? op.marked_step : op.step;
    bool reached_loss = false;
    for (uint64_t key : op.outputs) {
      auto it = values_.find(key);
      if ((it != values_.end() && !it->second.consumed) || read_keys_.count(key) != 0) {
        reached_loss = true;
      }
    }
    if (!op.writes_parameter && !reached_loss) continue;
    if (scaler.count(step) != 0 && !op.writes_parameter) continue;
    const bool nan = HasNan(op.out_flags);
    consider(nan ? nan_roots[i] : inf_roots[i], nan, op.writes_parameter ? "a weight" : "the loss",
             step);
  }
  for (uint32_t i = 0; i < execs_.size(); ++i) {
    const Exec& e = execs_[i];
    const uint64_t step = marked ? e.marked_step : e.step;
    if (scaler.count(step) != 0) continue;
    bool nan = false, non_finite = false;
    Root forward;
    for (uint64_t key : e.inputs) {
      auto it = values_.find(key);
      if (it == values_.end() || (it->second.flags & ValueRange::kNonFinite) == 0) continue;
      non_finite = true;
      nan = nan || HasNan(it->second.flags);
      if (it->second.producer != 0) {
        const uint32_t p = it->second.producer - 1;
        forward = Earlier(forward, HasNan(it->second.flags) ? nan_roots[p] : inf_roots[p]);
      }
    }
    if (!non_finite) continue;
    consider(Earlier(forward, exec_roots[i]), nan, "a gradient", step);
  }
  if (!first.valid()) return;
  uint64_t later = 0;
  for (uint32_t i = 0; i < ops_.size(); ++i) {
    later += (nan_roots[i].same(first) || inf_roots[i].same(first)) &&
             !(first.kind == Root::kOp && first.index == i);
  }
  for (uint32_t i = 0; i < execs_.size(); ++i) {
    later += exec_roots[i].same(first) && !(first.kind == Root::kExec && first.index == i);
  }
  Resolve(first, first_nan, first_reached, later, sink_steps.size());
}

void NonFiniteWatch::Resolve(const Root& root, bool nan, const char* reached, uint64_t later,
                             uint64_t steps) {
  const bool marked = state_.steps != 0;
  NonFiniteFinding f;
  f.later_ops = later;
  f.steps = steps;
  f.reached = reached;
  f.nan = nan;
  if (root.kind == Root::kData) {
    auto value = values_.find(root.data);
    f.cause = NonFiniteCause::kData;
    f.op = value == values_.end() ? 0 : value->second.reader;
    f.nan = value != values_.end() && HasNan(value->second.flags);
    if (auto reader = op_index_.find(f.op); reader != op_index_.end()) {
      const Op& op = ops_[reader->second];
      f.step = marked ? op.marked_step : op.step;
      f.dtype = op.dtype;
    } else if (auto exec = exec_index_.find(f.op); exec != exec_index_.end()) {
      const Exec& e = execs_[exec->second];
      f.step = marked ? e.marked_step : e.step;
      f.backward = true;
      f.node = e.node;
    }
    state_.non_finite = f;
    return;
  }
  std::string_view name;
  float input_max = 0;
  bool inputs_have_inf = false;
  const std::vector<uint64_t>* inputs = nullptr;
  if (root.kind == Root::kExec) {
    const Exec& e = execs_[root.index];
    f.op = e.op;
    f.node = e.node;
    f.backward = true;
    f.step = marked ? e.marked_step : e.step;
    f.dtype = e.dtype;
    name = state_.Str(e.name);
    inputs = &e.inputs;
  } else {
    const Op& op = ops_[root.index];
    f.op = op.op;
    f.nan = HasNan(op.out_flags) && root.became_nan == UINT32_MAX;
    f.dtype = op.dtype;
    f.step = marked ? op.marked_step : op.step;
    name = state_.Str(op.name);
    inputs = &op.inputs;
    if (root.became_nan != UINT32_MAX) f.became_nan = ops_[root.became_nan].op;
  }
  for (uint64_t key : *inputs) {
    auto it = values_.find(key);
    if (it == values_.end()) continue;
    input_max = std::max(input_max, it->second.max_abs);
    inputs_have_inf = inputs_have_inf || HasInf(it->second.flags);
  }
  f.input_max_abs = input_max;
  const bool where_step = (marked ? where_marked_steps_ : where_steps_).count(f.step) != 0;
  const bool writes_parameter = root.kind == Root::kOp && ops_[root.index].writes_parameter;
  const bool made_inf = root.kind == Root::kOp && HasInf(ops_[root.index].out_flags);
  if (NameIs(Bare(name), {"lift_fresh", "lift_fresh_copy", "lift"})) {
    // torch.from_numpy(), torch.tensor(): the values came from outside torch.
    f.cause = NonFiniteCause::kData;
  } else if (IsSoftmax(name) && inputs_have_inf) {
    f.cause = NonFiniteCause::kMaskedRow;
  } else if (f.backward && IsDomainOp(name) && where_step) {
    f.cause = NonFiniteCause::kWhereTrap;
  } else if (IsDomainOp(name) && (nan || !Bare(name).starts_with("pow"))) {
    f.cause = NonFiniteCause::kDomain;
  } else if (writes_parameter) {
    f.cause = NonFiniteCause::kOptimizer;
  } else if (made_inf || root.became_nan != UINT32_MAX ||
             (f.backward && input_max > 0 && !nan)) {
    f.cause = NonFiniteCause::kOverflow;
  } else {
    f.cause = NonFiniteCause::kOther;
  }
  state_.non_finite = f;
}

}  // namespace torchrr::replayer
