// WriteRepro: the checks on the violation, then the Python script of its slice (repro_slice.h).
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string_view>

#include "repro/repro_slice.h"
#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/repro.h"

namespace torchrr::replayer {
namespace {

using format::ObjectId;
using format::OpRecord;
using format::TensorUse;
using format::Value;
using format::ValueKind;
using repro::Slice;
using repro::TraceIndex;

// Helpers every script carries: `call` binds the recorded arguments, which come in schema order,
// to an overload whose schema makes some keyword-only; `leaf` draws a made-up input.
constexpr const char* kHelpers = R"(aten = torch.ops.aten


def call(op, *args):
    """Calls an ATen overload with its arguments in schema order; returns the outputs, flat."""
    schema = op._schema.arguments
    positional = [a for a, s in zip(args, schema) if not s.kwarg_only]
    keywords = {s.name: a for a, s in zip(args, schema) if s.kwarg_only}
    out = op(*positional, **keywords)
    flat = []
    for item in out if isinstance(out, (tuple, list)) else (out,):
        flat.extend(item) if isinstance(item, (tuple, list)) else flat.append(item)
    return flat


def leaf(gen, shape, dtype, device, stride=None, requires_grad=False):
    """A recorded input the trace has no values for: seeded random values of its metadata."""
    if dtype.is_floating_point or dtype.is_complex:
        values = torch.randn(shape, generator=gen).to(dtype)
    elif dtype == torch.bool:
        values = torch.randint(0, 2, shape, generator=gen).bool()
    else:
        values = torch.randint(1, 8, shape, generator=gen).to(dtype)
    out = torch.empty_strided(shape, stride, dtype=dtype, device=device) if stride else \
        torch.empty(shape, dtype=dtype, device=device)
    out.data.copy_(values)  # Through .data: the tensor stays at version 0, as a fresh one is.
    return out.requires_grad_(requires_grad)
)";

std::string Ints(const std::vector<int64_t>& values, bool as_bools = false) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i != 0) text += ", ";
    text += as_bools ? (values[i] != 0 ? "True" : "False") : std::to_string(values[i]);
  }
  return text + "]";
}

std::string Double(double d) {
  if (std::isnan(d)) return "float('nan')";
  if (std::isinf(d)) return d > 0 ? "float('inf')" : "float('-inf')";
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.17g", d);
  std::string text = buffer;
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

std::string TorchDType(format::DType dtype) { return std::string("torch.") + DTypeName(dtype); }

// Where a recorded device runs in the script: the CPU stays, any other is DEVICE.
std::string DeviceExpr(const format::Device& device) {
  return device.type == 0 ? "'cpu'" : "DEVICE";
}

// A Python literal of a recorded non-tensor argument; "" when it has none.
std::string Literal(const Value& v, const TraceIndex& index) {
  switch (v.kind) {
    case ValueKind::kNone: return "None";
    case ValueKind::kBool: return v.i != 0 ? "True" : "False";
    case ValueKind::kInt: return std::to_string(v.i);
    case ValueKind::kDouble: return Double(v.d);
    case ValueKind::kComplex: return "complex(" + Double(v.d) + ", " + Double(v.d_imag) + ")";
    case ValueKind::kIntList: return Ints(v.ints);
    case ValueKind::kBoolList: return Ints(v.ints, true);
    case ValueKind::kDoubleList: {
      std::string text = "[";
      for (size_t i = 0; i < v.doubles.size(); ++i) text += (i ? ", " : "") + Double(v.doubles[i]);
      return text + "]";
    }
    case ValueKind::kDType:
      return v.i >= 0 && v.i < 128 && std::string_view(DTypeName(static_cast<format::DType>(v.i))) !=
                                           "unknown"
                 ? TorchDType(static_cast<format::DType>(v.i))
                 : "";
    case ValueKind::kDevice: return v.i / 256 == 0 ? "torch.device('cpu')" : "torch.device(DEVICE)";
    case ValueKind::kLayout: return v.i == 0 ? "torch.strided" : "";
    case ValueKind::kMemoryFormat: {
      static const char* kFormats[] = {"torch.contiguous_format", "torch.preserve_format",
                                       "torch.channels_last", "torch.channels_last_3d"};
      return v.i >= 0 && v.i < 4 ? kFormats[v.i] : "";
    }
    case ValueKind::kString: {
      const std::string& s = index.Str(v.s);
      for (char c : s) {
        // Only the plain identifiers ATen takes ("mean", "floor", "tanh") are written out.
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
          return "";
        }
      }
      return "'" + s + "'";
    }
    default: return "";
  }
}

std::string Var(ObjectId tensor) { return "t" + std::to_string(tensor); }

// Whether a made-up leaf is drawn contiguous: it is, or its strides cannot be drawn (a zero
// stride, an expand's, whose elements share memory that the copy into it refuses).
bool PlainLayout(const format::TensorInfo& info) {
  for (size_t d = 0; d < info.shape.size(); ++d) {
    if (info.strides.size() != info.shape.size() || (info.strides[d] == 0 && info.shape[d] > 1)) {
      return true;
    }
  }
  int64_t expected = 1;
  for (size_t d = info.shape.size(); d-- > 0;) {
    if (info.shape[d] != 1 && info.strides[d] != expected) return false;
    expected *= info.shape[d];
  }
  return info.storage_offset == 0;
}

// Whether `text` is a Python identifier of ASCII letters, digits and underscores. A trace is
// untrusted and the script is run: a name of anything else could be code.
bool Identifier(std::string_view text) {
  if (text.empty() || std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  for (char c : text) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

// The Python call of a recorded op, "aten.mul_.Tensor"; "" for an op outside aten, or a name that
// is no identifier.
std::string Overload(const OpRecord& op, const TraceIndex& index) {
  const std::string& name = index.Str(op.name);
  if (!name.starts_with("aten::")) return "";
  const std::string& overload = index.Str(op.overload);
  const std::string method = name.substr(6);
  if (!Identifier(method) || (!overload.empty() && !Identifier(overload))) return "";
  return "aten." + method + "." + (overload.empty() ? "default" : overload);
}

// The statements that run one op: `t14 = call(aten.mm.default, t6, t2)[0]`. Returns "" and sets
// *why when an argument cannot be written.
std::string OpCall(const OpRecord& op, const TraceIndex& index, std::string* why) {
  const std::string overload = Overload(op, index);
  if (overload.empty()) {
    const std::string& overload_name = index.Str(op.overload);
    *why = Printable(index.Str(op.name)) + (overload_name.empty() ? "" : ".") +
           Printable(overload_name) + " is not an ATen op, which the reproducer cannot call";
    return "";
  }
  // Arguments by schema position; a Tensor[] argument's members by their index in it.
  std::map<uint16_t, std::map<uint16_t, ObjectId>> tensors;
  std::map<uint16_t, std::string> values;
  size_t count = 0;
  for (const TensorUse& use : op.inputs) {
    tensors[use.position][use.list_index] = use.tensor;
    count = std::max<size_t>(count, use.position + 1);
  }
  for (const Value& v : op.values) {
    std::string literal = Literal(v, index);
    if (literal.empty()) {
      *why = "an argument of " + overload + " is one the trace could not keep";
      return "";
    }
    values[v.position] = literal;
    count = std::max<size_t>(count, v.position + 1);
  }
  std::string args = overload;
  for (uint16_t p = 0; p < count; ++p) {
    args += ", ";
    if (auto t = tensors.find(p); t != tensors.end()) {
      if (t->second.size() == 1 && t->second.begin()->first == TensorUse::kNotInList) {
        args += Var(t->second.begin()->second);
      } else {
        args += "[";
        for (auto [i, tensor] : t->second) args += (i ? ", " : "") + Var(tensor);
        args += "]";
      }
    } else if (auto v = values.find(p); v != values.end()) {
      args += v->second;
    } else {
      args += "None";  // An undefined optional tensor: the recorder keeps no use of it.
    }
  }
  // Outputs by their place in the flat list `call` returns.
  std::map<std::pair<uint16_t, uint16_t>, ObjectId> outputs;
  for (const TensorUse& use : op.outputs) outputs[{use.position, use.list_index}] = use.tensor;
  std::string targets, sources;
  size_t flat = 0;
  uint16_t position = 0;
  for (auto [place, tensor] : outputs) {
    while (position < place.first) ++position, ++flat;
    const size_t at = flat + (place.second == TensorUse::kNotInList ? 0 : place.second);
    targets += (targets.empty() ? "" : ", ") + Var(tensor);
    sources += (sources.empty() ? "" : ", ") + ("_out[" + std::to_string(at) + "]");
    if (place.second == TensorUse::kNotInList) ++position, ++flat;
  }
  if (outputs.empty()) return "call(" + args + ")";
  if (outputs.size() == 1) return targets + " = call(" + args + ")" + sources.substr(4);
  return "_out = call(" + args + ")\n" + targets + " = " + sources;
}

bool Floating(format::DType dtype) { return dtype == 5 || dtype == 6 || dtype == 7 || dtype == 15; }
bool Reduced(format::DType dtype) { return dtype == 5 || dtype == 15; }  // float16, bfloat16.

// The `torch.autocast(...)` an op ran under, "" when none shows: autocast casts inside the op the
// user called, so the trace shows that op turning float32 operands into a float16 or bfloat16
// result with no dtype argument asking for it.
std::string AutocastOf(const OpRecord& op, const TraceIndex& index) {
  const size_t at = index.IndexOf(op.op);
  for (const Value& v : op.values) {
    if (v.kind == ValueKind::kDType) return "";
  }
  bool wide_input = false;
  for (const TensorUse& use : op.inputs) {
    const format::TensorInfo* t = index.InfoBefore(use.tensor, at);
    if (t == nullptr || !Floating(t->dtype)) continue;
    if (Reduced(t->dtype)) return "";
    wide_input = true;
  }
  if (!wide_input) return "";
  for (const TensorUse& use : op.outputs) {
    const format::TensorInfo* t = index.InfoBefore(use.tensor, at + 1);
    if (t == nullptr || !Reduced(t->dtype)) continue;
    return std::string("torch.autocast(") +
           (t->device.type == 0 ? "'cpu'" : "DEVICE.split(':')[0]") +
           ", dtype=" + TorchDType(t->dtype) + ")";
  }
  return "";
}

std::string Indent(const std::string& lines, const std::string& by) {
  std::string out;
  std::istringstream in(lines);
  for (std::string line; std::getline(in, line);) out += (line.empty() ? "" : by) + line + "\n";
  return out;
}

// The reason a violation has no reproducer, before its slice is looked at; "" when it may.
std::string Unsupported(const Violation& v) {
  if (v.kind == ViolationKind::kSilent && v.evidence != SilentEvidence::kAliasedWrite &&
      v.evidence != SilentEvidence::kUncheckedSave) {
    return std::string("a silent violation found by ") + SilentEvidenceName(v.evidence) +
           " has no reproducer yet (only writes through another tensor, like .data, and saves "
           "whose hooks packed the tensor itself)";
  }
  if (v.kind != ViolationKind::kVersion && v.kind != ViolationKind::kSilent &&
      v.kind != ViolationKind::kDetached && v.kind != ViolationKind::kFreed) {
    return std::string("a violation of kind ") + ViolationKindName(v.kind) +
           " has no reproducer yet";
  }
  // kFreed's culprit is the earlier backward pass, not a forward op: the script runs two.
  if (v.kind != ViolationKind::kFreed && (!v.culprit || v.culprit->id == 0 || v.culprit->hook)) {
    return "the trace did not record the write (no culprit op)";
  }
  if (!v.victim || v.victim->id == 0) return "the trace does not name the op that saved the tensor";
  if (v.recomputing || v.recomputed) {
    return "activation checkpointing recomputes the saved tensor, which the reproducer cannot "
           "express";
  }
  return "";
}

}  // namespace

Repro WriteRepro(const std::vector<format::Record>& records, const Report& report,
                 const format::FileInfo& info, const ReproOptions& options) {
  Repro out;
  TraceIndex index(records);
  out.trace_ops = index.ops();
  if (report.violations.empty()) {
    out.error = "the trace holds no violation to reproduce";
    return out;
  }
  if (options.violation >= report.violations.size()) {
    out.error = "no violation " + std::to_string(options.violation) + ": the trace holds " +
                std::to_string(report.violations.size());
    return out;
  }
  if (!index.has_values()) {
    out.error = "the trace holds no op's arguments (redact --drop-values): nothing to call its ops "
                "with";
    return out;
  }
  const Violation& v = report.violations[options.violation];
  if (std::string why = Unsupported(v); !why.empty()) {
    out.error = why;
    return out;
  }
  const format::NodeRecord* node = index.Node(v.backward_node.id);
  if (node == nullptr || node->saved_kind == format::SavedSetKind::kCustom ||
      node->saved_kind == format::SavedSetKind::kUnknown) {
    out.error = Printable(v.backward_node.name) +
                " is a node the reproducer cannot express (an autograd.Function, a compiled "
                "region)";
    return out;
  }
  Slice slice;
  const ObjectId victim = index.Outermost(v.victim->id);
  const bool freed = v.kind == ViolationKind::kFreed;
  const ObjectId culprit = freed ? 0 : index.Outermost(v.culprit->id);
  std::vector<ObjectId> later_writes;
  for (const OpRef& write : v.later_culprits) later_writes.push_back(write.id);
  if (std::string why = repro::BuildSlice(index, victim, culprit, later_writes,
                                          v.tensor.version_counter, &slice);
      !why.empty()) {
    out.error = why;
    return out;
  }
  out.slice_ops = slice.ops.size();
  const bool silent = v.kind == ViolationKind::kSilent;
  // An unchecked save: a saved_tensors_hooks pack that kept the tensor itself turned PyTorch's
  // version check off; the script saves it through identity hooks, which do the same.
  const bool identity_hooks = silent && v.evidence == SilentEvidence::kUncheckedSave;
  if (identity_hooks) {
    const format::SavedTensor* saved = nullptr;
    for (const format::SavedTensor& s : node->saved) {
      if (index.Str(s.name) == v.tensor.saved_name && s.list_index == v.tensor.list_index) {
        saved = &s;
      }
    }
    if (saved == nullptr || saved->hook != format::SavedHook::kPackedTensor) {
      out.error = "the tensor was saved through hooks that did not pack the tensor itself "
                  "(checkpointing, a compiled region), which the reproducer cannot express";
      return out;
    }
  }

  // The body of run(): leaves, then the ops, then backward.
  std::string body = "gen = torch.Generator().manual_seed(0)\n";
  std::vector<ObjectId> grads;
  // What each tensor's requires_grad is in the script so far: a parameter is made by an op
  // (nn.Parameter's detach) and told to require grad by requires_grad_(), which is no op.
  std::map<ObjectId, bool> requires_grad;
  auto define_leaf = [&](ObjectId tensor) {
    const format::TensorInfo* t =
        index.InfoBefore(tensor, index.IndexOf(slice.ops[slice.leaf_use.at(tensor)]));
    if (auto base = slice.data_of.find(tensor); base != slice.data_of.end()) {
      std::string line = Var(tensor) + " = " + Var(base->second) + ".data";
      if (!PlainLayout(*t)) {
        line += ".as_strided(" + Ints(t->shape) + ", " + Ints(t->strides) + ", " +
                std::to_string(t->storage_offset) + ")";
      }
      return "# .data of " + Var(base->second) + ": the same bytes, a version counter of its own\n" +
             line + "\n";
    }
    requires_grad[tensor] = t->requires_grad;
    if (t->requires_grad) grads.push_back(tensor);
    std::string line = Var(tensor) + " = leaf(gen, " + Ints(t->shape) + ", " +
                       TorchDType(t->dtype) + ", " + DeviceExpr(t->device);
    if (!PlainLayout(*t)) line += ", stride=" + Ints(t->strides);
    if (t->requires_grad) line += ", requires_grad=True";
    return line + ")\n";
  };
  for (ObjectId tensor : slice.leaves) {
    const format::TensorInfo* t =
        index.InfoBefore(tensor, index.IndexOf(slice.ops[slice.leaf_use.at(tensor)]));
    if (std::string_view(DTypeName(t->dtype)) == "unknown") {
      out.error = "an operand's dtype (" + std::to_string(t->dtype) + ") is not one torch names";
      return out;
    }
    if (!slice.data_of.contains(tensor)) body += define_leaf(tensor);
  }
  for (size_t k = 0; k < slice.ops.size(); ++k) {
    body += "\n";
    for (ObjectId tensor : slice.leaves) {
      if (slice.leaf_use.at(tensor) == k && slice.data_of.contains(tensor)) {
        body += define_leaf(tensor);
      }
    }
    const OpRecord& op = *index.Op(slice.ops[k]);
    std::string why;
    std::string call = OpCall(op, index, &why);
    if (call.empty()) {
      out.error = why;
      return out;
    }
    if (identity_hooks && op.op == victim) {
      call = "# The recorded save's hooks packed the tensor itself: no version check at unpack.\n"
             "with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):\n" +
             Indent(call, "    ");
      call.pop_back();
    }
    const size_t at = index.IndexOf(op.op);
    for (const TensorUse& use : op.inputs) {
      const format::TensorInfo* t = index.InfoBefore(use.tensor, at);
      if (t != nullptr && t->requires_grad && t->grad_fn == 0 && !requires_grad[use.tensor]) {
        body += Var(use.tensor) + ".requires_grad_()\n";
        requires_grad[use.tensor] = true;
        grads.push_back(use.tensor);
      }
    }
    std::string where = Printable(index.UserLine(op));
    std::string role = op.op == victim    ? "the victim: " + Printable(v.backward_node.name) +
                                             " saves " + Printable(v.tensor.saved_name)
                       : op.op == culprit ? std::string("the culprit: ") +
                                                (v.kind == ViolationKind::kDetached
                                                     ? "detaches the saved tensor in place"
                                                     : "writes the saved tensor")
                                          : "";
    if (!where.empty() || !role.empty()) {
      body += "# " + where + (where.empty() || role.empty() ? "" : " -- ") + role + "\n";
    }
    if (op.op == culprit && silent) {
      body += "if not recorded_write:  # the write made on a copy: the saved bytes stay as saved\n";
      for (ObjectId tensor : slice.written) {
        body += "    " + Var(tensor) + " = " + Var(tensor) + ".clone()\n";
      }
    }
    if (std::string autocast = AutocastOf(op, index); !autocast.empty()) {
      call = "with " + autocast + ":  # what the op's result dtype shows it ran under\n" +
             Indent(call, "    ");
      call.pop_back();
    }
    body += op.grad_mode ? call + "\n" : "with torch.no_grad():\n" + Indent(call, "    ");
    for (const TensorUse& use : op.outputs) {
      const format::TensorInfo* t = index.InfoBefore(use.tensor, at + 1);
      requires_grad[use.tensor] = t != nullptr && t->requires_grad;
    }
  }
  body += "\n# The use: backward through the victim's output reaches " +
          Printable(v.backward_node.name) + "\n";
  std::string sums;
  for (ObjectId tensor : slice.uses) sums += (sums.empty() ? "" : ", ") + Var(tensor) + ".sum()";
  if (freed) {
    body += "torch.autograd.backward([" + sums + "])  # the first pass frees what it saved\n";
  }
  body += "torch.autograd.backward([" + sums + "])\n";
  std::string returned;
  for (ObjectId tensor : grads) returned += (returned.empty() ? "" : ", ") + Var(tensor) + ".grad";
  body += "return [" + returned + "]\n";

  const std::string victim_line = Printable(index.UserLine(*index.Op(victim)));
  std::string script = std::string(kReproPrefix) + Printable(options.trace_name) + ", violation " +
                       std::to_string(options.violation) + " (" + ViolationKindName(v.kind) +
                       ")\n";
  const std::string saved = "what " + Printable(v.backward_node.name) + " saved at " + victim_line;
  if (freed) {
    script += "# A second backward pass through " + saved + ",\n# which the first freed.\n";
  } else {
    script += "# The " + std::string(v.kind == ViolationKind::kDetached ? "detach_()" : "write") +
              " at " + Printable(index.UserLine(*index.Op(culprit))) + "\n# into " + saved +
              ".\n";
  }
  script += "# Recorded with torch " + Printable(info.torch_version) + "; " +
            std::to_string(out.slice_ops) + " of the trace's " + std::to_string(out.trace_ops) +
            " ops, called through their ATen overloads, on seeded random inputs.\n";
  script += "import sys\n\nimport torch\n\n";
  std::string device = options.device;
  std::string recorded_device = v.tensor.device;
  if (!device.empty()) {
    script += "DEVICE = '" + Printable(device, '\'') + "'\n";
  } else if (!recorded_device.empty() && recorded_device != "cpu" &&
             recorded_device.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789:") ==
                 std::string::npos) {
    script += "# The recorded device, or the CPU where it is absent.\n";
    std::string kind = recorded_device.substr(0, recorded_device.find(':'));
    script += "DEVICE = '" + recorded_device + "' if torch." + kind +
              ".is_available() else 'cpu'\n";
  } else {
    script += "DEVICE = 'cpu'\n";
  }
  script += kHelpers;
  script += std::string("\n\ndef run(") + (silent ? "recorded_write=True" : "") + "):\n";
  script += Indent(body, "    ");
  script += "\n\nif __name__ == \"__main__\":\n";
  if (silent) {
    script +=
        "    recorded, copied = run(recorded_write=True), run(recorded_write=False)\n"
        "    if any(not torch.equal(a, b) for a, b in zip(recorded, copied)\n"
        "           if a is not None and b is not None):\n"
        "        print(\"torchrr repro: the gradients differ: the write changed what backward \"\n"
        "              \"computed, and PyTorch said nothing\")\n"
        "        sys.exit(1)\n"
        "    print(\"torchrr repro: the gradients are the same: not reproduced\")\n"
        "    sys.exit(2)\n";
  } else {
    script +=
        "    run()\n"
        "    print(\"torchrr repro: backward did not raise: not reproduced\", file=sys.stderr)\n"
        "    sys.exit(2)\n";
  }
  out.script = std::move(script);
  out.ok = true;
  return out;
}

}  // namespace torchrr::replayer
