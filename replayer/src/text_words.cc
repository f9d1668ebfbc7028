#include "text_words.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "torchrr/replayer/printable.h"

namespace torchrr::replayer {

std::string OpName(const OpRef& op) {
  std::string name = op.name.empty() ? "an unrecorded op" : Printable(op.name);
  if (!op.overload.empty()) name += "." + Printable(op.overload);
  return name;
}

std::string Location(const OpRef& op) {
  if (!op.user_frame) return "<no user frame recorded>";
  const UserFrame& f = *op.user_frame;
  std::string s = f.file.empty() ? "<unknown file>" : Printable(f.file);
  if (f.line != 0) s += ":" + std::to_string(f.line);
  if (!f.function.empty()) s += " in " + Printable(f.function);
  // The outermost module, "(Net)", says no more than the function's name does.
  if (!op.module.empty() && !op.module.starts_with("(")) s += ", in " + Printable(op.module);
  return s;
}

std::string LibraryLocation(const OpRef& op) {
  for (const Frame& f : op.stack) {
    if (IsUserFrame(f)) return "";  // Reached the user frame: no library ran the op for it.
    if (!f.python || !f.framework) continue;
    std::string path;
    // Debian's Python installs packages under dist-packages.
    for (std::string_view packages : {"/site-packages/", "/dist-packages/"}) {
      if (size_t at = f.file.find(packages); at != std::string::npos) {
        path = f.file.substr(at + packages.size());
        break;
      }
    }
    if (path.empty()) continue;  // The standard library's, a generated file.
    const std::string package = path.substr(0, path.find('/'));
    // torch's own frames (and torchrr's) are how every op is called, not where.
    if (package == "torch" || package == "torchrr" || package == "functorch" ||
        package == "triton") {
      continue;
    }
    std::string s = Printable(path);
    if (f.line != 0) s += ":" + std::to_string(f.line);
    if (!f.function.empty()) s += " in " + Printable(f.function);
    return s;
  }
  return "";
}

std::string Unindented(const std::string& line) {
  const size_t indent = line.find_first_not_of(" \t");
  return indent == std::string::npos ? "" : Printable(line.substr(indent));
}

size_t StatementWidth(const std::string& code, const std::string& file) {
  const bool python = !(file.ends_with(".cc") || file.ends_with(".cpp") ||
                        file.ends_with(".cxx") || file.ends_with(".h") ||
                        file.ends_with(".hpp") || file.ends_with(".cu"));
  size_t end = code.size();
  char quote = 0;  // The open string literal's quote; 0 outside one.
  for (size_t i = 0; i < code.size(); ++i) {
    const char c = code[i];
    if (quote != 0) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (python ? c == '#' : (c == '/' && i + 1 < code.size() && code[i + 1] == '/')) {
      end = i;
      break;
    }
  }
  if (end == 0) return std::max<size_t>(code.size(), 1);  // A comment alone: all of it.
  // The code starts with a non-blank (Unindented), so a non-blank precedes `end`.
  return code.find_last_not_of(" \t", end - 1) + 1;
}

std::string CulpritLabel(const Violation& v) {
  if (v.culprit->hook) {
    return "unpack hook `" + Printable(v.culprit->user_frame->function) + "` returned " +
           (v.kind == ViolationKind::kSilent ? "another tensor than was saved"
                                             : "the tensor backward failed on");
  }
  if (v.kind == ViolationKind::kFreed) {
    return "backward pass #" + (v.freed_by_pass ? std::to_string(*v.freed_by_pass) : "?") +
           " ran " + Printable(v.backward_node.name) + " and freed what it saved";
  }
  if (v.evidence == SilentEvidence::kStorageSwap) {
    // The op recorded is the check set_data makes before it swaps; the line is the assignment.
    return "`.data =` (set_data) replaced its storage after the save: backward reads the new "
           "values";
  }
  std::string label = OpName(*v.culprit);
  if (!v.culprit->detail.empty()) {
    label += " (wrote through " + Printable(v.culprit->detail) + ")";
  }
  if (v.kind == ViolationKind::kDetached) {
    label += " detached it from its graph in place";
  } else if (v.kind != ViolationKind::kSilent) {
    // The versions are the save's and the use's: later writes took their share of the count.
    if (const size_t later = v.later_culprits.size(); later > 0) {
      label += " and " + std::to_string(later) + (later == 1 ? " later write" : " later writes");
    }
    label += " changed the version " + std::to_string(v.saved_version) + " -> " +
             std::to_string(v.current_version);
  } else if (v.evidence == SilentEvidence::kCounterReset && v.counter_reset) {
    label += " wrote into it, and its version counter was then set back to " +
             std::to_string(v.counter_reset->to);
  } else if (v.evidence == SilentEvidence::kFingerprint) {
    label += " wrote into its memory through another tensor over it";
  } else if (v.evidence == SilentEvidence::kUncheckedSave) {
    label += " changed it (version " + std::to_string(v.saved_version) + " -> " +
             std::to_string(v.current_version) + "), unchecked by PyTorch";
  } else {
    label += " wrote into its memory through another tensor, which no counter of its follows";
  }
  return label;
}

std::string FixHint(const Violation& v) {
  if (v.changed_source) {
    return "update the parameter after backward() (an optimizer step, a weight update): backward "
           "uses the values written since the forward";
  }
  switch (v.kind) {
    case ViolationKind::kDetached:
      return "use out-of-place .detach(), which returns a new tensor and leaves the saved one in "
             "its graph";
    case ViolationKind::kFreed:
      return "pass retain_graph=True to the earlier backward() to run backward through this "
             "graph again, or run forward again to build a new graph";
    case ViolationKind::kUnpackHook:
      return "make the unpack hook return a tensor of the saved one's shape, dtype and device "
             "(PyTorch checks none of them)";
    case ViolationKind::kCachedMutated:
      return ".clone() the op's output before modifying it in place, or let the policy "
             "recompute that op (CheckpointPolicy.PREFER_RECOMPUTE)";
    default: break;
  }
  const bool silent = v.kind == ViolationKind::kSilent;
  if (silent && v.evidence == SilentEvidence::kUnpackHook) {
    return "make the unpack hook return a tensor of the saved one's dtype and shape (cast back "
           "what the pack hook converted)";
  }
  if (silent && v.evidence == SilentEvidence::kStorageSwap) {
    return "assign .data after backward(), or write the new values with copy_() under "
           "torch.no_grad() (PyTorch checks that write); a layer recomputing its weight each "
           "forward (spectral or weight norm) should compute a new tensor, not assign .data";
  }
  if (silent && v.evidence == SilentEvidence::kCounterReset) {
    return "do not hide an in-place write to a saved tensor by setting its version back; "
           ".clone() it before writing into it";
  }
  if (silent && v.evidence == SilentEvidence::kFingerprint) {
    return "find what writes into this memory between the two points (a raw kernel, numpy, an "
           "extension on data_ptr): `torchrr record --locate-write TRACE -- CMD` runs the "
           "program again and names the line; write into a .clone() instead";
  }
  if (v.read_by_recompute) {
    return "change what the checkpointed block reads (a weight, a buffer) only after backward: the "
           "recomputation reads it as it is then; use_reentrant=False does not avoid this one";
  }
  if (IsCtxStash(v)) {
    return "keep the tensor for backward with ctx.save_for_backward (PyTorch then checks it), "
           "or write into it only after backward; a buffer that must be refilled before then "
           "needs a .clone() stashed in forward";
  }
  if (silent && v.evidence == SilentEvidence::kUncheckedSave) {
    return "make the in-place op out of place, or .clone() the tensor before modifying it; "
           "PyTorch will not raise for it";
  }
  if (silent && v.backward_node.name == "CompiledFunctionBackward") {
    return "do not modify what the compiled call took or returned before backward: make the "
           "in-place op out of place, or .clone() the tensor before modifying it";
  }
  if (silent && v.tensor.inner != 0) {
    return "write through the DTensor itself (PyTorch then checks it), or update its shard only "
           "after backward() has used it; or .clone() the local tensor before writing into it";
  }
  if (silent) {
    return "write through the tensor itself, not .data or another tensor over its memory "
           "(DLPack, numpy()), so autograd sees it; or .clone() the tensor before writing into it";
  }
  // An optimizer step, an EMA or a clamp of the weights, an activation scaled under no_grad:
  // out of place, the tensor would lose its autograd history (what `torchrr fix` weighs too).
  if (v.culprit && !v.culprit->grad_mode) {
    return "move the write after backward() (a parameter's or buffer's update), or .clone() the "
           "tensor where it is made, before autograd saves it; under no_grad, an out-of-place "
           "op would cut the tensor from its graph";
  }
  const std::string name = v.culprit ? OpName(*v.culprit) : "the in-place op";
  std::string out_of_place = name;
  if (size_t dot = out_of_place.find('.'); dot != std::string::npos) out_of_place.resize(dot);
  if (out_of_place.ends_with('_')) out_of_place.pop_back();
  std::string hint = "make " + name + " out of place";
  if (out_of_place != name) hint += " (" + out_of_place + ")";
  return hint + ", or .clone() the tensor before modifying it";
}

std::string TimesAndSteps(const ViolationGroup& group) {
  std::string text = std::to_string(group.violations.size()) + " times";
  if (!group.modules.empty()) {
    text += (group.modules.size() == 1 ? ": in " : ": in modules ") +
            Printable(ModuleRanges(group.modules));
  }
  if (group.steps.empty()) return text;
  text += group.modules.empty() ? ":" : ";";
  text += group.steps.size() == 1 ? " step " : " steps ";
  text += NumberRanges(group.steps);
  if (group.steps.size() > 1) text += "; first at step " + std::to_string(group.steps.front());
  return text;
}

}  // namespace torchrr::replayer
