#include "torchrr/replayer/trace_tables.h"

#include "torchrr/replayer/printable.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

namespace torchrr::replayer {

void TraceTables::See(const format::Record& record) {
  if (const auto* s = std::get_if<format::StringDef>(&record)) {
    strings_[s->id] = Shortened(s->text);
  } else if (const auto* f = std::get_if<format::FrameDef>(&record)) {
    frames_[f->id] = *f;
  } else if (const auto* stack = std::get_if<format::StackDef>(&record)) {
    stacks_[stack->id] = stack->frames;
  } else if (const auto* t = std::get_if<format::TensorInfo>(&record)) {
    tensors_[t->tensor] = *t;
  }
}

const std::string& TraceTables::String(format::InternId id) const {
  static const std::string kNone;
  auto it = strings_.find(id);
  return id == 0 || it == strings_.end() ? kNone : it->second;
}

std::string TraceTables::OpName(const format::OpRecord& op) const {
  std::string name = String(op.name);
  if (name.empty()) name = "op #" + std::to_string(op.op);
  const std::string& overload = String(op.overload);
  return overload.empty() ? name : name + "." + overload;
}

std::optional<replayer::UserFrame> TraceTables::UserFrameOf(format::InternId stack) const {
  auto it = stacks_.find(stack);
  if (stack == 0 || it == stacks_.end()) return std::nullopt;
  for (format::InternId id : it->second) {
    auto frame = frames_.find(id);
    if (frame == frames_.end() || frame->second.framework) continue;
    const std::string& file = String(frame->second.file);
    const std::string& function = String(frame->second.function);
    if (!file.empty() || !function.empty()) {
      return replayer::UserFrame{file, frame->second.line, function};
    }
  }
  return std::nullopt;
}

std::string TraceTables::Location(format::InternId stack) const {
  std::optional<replayer::UserFrame> frame = UserFrameOf(stack);
  if (!frame) return "";
  return fmt::format("{}:{} in {}", frame->file, frame->line, frame->function);
}

const format::TensorInfo* TraceTables::Tensor(format::ObjectId id) const {
  auto it = tensors_.find(id);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::string TraceTables::TensorText(format::ObjectId id) const {
  const format::TensorInfo* info = Tensor(id);
  if (info == nullptr) return "tensor #" + std::to_string(id);
  return fmt::format("{}[{}]", replayer::DTypeName(info->dtype), fmt::join(info->shape, ", "));
}

std::string TraceTables::ValueText(const format::Value& v) const {
  using format::ValueKind;
  switch (v.kind) {
    case ValueKind::kNone: return "None";
    case ValueKind::kBool: return v.i != 0 ? "True" : "False";
    case ValueKind::kInt:
    case ValueKind::kLayout:
    case ValueKind::kMemoryFormat: return std::to_string(v.i);
    case ValueKind::kDouble: return fmt::format("{}", v.d);
    case ValueKind::kComplex: return fmt::format("({}{:+}j)", v.d, v.d_imag);
    case ValueKind::kString: return String(v.s);
    case ValueKind::kIntList: return fmt::format("[{}]", fmt::join(v.ints, ", "));
    case ValueKind::kBoolList: {
      std::vector<const char*> bools;
      for (int64_t b : v.ints) bools.push_back(b != 0 ? "True" : "False");
      return fmt::format("[{}]", fmt::join(bools, ", "));
    }
    case ValueKind::kDoubleList: return fmt::format("[{}]", fmt::join(v.doubles, ", "));
    case ValueKind::kDType: return replayer::DTypeName(static_cast<format::DType>(v.i));
    case ValueKind::kDevice: {
      // type * 256 + index (records.h); the recorder writes index 255 for a device without one.
      int64_t index = v.i % 256;
      return replayer::DeviceName(format::Device{static_cast<int8_t>(v.i / 256),
                                                 static_cast<int8_t>(index == 255 ? -1 : index)});
    }
    case ValueKind::kOther: return "<" + String(v.s) + ">";
  }
  return "?";
}

}  // namespace torchrr::replayer
