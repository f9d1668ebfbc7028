// The human report: one diagnostic per violation, laid out like a compiler's (culprit first, then
// the victim, then the facts, then a fix).
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {
namespace {

class Painter {
 public:
  explicit Painter(bool color) : color_(color) {}
  std::string Paint(const char* code, const std::string& text) const {
    return color_ ? std::string("\x1b[") + code + "m" + text + "\x1b[0m" : text;
  }
  std::string Error(const std::string& t) const { return Paint("1;31", t); }
  std::string Warning(const std::string& t) const { return Paint("1;33", t); }
  std::string Note(const std::string& t) const { return Paint("1;36", t); }
  std::string Help(const std::string& t) const { return Paint("1;32", t); }
  std::string Bold(const std::string& t) const { return Paint("1", t); }
  std::string Gutter(const std::string& t) const { return Paint("1;34", t); }

 private:
  bool color_;
};

// Source lines of the recorded files that exist on this machine; read once each.
class SourceCache {
 public:
  // The line (1-based) without its indentation, or "" when the file or line is not there.
  const std::string* Line(const std::string& path, uint32_t line) {
    if (path.empty() || line == 0) return nullptr;
    auto [it, inserted] = files_.try_emplace(path);
    if (inserted) {
      std::ifstream in(path);
      std::string text;
      while (in && std::getline(in, text)) it->second.push_back(text);
    }
    if (line > it->second.size()) return nullptr;
    return &it->second[line - 1];
  }

 private:
  std::map<std::string, std::vector<std::string>> files_;
};

std::string OpName(const OpRef& op) {
  std::string name = op.name.empty() ? "an unrecorded op" : op.name;
  if (!op.overload.empty()) name += "." + op.overload;
  return name;
}

std::string Location(const OpRef& op) {
  if (!op.user_frame) return "<no user frame recorded>";
  const UserFrame& f = *op.user_frame;
  std::string s = f.file.empty() ? "<unknown file>" : f.file;
  if (f.line != 0) s += ":" + std::to_string(f.line);
  if (!f.function.empty()) s += " in " + f.function;
  return s;
}

std::string Shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Quotes the op's user line with `label` under it; false when the file is not readable here.
bool QuoteSource(std::ostringstream& out, const Painter& p, SourceCache& sources,
                 const OpRef& op, const std::string& label) {
  if (!op.user_frame) return false;
  const std::string* line = sources.Line(op.user_frame->file, op.user_frame->line);
  if (line == nullptr) return false;
  std::string number = std::to_string(op.user_frame->line);
  std::string pad(number.size(), ' ');
  size_t indent = line->find_first_not_of(" \t");
  std::string code = indent == std::string::npos ? "" : line->substr(indent);
  out << pad << " " << p.Gutter("|") << "\n";
  out << p.Gutter(number + " |") << "     " << code << "\n";
  out << pad << " " << p.Gutter("|") << "     " << p.Bold(std::string(code.empty() ? 1 : code.size(), '^'))
      << " " << label << "\n";
  return true;
}

// For a silent write found by fingerprint: the ops that wrote into or made a tensor over the saved
// bytes (but the culprit, already shown), grouped by call site with one quote each, and the CUDA
// work launched outside any op in between.
void WriteCandidates(std::ostringstream& out, const Painter& p, SourceCache& sources,
                     const Violation& v) {
  std::vector<const SilentCandidate*> shown;
  for (const SilentCandidate& c : v.candidates) {
    if (!(v.culprit && c.op.id == v.culprit->id)) shown.push_back(&c);
  }
  for (size_t i = 0; i < shown.size();) {
    size_t j = i + 1;
    while (j < shown.size() && Location(shown[j]->op) == Location(shown[i]->op)) ++j;
    std::string names;
    bool wrote = false;
    for (size_t k = i; k < j; ++k) {
      names += (k > i ? ", " : "") + OpName(shown[k]->op);
      wrote |= shown[k]->wrote;
    }
    std::string label = names + (wrote ? " wrote into them" : " made a tensor over them");
    out << p.Note("note") << ": candidate: " << label << " at " << Location(shown[i]->op) << "\n";
    QuoteSource(out, p, sources, shown[i]->op, label);
    i = j;
  }
  for (const KernelRef& k : v.kernels) {
    out << p.Note("note") << ": candidate: " << k.name << " on cuda:" << k.device
        << ", launched outside any op\n";
  }
}

void WriteViolation(std::ostringstream& out, const Painter& p, SourceCache& sources,
                    const Violation& v) {
  bool silent = v.kind == ViolationKind::kSilent;
  out << p.Error("error") << p.Bold(silent ? ": saved tensor's memory overwritten without a version "
                                             "bump (PyTorch cannot detect this)"
                                           : ": saved tensor modified in place")
      << "\n";
  std::string culprit_name;
  if (v.culprit) {
    culprit_name = OpName(*v.culprit);
    out << "  " << p.Gutter("-->") << " " << Location(*v.culprit) << "\n";
    std::string label = culprit_name;
    if (!v.culprit->detail.empty()) label += " (wrote through " + v.culprit->detail + ")";
    if (!silent) {
      label += " changed the version " + std::to_string(v.saved_version) + " -> " +
               std::to_string(v.current_version);
    } else if (v.evidence == SilentEvidence::kFingerprint) {
      label += " wrote into its memory through another tensor over it";
    } else {
      label += " wrote into its storage";
    }
    if (!QuoteSource(out, p, sources, *v.culprit, label)) {
      out << "   " << p.Gutter("=") << " culprit: " << label << "\n";
    }
    if (v.evidence == SilentEvidence::kFingerprint) WriteCandidates(out, p, sources, v);
  } else if (v.evidence == SilentEvidence::kFingerprint) {
    out << "  " << p.Gutter("-->") << " <no version counter saw the write: the saved bytes "
        << "changed between the save and the use (fingerprints)>\n";
    if (v.candidates.empty() && v.kernels.empty()) {
      out << "   " << p.Gutter("=") << " no recorded op or kernel touched those bytes in between: "
          << "the write came from outside PyTorch's ops (numpy, a raw pointer, a C extension)\n";
    }
    WriteCandidates(out, p, sources, v);
  } else {
    out << "  " << p.Gutter("-->") << " <the write was not recorded: the version counter moved "
        << "between two recorded uses>\n";
  }
  if (v.victim) {
    out << p.Note("note") << ": saved here by " << OpName(*v.victim) << " at "
        << Location(*v.victim) << "\n";
    QuoteSource(out, p, sources, *v.victim, "saved by " + OpName(*v.victim));
  } else {
    out << p.Note("note") << ": the op that saved it was not recorded\n";
  }
  std::string member = v.tensor.saved_name.empty() ? "?" : v.tensor.saved_name;
  if (v.tensor.list_index != format::TensorUse::kNotInList) {
    member += "[" + std::to_string(v.tensor.list_index) + "]";
  }
  out << "   " << p.Gutter("=") << " needed by " << p.Bold(v.backward_node.name) << " (saved `"
      << member << "`, " << (v.tensor.is_output ? "an output" : "an input") << " of its op)"
      << (v.simulated ? ", in the part of the backward pass that did not run" : "") << "\n";
  out << "   " << p.Gutter("=") << " saved at version " << v.saved_version << ", "
      << (v.simulated ? "would be used" : "used") << " at version " << v.current_version << "\n";
  out << "   " << p.Gutter("=") << " tensor: ";
  if (!v.tensor.dtype.empty()) {
    out << v.tensor.dtype << Shape(v.tensor.shape) << " on " << v.tensor.device;
  } else {
    out << "metadata not recorded";
  }
  if (v.tensor.id != 0) out << " (tensor #" << v.tensor.id << ")";
  if (v.pytorch_names) out << ", which PyTorch calls \"" << *v.pytorch_names << "\"";
  out << "\n";
  if (v.fingerprint) {
    char hashes[80];
    std::snprintf(hashes, sizeof(hashes), "%016llx at save, %016llx at use",
                  static_cast<unsigned long long>(v.fingerprint->at_save),
                  static_cast<unsigned long long>(v.fingerprint->at_use));
    out << "   " << p.Gutter("=") << " fingerprint of its bytes: " << hashes << "\n";
  }
  out << "   " << p.Gutter("=") << " pytorch: ";
  if (v.pytorch_raised) {
    out << "raised";
    if (v.pytorch_message) {
      std::string message = *v.pytorch_message;
      if (size_t cut = message.find(" Hint:"); cut != std::string::npos) message.resize(cut);
      out << ": " << message;
    }
  } else if (silent) {
    out << "no error: the write bypassed the version counter, so gradients are silently wrong";
  } else if (v.simulated) {
    out << "did not get here (an earlier node threw); it raises once that one is fixed";
  } else {
    out << "did not raise here";
  }
  out << "\n";
  for (const OpRef& later : v.later_culprits) {
    out << p.Note("note") << ": modified again later by " << OpName(later) << " at "
        << Location(later) << "\n";
  }
  out << p.Help("help") << ": ";
  if (silent && v.evidence == SilentEvidence::kFingerprint) {
    out << "find what writes into this memory between the two points (a raw kernel, numpy, an "
           "extension on data_ptr); write into a .clone() instead\n";
  } else if (silent) {
    out << "write through the tensor itself rather than .data (so autograd sees it), or "
           ".clone() the tensor before writing into it\n";
  } else {
    std::string name = culprit_name.empty() ? "the in-place op" : culprit_name;
    std::string out_of_place = name;
    if (size_t dot = out_of_place.find('.'); dot != std::string::npos) out_of_place.resize(dot);
    if (out_of_place.ends_with('_')) out_of_place.pop_back();
    out << "make " << name << " out of place";
    if (out_of_place != name) out << " (" << out_of_place << ")";
    out << ", or .clone() the tensor before modifying it\n";
  }
  out << "\n";
}

}  // namespace

std::string FormatText(const Report& report, bool color) {
  Painter p(color);
  SourceCache sources;
  std::ostringstream out;
  for (const std::string& warning : report.warnings) {
    out << p.Warning("warning") << ": " << warning << "\n";
  }
  for (const Violation& v : report.violations) WriteViolation(out, p, sources, v);
  std::string counts = std::to_string(report.ops) + " ops, " +
                       std::to_string(report.node_executions) + " node executions in " +
                       std::to_string(report.backward_passes) + " backward pass" +
                       (report.backward_passes == 1 ? "" : "es");
  if (report.violations.empty()) {
    out << "no saved tensor was modified (" << counts << ")\n";
  } else {
    size_t n = report.violations.size();
    out << p.Bold(std::to_string(n) + " violation" + (n == 1 ? "" : "s")) << " (" << counts
        << ")\n";
  }
  return out.str();
}

}  // namespace torchrr::replayer
