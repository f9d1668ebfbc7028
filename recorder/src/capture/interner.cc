#include "capture/interner.h"

#include <algorithm>

#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include "capture/saved_variables.h"

namespace torchrr::recorder {

format::InternId Interner::String(std::string_view text, EncodedRecords& out) {
  if (text.empty()) return 0;
  auto it = strings_.find(text);
  if (it != strings_.end()) return it->second;
  format::InternId id = sink_.NextStringId();
  strings_.emplace(text, id);
  out.Add(format::StringDef{id, std::string(text)});
  return id;
}

format::InternId Interner::OpName(const char* name, EncodedRecords& out) {
  if (name == nullptr || *name == '\0') return 0;
  // The pointer is a shortcut, checked against the text: an ATen op's name points into its
  // registered schema, but a RecordFunction named by a string (C++'s RECORD_FUNCTION, autograd's
  // "autograd::engine::evaluate_function: MulBackward0") hands out its own copy, whose memory the
  // next one reuses for another name.
  auto it = op_names_.find(name);
  if (it != op_names_.end() && it->second.text == name) return it->second.id;
  format::InternId id = String(name, out);
  OpNameEntry& entry = op_names_[name];
  entry.id = id;
  entry.text = name;
  return id;
}

format::InternId Interner::NodeName(const torch::autograd::Node& node, EncodedRecords& out,
                                    const std::string** text, bool* accumulate_grad) {
  const std::type_info* type = &typeid(node);
  auto it = node_type_names_.find(type);
  if (it != node_type_names_.end() && !it->second.per_instance) {
    if (text != nullptr) *text = &it->second.text;
    if (accumulate_grad != nullptr) *accumulate_grad = it->second.accumulate_grad;
    return it->second.id;
  }
  node_name_ = node.name();
  const format::InternId id = String(node_name_, out);
  if (text != nullptr) *text = &node_name_;
  const bool is_accumulate_grad =
      dynamic_cast<const torch::autograd::AccumulateGrad*>(&node) != nullptr;
  if (accumulate_grad != nullptr) *accumulate_grad = is_accumulate_grad;
  if (it == node_type_names_.end()) {
    NodeTypeName& entry = node_type_names_[type];
    entry.id = id;
    entry.text = node_name_;
    entry.per_instance = IsPythonNode(*type);
    entry.accumulate_grad = is_accumulate_grad;
  }
  return id;
}

format::InternId Interner::Stack(const uintptr_t* pcs, size_t n_pcs, const PythonFrame* py,
                                 size_t n_py, EncodedRecords& out) {
  if (n_pcs == 0 && n_py == 0) return 0;
  std::string& key = stack_key_;
  key.assign(reinterpret_cast<const char*>(pcs), n_pcs * sizeof(uintptr_t));
  key.append(reinterpret_cast<const char*>(py), n_py * sizeof(PythonFrame));
  auto it = stacks_.find(key);
  if (it != stacks_.end()) return it->second;
  format::StackDef stack;
  stack.id = ++next_stack_id_;
  stack.frames.reserve(n_pcs + n_py);
  // Native frames first (innermost first: the dispatcher, the binding, the interpreter), then the
  // Python frames that called into them, innermost first.
  for (size_t i = 0; i < n_pcs; ++i) {
    auto [frame, created] = frames_.emplace(pcs[i], 0);
    if (created) {
      frame->second = sink_.NextFrameId();
      format::FrameDef def;  // Symbolized by the writer thread before it is written.
      def.id = frame->second;
      def.kind = format::FrameKind::kNative;
      def.pc = pcs[i];
      out.Add(def);
    }
    stack.frames.push_back(frame->second);
  }
  for (size_t i = 0; i < n_py; ++i) {
    PythonFrameKey py_key{CodeLineKey(py[i].code, py[i].line),
                          CodeLineKey(py[i].origin_code, py[i].origin_line)};
    auto [frame, created] = python_frames_.emplace(py_key, 0);
    if (created) {
      // The origin first: a definition precedes what names it.
      const format::InternId origin =
          py[i].origin_code != 0 ? OriginFrame(py[i].origin_code, py[i].origin_line, out) : 0;
      frame->second = sink_.NextFrameId();
      format::FrameDef def = PythonFrameDef(frame->second, py[i].code, py[i].line, out);
      def.origin = origin;
      out.Add(def);
    }
    stack.frames.push_back(frame->second);
  }
  stacks_.emplace(key, stack.id);
  out.Add(stack);
  return stack.id;
}

format::FrameDef Interner::PythonFrameDef(format::InternId id, uint32_t code, int32_t line,
                                          EncodedRecords& out) {
  format::FrameDef def;
  def.id = id;
  def.kind = format::FrameKind::kPython;
  def.line = static_cast<uint32_t>(std::max(line, 0));
  auto described = python_codes_.find(code);
  if (described != python_codes_.end()) {
    def.file = String(described->second.file, out);
    def.function = String(described->second.function, out);
    def.framework = described->second.framework;
  }
  return def;
}

format::InternId Interner::OriginFrame(uint32_t code, int32_t line, EncodedRecords& out) {
  auto [frame, created] = origin_frames_.emplace(CodeLineKey(code, line), 0);
  if (created) {
    frame->second = sink_.NextFrameId();
    out.Add(PythonFrameDef(frame->second, code, line, out));
  }
  return frame->second;
}

void Interner::AddPythonCodes(std::vector<PythonCode>& codes) {
  for (auto& code : codes) python_codes_[code.code] = std::move(code);
}

void Interner::Forget() {
  strings_.clear();
  op_names_.clear();
  node_type_names_.clear();
  frames_.clear();
  python_frames_.clear();
  origin_frames_.clear();
  stacks_.clear();
}

}  // namespace torchrr::recorder
