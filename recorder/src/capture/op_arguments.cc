#include "capture/op_arguments.h"

#include <utility>

#include "internals/torch_internals.h"

namespace torchrr::recorder {
namespace {

void AddInputTensor(const at::Tensor& t, uint16_t position, uint16_t list_index, OpFrame& frame,
                    IdRegistry& ids, const WrapperInners* inners) {
  if (!t.defined()) return;
  format::TensorUse use;
  use.tensor = ids.RefTensor(t, frame.before, nullptr, nullptr, inners);
  use.position = position;
  use.list_index = list_index;
  auto counter = StrongVersionCounter(*t.unsafeGetTensorImpl());
  use.version_before = ReadVersionCounter(counter.get());
  use.version_after = use.version_before;
  frame.op.inputs.push_back(use);
  frame.input_counters.push_back(std::move(counter));
}

// Adds the tensors `v` holds (a tensor, a tensor list, a list with tensors among its elements);
// false when it holds none.
bool AddInputTensors(const c10::IValue& v, uint16_t position, OpFrame& frame, IdRegistry& ids,
                     const WrapperInners* inners) {
  if (v.isTensor()) {
    AddInputTensor(v.toTensor(), position, format::TensorUse::kNotInList, frame, ids, inners);
    return true;
  }
  if (v.isTensorList()) {
    auto list = v.toTensorList();
    for (size_t j = 0; j < list.size(); ++j) {
      AddInputTensor(list.get(j), position, static_cast<uint16_t>(j), frame, ids, inners);
    }
    return true;
  }
  if (!v.isList()) return false;
  auto list = v.toListRef();
  bool has_tensor = false;
  for (size_t j = 0; j < list.size(); ++j) {
    if (list[j].isTensor()) {
      AddInputTensor(list[j].toTensor(), position, static_cast<uint16_t>(j), frame, ids, inners);
      has_tensor = true;
    }
  }
  return has_tensor;
}

// An int list from the frame's spares (no allocation once the frame has held as many).
void TakeSpareInts(OpFrame& frame, format::Value& value) {
  if (frame.spare_ints.empty()) return;
  value.ints = std::move(frame.spare_ints.back());
  frame.spare_ints.pop_back();
  value.ints.clear();
}

// A non-tensor argument as a Value.
void ToValue(const c10::IValue& v, OpFrame& frame, Interner& interner, format::Value& value) {
  if (v.isNone()) {
    value.kind = format::ValueKind::kNone;
  } else if (v.isBool()) {
    value.kind = format::ValueKind::kBool;
    value.i = v.toBool();
  } else if (v.isInt()) {
    value.kind = format::ValueKind::kInt;
    value.i = v.toInt();
  } else if (v.isDouble()) {
    value.kind = format::ValueKind::kDouble;
    value.d = v.toDouble();
  } else if (v.isComplexDouble()) {
    value.kind = format::ValueKind::kComplex;
    auto c = v.toComplexDouble();
    value.d = c.real();
    value.d_imag = c.imag();
  } else if (v.isString()) {
    value.kind = format::ValueKind::kString;
    value.s = interner.String(v.toStringRef(), frame.before);
  } else if (v.isIntList()) {
    value.kind = format::ValueKind::kIntList;
    const auto ints = v.toIntList();  // A reference to the list, not a copy of it.
    TakeSpareInts(frame, value);
    value.ints.reserve(ints.size());
    for (size_t j = 0; j < ints.size(); ++j) value.ints.push_back(ints.get(j));
  } else if (v.isDoubleList()) {
    value.kind = format::ValueKind::kDoubleList;
    auto doubles = v.toDoubleVector();
    value.doubles.assign(doubles.begin(), doubles.end());
  } else if (v.isBoolList()) {
    value.kind = format::ValueKind::kBoolList;
    TakeSpareInts(frame, value);
    for (bool b : v.toBoolList()) value.ints.push_back(b);
  } else if (v.isDevice()) {
    value.kind = format::ValueKind::kDevice;
    auto device = v.toDevice();
    value.i = static_cast<int64_t>(device.type()) * 256 + (device.has_index() ? device.index() : 255);
  } else {
    value.kind = format::ValueKind::kOther;
    value.s = interner.String(v.tagKind(), frame.before);
  }
}

}  // namespace

c10::ArrayRef<const c10::IValue> InputsOf(const at::RecordFunction& fn) {
  try {
    return fn.inputs();
  } catch (const c10::Error&) {
    return {};
  }
}

void RecordInputs(c10::ArrayRef<const c10::IValue> inputs, OpFrame& frame, IdRegistry& ids,
                  Interner& interner, const WrapperInners* inners) {
  format::OpRecord& op = frame.op;
  // One allocation each for the common case (no tensor lists).
  size_t n_tensors = 0;
  for (const c10::IValue& v : inputs) n_tensors += v.isTensor() ? 1 : 0;
  op.inputs.reserve(n_tensors);
  frame.input_counters.reserve(n_tensors);
  op.values.reserve(inputs.size() - n_tensors);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto position = static_cast<uint16_t>(i);
    if (AddInputTensors(inputs[i], position, frame, ids, inners)) continue;
    format::Value value;
    value.position = position;
    ToValue(inputs[i], frame, interner, value);
    op.values.push_back(std::move(value));
  }
}

void CollectOutputs(const std::vector<c10::IValue>& outputs, std::vector<OpOutput>& collected) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const c10::IValue& v = outputs[i];
    if (v.isTensor()) {
      if (!v.toTensor().defined()) continue;
      collected.push_back(
          {c10::MaybeOwned<at::Tensor>::borrowed(v.toTensor()), static_cast<uint16_t>(i)});
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) {
        at::Tensor t = list.get(j);
        if (!t.defined()) continue;
        collected.push_back({c10::MaybeOwned<at::Tensor>::owned(std::move(t)),
                             static_cast<uint16_t>(i), static_cast<uint16_t>(j)});
      }
    }
  }
}

void RecordOutputs(std::vector<OpOutput>& outputs, OpFrame& frame, IdRegistry& ids,
                   EncodedRecords& out, const WrapperInners* inners) {
  format::OpRecord& op = frame.op;
  op.outputs.reserve(outputs.size());
  for (OpOutput& output : outputs) {
    const at::Tensor& t = *output.tensor;
    format::TensorUse use;
    use.tensor = ids.RefTensor(t, out, &output.storage, &output.version_counter, inners);
    use.position = output.position;
    use.list_index = output.list_index;
    use.version_after = ReadVersionCounter(VersionCounterOf(*t.unsafeGetTensorImpl()));
    use.version_before = use.version_after;
    for (const auto& in : op.inputs) {  // An in-place op returns its input.
      if (in.tensor == use.tensor) use.version_before = in.version_before;
    }
    op.outputs.push_back(use);
  }
}

}  // namespace torchrr::recorder
