#include "repro/python_call.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string_view>

#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer::repro {
namespace {

using format::OpRecord;
using format::TensorUse;
using format::Value;
using format::ValueKind;

std::string Double(double d) {
  if (std::isnan(d)) return "float('nan')";
  if (std::isinf(d)) return d > 0 ? "float('inf')" : "float('-inf')";
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.17g", d);
  std::string text = buffer;
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
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


bool Floating(format::DType dtype) { return dtype == 5 || dtype == 6 || dtype == 7 || dtype == 15; }
bool Reduced(format::DType dtype) { return dtype == 5 || dtype == 15; }  // float16, bfloat16.

}  // namespace

std::string Ints(const std::vector<int64_t>& values, bool as_bools) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i != 0) text += ", ";
    text += as_bools ? (values[i] != 0 ? "True" : "False") : std::to_string(values[i]);
  }
  return text + "]";
}

bool Identifier(std::string_view text) {
  if (text.empty() || std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  for (char c : text) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

std::string TorchDType(format::DType dtype) { return std::string("torch.") + DTypeName(dtype); }

std::string AtenOverload(const OpRecord& op, const TraceIndex& index) {
  const std::string& name = index.Str(op.name);
  if (!name.starts_with("aten::")) return "";
  const std::string& overload = index.Str(op.overload);
  const std::string method = name.substr(6);
  if (!Identifier(method) || (!overload.empty() && !Identifier(overload))) return "";
  return "aten." + method + "." + (overload.empty() ? "default" : overload);
}

std::string DeviceExpr(const format::Device& device) {
  return device.type == 0 ? "'cpu'" : "DEVICE";
}

std::string Var(ObjectId tensor) { return "t" + std::to_string(tensor); }

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

std::string OpCall(const OpRecord& op, const TraceIndex& index, std::string* why) {
  const std::string overload = AtenOverload(op, index);
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

}  // namespace torchrr::replayer::repro
