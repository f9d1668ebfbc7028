// WriteRepro: the checks on the violation, then the Python script of its slice (repro_slice.h).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string_view>

#include "repro/python_call.h"
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
using repro::AutocastOf;
using repro::DeviceExpr;
using repro::Indent;
using repro::Ints;
using repro::OpCall;
using repro::PlainLayout;
using repro::StandInCall;
using repro::Slice;
using repro::TorchDType;
using repro::TraceIndex;
using repro::Var;

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

// Whether the violation is a silent write --verify-saved's fingerprints saw and no recorded op
// made (a raw kernel, numpy, ctypes on the tensor's memory): the script makes a stand-in write.
bool UnrecordedWrite(const Violation& v) {
  return v.kind == ViolationKind::kSilent && v.evidence == SilentEvidence::kFingerprint &&
         (!v.culprit || v.culprit->id == 0);
}

// Whether the violation is an unpack hook's: it handed backward another dtype or shape than saved.
bool HookHanded(const Violation& v) {
  return v.kind == ViolationKind::kUnpackHook ||
         (v.kind == ViolationKind::kSilent && v.evidence == SilentEvidence::kUnpackHook);
}

// "torch.float16" for a dtype name a report gives; "" when it is not a plain name.
std::string DTypeExpr(const std::string& name) {
  if (name.empty() || name.size() > 32 ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos) {
    return "";
  }
  return "torch." + name;
}

// The saved_tensors_hooks around the victim that hand backward what the recorded unpack hook did:
// the tensor saved as the recorded one was, cast and cut to what the hook returned; other saved
// tensors as they are. With `silent`, only in the run with the recorded hook. "" when the trace's
// dtypes are not plain names or the hook returned more elements than were saved.
std::string UnpackHooks(const UnpackedRef& u, bool silent) {
  const std::string dtype = DTypeExpr(u.dtype), saved_dtype = DTypeExpr(u.saved_dtype);
  int64_t numel = 1, saved_numel = 1;
  for (int64_t d : u.shape) numel *= d;
  for (int64_t d : u.saved_shape) saved_numel *= d;
  if (dtype.empty() || saved_dtype.empty() || numel > saved_numel || numel < 0) return "";
  // A hook treats every tensor it packs alike: each of the saved dtype is cast (mm's message
  // names which operand came first), the one of the saved shape cut.
  std::string hook =
      "# The recorded unpack hook handed backward " + u.dtype + " " + Ints(u.shape) + " for the " +
      u.saved_dtype + " " + Ints(u.saved_shape) + " saved.\n"
      "def unpack(t):\n"
      "    if " + std::string(silent ? "not recorded_write or " : "") + "t.dtype != " +
      saved_dtype + ":\n"
      "        return t\n";
  if (u.shape != u.saved_shape) {
    hook += "    if list(t.shape) == " + Ints(u.saved_shape) + ":\n"
            "        t = t.flatten()[:" + std::to_string(numel) + "].reshape(" + Ints(u.shape) +
            ")\n";
  }
  return hook + "    return t.to(" + dtype +
         ")\n\nwith torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):\n";
}

// For a tensor selective activation checkpointing cached and the program then wrote
// (kCachedMutated): the victim's call `victim_call` and that of `consumer`, the op whose node
// backward recomputes from the cache, as a block run under a checkpoint whose policy saves what
// `cached` (the op inside the victim that made the cached tensor) returns, as the recorded policy
// did. Sets *uses to the consumer's outputs, which backward starts from. "" and *why when an
// operand of the consumer is not the victim's.
std::string SelectiveCheckpoint(const TraceIndex& index, const OpRecord& victim,
                                const std::string& victim_call, const OpRecord& consumer,
                                const OpRecord& cached, std::vector<ObjectId>* uses,
                                std::string* why) {
  const std::string saved = repro::AtenOverload(cached, index);
  std::string consumer_call = OpCall(consumer, index, why);
  if (saved.empty() || consumer_call.empty()) {
    if (why->empty()) *why = "the op whose output was cached is not an ATen op";
    return "";
  }
  std::vector<ObjectId> made = index.Outputs(victim);
  for (const TensorUse& use : consumer.inputs) {
    if (std::find(made.begin(), made.end(), use.tensor) == made.end()) {
      *why = "the op backward recomputes from the cache takes an operand the cached op did not "
             "make";
      return "";
    }
  }
  std::string params, returned;
  std::set<ObjectId> taken;  // An operand passed twice is one parameter.
  for (const TensorUse& use : victim.inputs) {
    if (taken.insert(use.tensor).second) params += Var(use.tensor) + ", ";
  }
  uses->clear();
  for (ObjectId tensor : index.Outputs(consumer)) uses->push_back(tensor);
  for (ObjectId tensor : *uses) returned += Var(tensor) + ", ";
  for (ObjectId tensor : made) returned += Var(tensor) + ", ";
  returned.resize(returned.size() - 2);
  params.resize(params.size() >= 2 ? params.size() - 2 : 0);
  return "# Selective activation checkpointing, as recorded: its policy saved what " + saved +
         "\n# returned, the tensor it cached, and backward recomputes the rest from it.\n"
         "import functools\n"
         "from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,\n"
         "                                    create_selective_checkpoint_contexts)\n\n"
         "def policy(ctx, op, *args, **kwargs):\n"
         "    return (CheckpointPolicy.MUST_SAVE if op == " + saved + "\n"
         "            else CheckpointPolicy.PREFER_RECOMPUTE)\n\n"
         "def block(" + params + "):\n" + Indent(victim_call, "    ") +
         Indent(consumer_call, "    ") + "    return " + returned + "\n\n" + returned +
         " = checkpoint(\n    block, " + params + ", use_reentrant=False,\n"
         "    context_fn=functools.partial(create_selective_checkpoint_contexts, policy))";
}

// Whether `name` is a dispatcher op's, `namespace::name` of identifiers (a torch.library or
// extension op), not a range's such as "Torch-Compiled Region: 0/0".
bool DispatcherName(std::string_view name) {
  const size_t colons = name.find("::");
  return colons != std::string_view::npos && repro::Identifier(name.substr(0, colons)) &&
         repro::Identifier(name.substr(colons + 2));
}

// The reason a violation has no reproducer, before its slice is looked at; "" when it may.
std::string Unsupported(const Violation& v) {
  if (v.kind == ViolationKind::kSilent && v.evidence != SilentEvidence::kAliasedWrite &&
      v.evidence != SilentEvidence::kUncheckedSave && v.evidence != SilentEvidence::kUnpackHook &&
      v.evidence != SilentEvidence::kStorageSwap && v.evidence != SilentEvidence::kCounterReset &&
      v.evidence != SilentEvidence::kFingerprint) {
    return std::string("a silent violation found by ") + SilentEvidenceName(v.evidence) +
           " has no reproducer yet (only writes through another tensor, like .data, saves "
           "whose hooks packed the tensor itself, storage swaps, counter resets and writes "
           "--verify-saved found)";
  }
  if (v.kind != ViolationKind::kVersion && v.kind != ViolationKind::kSilent &&
      v.kind != ViolationKind::kDetached && v.kind != ViolationKind::kFreed &&
      v.kind != ViolationKind::kUnpackHook && v.kind != ViolationKind::kCachedMutated) {
    return std::string("a violation of kind ") + ViolationKindName(v.kind) +
           " has no reproducer yet";
  }
  // kFreed's culprit is the earlier backward pass, not a forward op: the script runs two. An
  // unpack hook's is the hook: the script hands backward what it did.
  if (HookHanded(v)) {
    if (!v.unpacked) return "the trace does not say what the unpack hook handed backward";
  } else if (v.kind != ViolationKind::kFreed && !UnrecordedWrite(v) &&
             (!v.culprit || v.culprit->id == 0 || v.culprit->hook)) {
    return "the trace did not record the write (no culprit op)";
  }
  if (!v.victim || v.victim->id == 0) return "the trace does not name the op that saved the tensor";
  return "";
}

// Why the violation `options` names has no reproducer, before its slice is looked at; "" when
// it may have one.
std::string Refusal(const TraceIndex& index, const Report& report, const ReproOptions& options) {
  if (report.violations.empty()) return "the trace holds no violation to reproduce";
  if (options.violation >= report.violations.size()) {
    return "no violation " + std::to_string(options.violation) + ": the trace holds " +
           std::to_string(report.violations.size());
  }
  if (!index.has_values()) {
    return "the trace holds no op's arguments (redact --drop-values): nothing to call its ops "
           "with";
  }
  const Violation& v = report.violations[options.violation];
  if (std::string why = Unsupported(v); !why.empty()) return why;
  const format::NodeRecord* node = index.Node(v.backward_node.id);
  if (node == nullptr || node->saved_kind == format::SavedSetKind::kUnknown) {
    return Printable(v.backward_node.name) +
           " is a node whose saved tensors the trace does not know";
  }
  // A custom node is called through a stand-in for the op that created it.
  const bool stand_in = node->saved_kind == format::SavedSetKind::kCustom;
  if (stand_in && index.CustomNode(node->created_by) != node) {
    return Printable(v.backward_node.name) +
           " is a custom node (an autograd.Function, a compiled region) whose creating call the "
           "trace did not record";
  }
  // Non-reentrant checkpointing's inputs, which its frame keeps and checks, are saved as a
  // stand-in saves them. A tensor the recomputation saved and wrote again, which checkpointing
  // hands backward with no version check, is saved through identity hooks, which check nothing
  // either; any other tensor of the recomputation is another matter.
  const bool recomputed_unchecked = v.recomputed && v.kind == ViolationKind::kSilent &&
                                    v.evidence == SilentEvidence::kUncheckedSave;
  if ((v.recomputing || v.recomputed) && !stand_in && !recomputed_unchecked) {
    return "activation checkpointing recomputes the saved tensor, which the reproducer cannot "
           "express";
  }
  // An unchecked save reproduces only when its hooks packed the tensor itself.
  if (v.kind == ViolationKind::kSilent && v.evidence == SilentEvidence::kUncheckedSave) {
    auto saved = std::find_if(node->saved.begin(), node->saved.end(), [&](const auto& s) {
      return index.Str(s.name) == v.tensor.saved_name && s.list_index == v.tensor.list_index;
    });
    // A stand-in keeps a custom node's unchecked save as it was: no hook, no version check.
    const bool unchecked = stand_in && saved != node->saved.end() &&
                           saved->hook == format::SavedHook::kNone;
    const bool packed = saved != node->saved.end() &&
                        (saved->hook == format::SavedHook::kPackedTensor ||
                         (recomputed_unchecked && saved->hook == format::SavedHook::kCheckpoint));
    if (!unchecked && !packed) {
      return "the tensor was saved through hooks that did not pack the tensor itself "
             "(checkpointing, a compiled region), which the reproducer cannot express";
    }
  }
  return "";
}

// The script's first lines: what it reproduces, from which trace and torch, and its imports.
//   # torchrr repro: run.trr, violation 0 (version)
//   # The write at train.py:7 in <module>
//   # into what SigmoidBackward0 saved at train.py:6 in <module>.
std::string ScriptHeader(const TraceIndex& index, const Violation& v, ObjectId victim,
                         ObjectId culprit, const format::FileInfo& info,
                         const ReproOptions& options, const Repro& repro) {
  const std::string victim_line = Printable(index.UserLine(*index.Op(victim)));
  std::string script = std::string(kReproPrefix) + Printable(options.trace_name) + ", violation " +
                       std::to_string(options.violation) + " (" + ViolationKindName(v.kind) +
                       ")\n";
  const std::string saved = "what " + Printable(v.backward_node.name) + " saved at " + victim_line;
  if (HookHanded(v)) {
    const std::string hook = v.culprit && v.culprit->user_frame
                                 ? Printable(v.culprit->user_frame->file) + ":" +
                                       std::to_string(v.culprit->user_frame->line)
                                 : "(not recorded)";
    script += "# The unpack hook defined at " + hook + "\n# handed backward another tensor than " +
              saved + ".\n";
  } else if (UnrecordedWrite(v)) {
    script += "# A write no recorded op made (a raw kernel, numpy, ctypes) into " + saved +
              ".\n";
  } else if (culprit == 0) {
    script += "# A second backward pass through " + saved + ",\n# which the first freed.\n";
  } else {
    script += "# The " + std::string(v.kind == ViolationKind::kDetached ? "detach_()" : "write") +
              " at " + Printable(index.UserLine(*index.Op(culprit))) + "\n# into " + saved +
              ".\n";
  }
  script += "# Recorded with torch " + Printable(info.torch_version) + "; " +
            std::to_string(repro.slice_ops) + " of the trace's " + std::to_string(repro.trace_ops) +
            " ops, called through their ATen overloads, on seeded random inputs.\n";
  if (repro.stand_ins > 0) {
    script += "# " + std::to_string(repro.stand_ins) + " of them through a stand-in for what " +
              "the script cannot call (see its comment).\n";
  }
  return script + "import sys\n\nimport torch\n\n";
}

// `DEVICE = ...`: `device` (--device) when given; else the recorded device when the running
// machine has it, the CPU otherwise. A recorded name is written only when it is plain.
std::string DeviceLine(const std::string& device, const std::string& recorded) {
  if (!device.empty()) return "DEVICE = '" + Printable(device, '\'') + "'\n";
  if (recorded.empty() || recorded == "cpu" ||
      recorded.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789:") != std::string::npos) {
    return "DEVICE = 'cpu'\n";
  }
  const std::string kind = recorded.substr(0, recorded.find(':'));
  return "# The recorded device, or the CPU where it is absent.\nDEVICE = '" + recorded +
         "' if torch." + kind + ".is_available() else 'cpu'\n";
}

// The script's entry: a raising violation's run() raises PyTorch's error; a silent one's is run
// with the write and with it made on a copy, and the gradients compared. Exit 2: not reproduced.
std::string ScriptMain(bool silent) {
  if (!silent) {
    return "\n\nif __name__ == \"__main__\":\n"
           "    run()\n"
           "    print(\"torchrr repro: backward did not raise: not reproduced\", file=sys.stderr)\n"
           "    sys.exit(2)\n";
  }
  return "\n\nif __name__ == \"__main__\":\n"
         "    recorded, copied = run(recorded_write=True), run(recorded_write=False)\n"
         "    if any(not torch.equal(a, b) for a, b in zip(recorded, copied)\n"
         "           if a is not None and b is not None):\n"
         "        print(\"torchrr repro: the gradients differ: the write changed what backward \"\n"
         "              \"computed, and PyTorch said nothing\")\n"
         "        sys.exit(1)\n"
         "    print(\"torchrr repro: the gradients are the same: not reproduced\")\n"
         "    sys.exit(2)\n";
}

}  // namespace

Repro WriteRepro(const std::vector<format::Record>& records, const Report& report,
                 const format::FileInfo& info, const ReproOptions& options) {
  Repro out;
  TraceIndex index(records);
  out.trace_ops = index.ops();
  if (std::string why = Refusal(index, report, options); !why.empty()) {
    out.error = why;
    return out;
  }
  const Violation& v = report.violations[options.violation];
  Slice slice;
  // A custom node's victim is the call that created it (inside a compiled region's op, say).
  const format::NodeRecord* node = index.Node(v.backward_node.id);
  ObjectId victim = index.Outermost(
      node->saved_kind == format::SavedSetKind::kCustom ? node->created_by : v.victim->id);
  const bool freed = v.kind == ViolationKind::kFreed;
  const bool hooked = HookHanded(v);
  const bool unrecorded = UnrecordedWrite(v);
  ObjectId culprit = freed || hooked || unrecorded ? 0 : index.Outermost(v.culprit->id);
  // Checkpointing ran the write (and maybe the save) again inside backward: the script calls the
  // forward's own, under identity hooks that check nothing, as checkpointing's hand-over did.
  if (v.recomputed && culprit != 0) {
    victim = index.ForwardTwin(victim, 0);
    culprit = victim == 0 ? 0 : index.ForwardTwin(culprit, victim);
    if (culprit == 0) {
      out.error = "the forward ops that checkpointing recomputed are not found in the trace";
      return out;
    }
  }
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
  // An unchecked save (Refusal let only identity packs through): the script saves the tensor
  // through identity hooks, which turn PyTorch's version check off as the recorded ones did.
  const bool identity_hooks = silent && v.evidence == SilentEvidence::kUncheckedSave;

  // The body of run(): leaves, then the ops, then backward.
  std::string body = "gen = torch.Generator().manual_seed(0)\n";
  std::vector<std::string> grads;  // The leaves whose gradients run() returns.
  std::set<ObjectId> written_in_slice;
  for (ObjectId id : slice.ops) {
    for (const TensorUse& use : index.Op(id)->inputs) {
      if (use.version_after != use.version_before) written_in_slice.insert(use.tensor);
    }
  }
  // What each tensor's requires_grad is in the script so far: a parameter is made by an op
  // (nn.Parameter's detach) and told to require grad by requires_grad_(), which is no op.
  std::map<ObjectId, bool> requires_grad;
  auto define_leaf = [&](ObjectId tensor) {
    const format::TensorInfo* t =
        index.InfoBefore(tensor, index.IndexOf(slice.ops[slice.leaf_use.at(tensor)]));
    if (auto base = slice.data_of.find(tensor); base != slice.data_of.end()) {
      std::string line = Var(tensor) + " = " + Var(base->second) + ".data";
      auto offset = slice.data_offset.find(tensor);
      if (!PlainLayout(*t) || offset != slice.data_offset.end()) {
        line += ".as_strided(" + Ints(t->shape) + ", " + Ints(t->strides) + ", " +
                std::to_string(offset != slice.data_offset.end() ? offset->second
                                                                 : t->storage_offset) +
                ")";
      }
      return "# .data of " + Var(base->second) + ": the same bytes, a version counter of its own" +
             std::string(offset != slice.data_offset.end()
                             ? " (recorded as another storage over that memory)"
                             : "") +
             "\n" + line + "\n";
    }
    requires_grad[tensor] = t->requires_grad;
    // A tensor some op made (it has a grad_fn) that the slice writes in place, standing in as a
    // leaf: a clone of one, which the op may write as it wrote the recorded tensor (a leaf that
    // requires grad refuses).
    const bool made = t->requires_grad && t->grad_fn != 0 && written_in_slice.contains(tensor);
    const std::string name = made ? Var(tensor) + "_leaf" : Var(tensor);
    if (t->requires_grad) grads.push_back(name);
    std::string line = name + " = leaf(gen, " + Ints(t->shape) + ", " +
                       TorchDType(t->dtype) + ", " + DeviceExpr(t->device);
    if (!PlainLayout(*t)) line += ", stride=" + Ints(t->strides);
    if (t->requires_grad) line += ", requires_grad=True";
    line += ")\n";
    if (made) line += Var(tensor) + " = " + name + ".clone()  # not a leaf, as recorded\n";
    return line;
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
    const format::NodeRecord* custom = index.CustomNode(op.op);
    const bool foreign = custom == nullptr && op.scope == format::OpScope::kFunction &&
                         !index.Str(op.name).starts_with("aten::") &&
                         DispatcherName(index.Str(op.name));
    std::string call = custom != nullptr
                           ? StandInCall(op, *custom, index, v.tensor.version_counter, &why)
                       : foreign ? ForeignCall(op, index, &why)
                                 : OpCall(op, index, &why);
    out.stand_ins += custom != nullptr || foreign;
    // A stand-in for it would save nothing: the node it made is the one backward checks.
    if (foreign && op.op == victim) {
      out.error = Printable(index.Str(op.name)) +
                  " is not an ATen op, and the node it made saved the tensor: the reproducer "
                  "cannot call it";
      return out;
    }
    if (call.empty()) {
      out.error = why;
      return out;
    }
    if (hooked && op.op == victim) {
      const std::string hooks = UnpackHooks(*v.unpacked, silent);
      if (hooks.empty()) {
        out.error = "the unpack hook's tensor (" + Printable(v.unpacked->dtype) + " " +
                    Ints(v.unpacked->shape) + ") is not one the script can make from the saved one";
        return out;
      }
      call = hooks + Indent(call, "    ");
      call.pop_back();
    }
    if (identity_hooks && op.op == victim && custom == nullptr) {
      call = std::string(v.recomputed
                             ? "# Checkpointing recomputed the saved tensor in backward and handed "
                               "it over\n# with no version check: identity hooks check nothing "
                               "either.\n"
                             : "# The recorded save's hooks packed the tensor itself: no version "
                               "check at unpack.\n") +
             "with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):\n" +
             Indent(call, "    ");
      call.pop_back();
    }
    const size_t at = index.IndexOf(op.op);
    for (const TensorUse& use : index.CallInputs(op, v.tensor.version_counter)) {
      const format::TensorInfo* t = index.InfoBefore(use.tensor, at);
      if (t != nullptr && t->requires_grad && t->grad_fn == 0 && !requires_grad[use.tensor]) {
        body += Var(use.tensor) + ".requires_grad_()\n";
        requires_grad[use.tensor] = true;
        grads.push_back(Var(use.tensor));
      }
    }
    std::string where = Printable(index.UserLine(op));
    // An op torch.fx's Interpreter ran (a compiled region traced) has no stack of its own; the
    // report names the user's line from the graph node's.
    const std::optional<OpRef>* named = op.op == victim    ? &v.victim
                                        : op.op == culprit ? &v.culprit
                                                           : nullptr;
    if (where.empty() && named != nullptr && *named && (*named)->user_frame) {
      const auto& frame = *(*named)->user_frame;
      where = Printable(frame.file) + ":" + std::to_string(frame.line) + " in " +
              Printable(frame.function);
    }
    std::string role = op.op == victim    ? "the victim: " + Printable(v.backward_node.name) +
                                             " saves " + Printable(v.tensor.saved_name)
                       : op.op == culprit ? std::string("the culprit: ") +
                                                (v.kind == ViolationKind::kDetached
                                                     ? "detaches the saved tensor in place"
                                                 : v.evidence == SilentEvidence::kStorageSwap
                                                     ? "swaps the saved tensor's storage"
                                                     : "writes the saved tensor")
                                          : "";
    if (!where.empty() || !role.empty()) {
      body += "# " + where + (where.empty() || role.empty() ? "" : " -- ") + role + "\n";
    }
    if (op.op == culprit && silent && v.evidence == SilentEvidence::kStorageSwap) {
      // `t.data = new` calls this op with t and new, then swaps t's storage for new's: what
      // backward reads of the saved t.
      if (op.inputs.size() != 2) {
        out.error = "the storage swap's op does not name the tensor and its new data";
        return out;
      }
      call = "if recorded_write:  # `.data =`: the saved tensor's storage swapped for another's\n"
             "    " + Var(op.inputs[0].tensor) + ".data = " + Var(op.inputs[1].tensor);
    } else if (op.op == culprit && silent) {
      body += "if not recorded_write:  # the write made on a copy: the saved bytes stay as saved\n";
      for (ObjectId tensor : slice.written) {
        body += "    " + Var(tensor) + " = " + Var(tensor) + ".clone()\n";
      }
      if (slice.written.empty()) body += "    pass\n";
    }
    if (op.op == culprit && silent && v.evidence == SilentEvidence::kCounterReset &&
        !slice.written.empty()) {
      call = "# The write's version bump undone, as recorded: autograd's check then passes.\n"
             "with torch.autograd._unsafe_preserve_version_counter(" +
             Var(*slice.written.begin()) + "):\n" + Indent(call, "    ");
      call.pop_back();
    }
    if (std::string autocast = AutocastOf(op, index); !autocast.empty()) {
      call = "with " + autocast + ":  # what the op's result dtype shows it ran under\n" +
             Indent(call, "    ");
      call.pop_back();
    }
    if (v.kind == ViolationKind::kCachedMutated && op.op == victim) {
      const format::NodeRecord* consumer = index.Node(v.backward_node.id);
      const OpRecord* made_by = consumer == nullptr ? nullptr : index.Op(consumer->created_by);
      const OpRecord* cached = index.Producer(v.tensor.id, victim);
      std::string why_not;
      call = made_by == nullptr || cached == nullptr
                 ? ""
                 : SelectiveCheckpoint(index, op, call + "\n", *made_by, *cached, &slice.uses,
                                       &why_not);
      if (call.empty()) {
        out.error = why_not.empty() ? "the trace does not name the op backward recomputes from "
                                      "the cache, or the op that made it"
                                    : why_not;
        return out;
      }
    }
    body += op.grad_mode ? call + "\n" : "with torch.no_grad():\n" + Indent(call, "    ");
    for (ObjectId tensor : index.Outputs(op)) {
      const format::TensorInfo* t = tensor == 0 ? nullptr : index.OutputInfo(op, tensor);
      requires_grad[tensor] = t != nullptr && t->requires_grad;
    }
  }
  if (unrecorded) {
    // Where the saved tensor is a tensor of the script: made by the slice or drawn as a leaf.
    const ObjectId saved = v.tensor.id;
    bool known = std::find(slice.leaves.begin(), slice.leaves.end(), saved) != slice.leaves.end();
    for (ObjectId id : slice.ops) {
      const std::vector<ObjectId> made = index.Outputs(*index.Op(id));
      known = known || std::find(made.begin(), made.end(), saved) != made.end();
    }
    if (!known) {
      out.error = "the tensor whose bytes changed is not one the script makes";
      return out;
    }
    body += "\n# --verify-saved saw these bytes change between the save and the use, but no "
            "recorded op\n# wrote them: a stand-in write changes them, past the version "
            "counter, as that did.\nif recorded_write:\n    with torch.no_grad():\n        " +
            Var(saved) + ".data.add_(1)\n";
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
  for (const std::string& leaf : grads) returned += (returned.empty() ? "" : ", ") + leaf + ".grad";
  body += "return [" + returned + "]\n";

  std::string script = ScriptHeader(index, v, victim, culprit, info, options, out);
  script += DeviceLine(options.device, v.tensor.device);
  script += kHelpers;
  if (out.stand_ins > 0) script += repro::kStandInHelpers;
  script += std::string("\n\ndef run(") + (silent ? "recorded_write=True" : "") + "):\n";
  script += Indent(body, "    ");
  script += ScriptMain(silent);
  out.script = std::move(script);
  out.ok = true;
  return out;
}

}  // namespace torchrr::replayer
